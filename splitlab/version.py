"""The version splitlab writes into what it saves (config.json, checkpoints): one home."""

__version__ = "0.1.0"

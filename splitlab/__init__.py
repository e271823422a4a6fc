"""splitlab: SPLIT (Split Policy Learned Image Tokenization) for timm vision transformers on Lightning."""

__version__ = "0.1.0"

"""CI regression: on generated data the learned policy beats random and entropy layouts at the same
fraction with the same frozen backbone, and lands on its target fraction.

The whole pipeline runs as a user would run it (`splitlab demo`'s steps through the LightningCLI):
generated shapes -> dense tiny backbone -> warm start -> PPO -> evaluation in threshold mode.
"""

from __future__ import annotations

import pytest

from splitlab.commands.demo import run_pipeline


def check(record: dict, seed: int, capsys: pytest.CaptureFixture) -> None:
    p = record["policies"]
    target = record["target_fraction"]
    learned, random, entropy, uniform = (p[k]["metric"] for k in ("learned", "random", "entropy", "uniform"))
    fraction = p["learned"]["token_fraction_mean"]
    with capsys.disabled():  # the four numbers belong in the CI log
        print(
            f"\nseed {seed}: learned top-1 {learned:.3f} at fraction {fraction:.3f} (target {target}), "
            f"random {random:.3f} @ {p['random']['token_fraction_mean']:.3f}, "
            f"entropy {entropy:.3f} @ {p['entropy']['token_fraction_mean']:.3f}, uniform {uniform:.3f}, "
            f"lambda {record['lambda']:.3f}"
        )
    assert abs(fraction - target) <= 0.05, f"realised fraction {fraction:.3f} is off the target {target}"
    assert learned >= random + 0.10, f"learned {learned:.3f} is not 10 points above random {random:.3f}"
    assert learned >= entropy, f"learned {learned:.3f} is below entropy {entropy:.3f}"
    assert learned >= uniform - 0.05, (
        f"learned {learned:.3f} is more than 5 points below uniform {uniform:.3f}"
    )


def test_learned_policy_beats_random_and_entropy(tmp_path, capsys) -> None:
    check(run_pipeline(tmp_path / "run", seed=0, quiet=True), 0, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_regression_across_seeds(tmp_path, seed, capsys) -> None:
    check(run_pipeline(tmp_path / f"seed{seed}", seed=seed, quiet=True), seed, capsys)

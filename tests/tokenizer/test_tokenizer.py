"""The SPLIT tokenizer's modes, embeddings and decision module."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

from splitlab.tokenizer import SplitTokenizer, policy


def images(n: int = 3, size: int = 64) -> torch.Tensor:
    return torch.randn(n, 3, size, size)


def test_threshold_mode_is_deterministic_and_thresholds_p(tiny_vit, tiny_tokenizer) -> None:
    x = images(4)
    with torch.no_grad():
        a, b = tiny_tokenizer(x, tiny_vit), tiny_tokenizer(x, tiny_vit)
    assert a.seqlens == b.seqlens and torch.equal(a.tokens, b.tokens)
    for taken, cand, logit in zip(a.decisions, a.candidates, a.logits, strict=True):
        assert torch.equal(taken, (torch.sigmoid(logit) > 0.5) & cand)
    assert 0 < sum(int(d.sum()) for d in a.decisions) < sum(int(c.sum()) for c in a.candidates)


def test_labels_mode_reproduces_the_given_decisions(tiny_vit, tiny_tokenizer) -> None:
    x = images(3)
    gen = torch.Generator().manual_seed(1)
    labels = [torch.rand(3, 1, 1, generator=gen) < 2, torch.rand(3, 2, 2, generator=gen) < 0.5]
    with torch.no_grad():
        layout = tiny_tokenizer(x, tiny_vit, mode="labels", labels=labels)
    assert torch.equal(layout.decisions[0], labels[0])
    assert torch.equal(layout.decisions[1], labels[1])  # every level-1 patch is a candidate here
    assert layout.seqlens == [4 + 3 * int(v) for v in labels[1].flatten(1).sum(1)]


def test_sample_log_prob_is_the_bernoulli_likelihood(tiny_vit, tiny_tokenizer) -> None:
    """`policy.log_prob` and `policy.entropy` on a sampled layout's logits and decisions, summed over
    its candidates, are each image's Bernoulli log-likelihood and entropy."""
    x = images(5)
    with torch.no_grad():
        layout = tiny_tokenizer(x, tiny_vit, mode="sample", generator=torch.Generator().manual_seed(3))
    expected_lp = torch.zeros(5, dtype=torch.float64)
    expected_ent = torch.zeros(5, dtype=torch.float64)
    got_lp = torch.zeros(5, dtype=torch.float64)
    got_ent = torch.zeros(5, dtype=torch.float64)
    for taken, cand, logit in zip(layout.decisions, layout.candidates, layout.logits, strict=True):
        p = torch.sigmoid(logit.double())
        for img in range(5):
            for y, xx in cand[img].nonzero().tolist():
                pi = p[img, y, xx]
                expected_lp[img] += torch.log(pi if taken[img, y, xx] else 1 - pi)
                expected_ent[img] -= pi * torch.log(pi) + (1 - pi) * torch.log(1 - pi)
        got_lp += (policy.log_prob(logit, taken) * cand).flatten(1).sum(1).double()
        got_ent += (policy.entropy(logit) * cand).flatten(1).sum(1).double()
    assert torch.allclose(got_lp, expected_lp, atol=1e-5)
    assert torch.allclose(got_ent, expected_ent, atol=1e-5)


def test_sampling_follows_p_split(tiny_vit) -> None:
    tok = SplitTokenizer(tiny_vit.embed_dim, (32, 16), decision_dim=32, decision_heads=2)
    torch.nn.init.zeros_(tok.decision.mlp.fc2.weight)
    torch.nn.init.constant_(tok.decision.mlp.fc2.bias, 1.0)  # p = sigmoid(1) = 0.731 everywhere
    with torch.no_grad():
        layout = tok(images(64), tiny_vit, mode="sample", generator=torch.Generator().manual_seed(0))
    rate = layout.decisions[0].float().mean().item()
    assert abs(rate - torch.sigmoid(torch.tensor(1.0)).item()) < 0.04  # 1024 draws: 4 sigma ~ 0.055


def test_scores_mode_skips_the_policy(tiny_vit, tiny_tokenizer) -> None:
    scores = [torch.full((2, 1, 1), 5.0), torch.tensor([[[1.0, 9.0], [9.0, 1.0]]] * 2)]
    with torch.no_grad():
        layout = tiny_tokenizer(images(2), tiny_vit, mode="scores", scores=scores, threshold=4.0)
    assert layout.logits is None
    assert layout.seqlens == [2 + 2 * 4] * 2


def test_coarse_tokens_start_as_downsampled_patch_embeddings(tiny_vit, tiny_tokenizer) -> None:
    x = images(2)
    with torch.no_grad():
        tokens, _ = tiny_tokenizer.embed(x, tiny_vit)
        small = F.interpolate(x, size=(16, 16), mode="bilinear", antialias=True, align_corners=False)
        expected = tiny_vit.model.patch_embed.proj(small).permute(0, 2, 3, 1)
        pos = tiny_vit.model.pos_embed[:, 1:]
        expected = expected + resample_abs_pos_embed(pos, [1, 1], old_size=[4, 4], num_prefix_tokens=0).view(
            1, 1, 1, -1
        )
    assert torch.allclose(
        tokens[0], expected, atol=1e-5
    )  # zero-initialised child projection and level embedding
    fine = tiny_vit.model.patch_embed.proj(x).flatten(2).transpose(1, 2) + tiny_vit.model.pos_embed[:, 1:]
    assert torch.allclose(tokens[-1].flatten(1, 2), fine, atol=1e-6)


def test_bad_inputs_name_the_setting(tiny_vit, tiny_tokenizer) -> None:
    with pytest.raises(ValueError, match="image size 8x8 is smaller than one patch of the finest level"):
        tiny_tokenizer(torch.randn(1, 3, 8, 8), tiny_vit)
    with pytest.raises(ValueError, match="finest level must equal the backbone's patch size"):
        SplitTokenizer(64, (28, 14))(images(1), tiny_vit)
    with pytest.raises(ValueError, match="mode='labels' needs labels"):
        tiny_tokenizer(images(1), tiny_vit, mode="labels")
    with pytest.raises(ValueError, match=r"mode='greedy': expected one of"):
        tiny_tokenizer(images(1), tiny_vit, mode="greedy")
    with pytest.raises(ValueError, match="decision_dim=30 must be divisible"):
        SplitTokenizer(64, (32, 16), decision_dim=30, decision_heads=4)


def test_decision_module_is_a_small_fraction_of_a_block() -> None:
    from timm.models.vision_transformer import Block
    from torch.utils.flop_counter import FlopCounterMode

    dim, levels = 768, (64, 32, 16)
    tok = SplitTokenizer(dim, levels)
    tokens = [torch.randn(1, 256 // s, 256 // s, dim) for s in levels]  # a 256 px image
    with FlopCounterMode(display=False) as decide:
        tok.decision_logits(tokens)
    with FlopCounterMode(display=False) as block:
        Block(dim, num_heads=12)(torch.randn(1, 256, dim))  # one block on the finest grid
    assert decide.get_total_flops() < 0.05 * block.get_total_flops()
    with FlopCounterMode(display=False) as decide_mlp:  # a residual MLP per patch first: under 0.15
        SplitTokenizer(dim, levels, token_mlp=True).decision_logits(tokens)
    assert decide_mlp.get_total_flops() < 0.15 * block.get_total_flops()


def test_the_token_mlp_starts_as_the_linear_module_and_trains() -> None:
    """``token_mlp`` (``decision_features: mlp``) adds a residual MLP per patch whose last layer starts
    at zero: the module's logits are the linear module's until it trains, and it does train."""
    torch.manual_seed(0)
    levels = (64, 32, 16)
    linear = SplitTokenizer(48, levels, decision_dim=32, decision_heads=2, see_descendants=True)
    mlp = SplitTokenizer(48, levels, decision_dim=32, decision_heads=2, see_descendants=True, token_mlp=True)
    missing, unexpected = mlp.load_state_dict(linear.state_dict(), strict=False)
    assert not unexpected and missing and all(".token_mlp." in k for k in missing)
    assert (linear.decision.features, mlp.decision.features) == ("linear", "mlp")
    tokens = [torch.randn(2, 128 // s, 128 // s, 48) for s in levels]
    for got, expected in zip(mlp.decision_logits(tokens), linear.decision_logits(tokens), strict=True):
        torch.testing.assert_close(got, expected)
    sum(lg.square().sum() for lg in mlp.decision_logits(tokens)).backward()
    assert mlp.decision.token_mlp.fc2.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("see_descendants", [False, True])
@pytest.mark.parametrize("budgets", [(), (0.3, 0.7)])
@pytest.mark.parametrize("token_mlp", [False, True])
def test_decision_logits_equal_the_module_on_each_parent_and_its_patches(
    see_descendants, budgets, token_mlp
) -> None:
    """decision_logits projects each level once and groups afterwards (cheaper); the logits must be
    the module's own (`project`, then `decide`) on each parent with its children's (and
    descendants') embeddings."""
    from splitlab.tokenizer.embed import space_to_depth
    from splitlab.tokenizer.tokenizer import finest_under

    torch.manual_seed(0)
    levels = (64, 32, 16)
    tok = SplitTokenizer(
        48,
        levels,
        decision_dim=32,
        decision_heads=2,
        budget_points=budgets,
        see_descendants=see_descendants,
        token_mlp=token_mlp,
    )
    torch.nn.init.normal_(tok.decision.mlp.fc2.weight, std=1.0)
    if token_mlp:  # zero-initialised: made to matter
        torch.nn.init.normal_(tok.decision.token_mlp.fc2.weight, std=0.5)
    if budgets:
        torch.nn.init.normal_(tok.decision.budget_film[-1].weight, std=0.5)
    tokens = [torch.randn(3, 128 // s, 128 // s, 48) for s in levels]
    budget = torch.tensor([0.3, 0.5, 0.7]) if budgets else None
    with torch.no_grad():
        got = tok.decision_logits(tokens, budget)
        for k in range(len(levels) - 1):
            parent = tokens[k].flatten(1, 2)
            children = space_to_depth(tokens[k + 1]).flatten(1, 2)
            under = finest_under(tokens[-1], tok.levels.cells(k)) if see_descendants else None
            below = None if under is None else under[0]
            (query,), (kv,) = tok.decision.project([parent, children])
            extra = None if below is None else tok.decision.project([parent, below])[1][0]
            expected = tok.decision.decide(query, kv, budget, extra).view(tokens[k].shape[:3])
            torch.testing.assert_close(got[k], expected, rtol=1e-5, atol=1e-5)

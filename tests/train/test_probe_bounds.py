"""The oracle-agreement probe's bound on its size (agentjax/train/probe.py: bounded_states).

Checked: a probe that fits is untouched; over the bound every state keeps the oracle's reply among at most
``max_candidates`` (in the original order, the oracle's index updated), states are thinned evenly until the rows fit,
and the sample is the same on every call (fixed seed).
"""

import pytest

from agentjax.train.probe import bounded_states


def _states(n: int, candidates: int) -> list:
    return [([s], [f"r{s}.{i}" for i in range(candidates)], (3 * s) % candidates) for s in range(n)]


def test_a_probe_that_fits_is_unchanged():
    states = _states(10, 4)
    assert bounded_states(states, max_rows=40) is states


def test_a_large_probe_keeps_the_oracle_and_fits_the_bound():
    states = _states(100, 50)
    out = bounded_states(states, max_rows=320, max_candidates=8)
    assert sum(len(r) for _, r, _ in out) <= 320 and len(out) == 40
    assert [p[0] for p, _, _ in out] == sorted({p[0] for p, _, _ in out})  # evenly spaced, in order, distinct
    assert out[0][0] == [0] and out[-1][0] == [99]
    for prompt, replies, oracle in out:
        s = prompt[0]
        assert len(replies) == 8 and replies[oracle] == f"r{s}.{(3 * s) % 50}"
        assert replies == sorted(replies, key=lambda r: int(r.split(".")[1]))  # original order kept
    assert bounded_states(states, max_rows=320, max_candidates=8) == out


def test_replies_longer_or_wider_than_the_collectors_budget_are_scored_whole():
    """A held-out state may list replies longer than the collector's reply budget (TextCraft-Synth's validation
    tasks: 70 tokens against 64) or more next tokens at a position than ``CollectConfig.max_allowed``: the probe
    widens its own rows, so its numbers are those of a config with room for them (Sokoban: ``<action>Right</action>``
    and the stop token against a 3-token budget; 4 moves after ``<action>`` against 2 slots)."""
    import dataclasses

    from flax import nnx

    from agentjax.models import Qwen, load_tokenizer
    from agentjax.train.presets import tiny, tiny_arch
    from agentjax.train.probe import oracle_agreement
    from envs.sokoban.env import SokobanEnv

    config = tiny("grpo").collect
    model = Qwen(tiny_arch(d_model=32, mlp_dim=64, num_layers=1, head_dim=8), rngs=nnx.Rngs(0))
    tasks, tokenizer = SokobanEnv.tasks("valid")[:2], load_tokenizer()
    short = dataclasses.replace(config.sampling, max_new_tokens=3)
    narrow = oracle_agreement(model, tokenizer, SokobanEnv(), tasks, config.replace(max_allowed=2, sampling=short))
    wide = oracle_agreement(model, tokenizer, SokobanEnv(), tasks, config.replace(max_allowed=16))
    assert narrow == pytest.approx(wide, rel=1e-6) and narrow["chance"] == 0.25 and narrow["states"] >= 2

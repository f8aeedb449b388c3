"""SERO's oracle branches packed into the update's rows (agentjax/rollout/oracle.py ``to_oracle_batch``), on the Sokoban
branches of tests/rollout/test_oracle.py: rows branch-major in depth order, ``group`` = branch, ``step`` = depth,
left-padded prompts, response mask = the action's tokens, allowed tokens; padding rows and branches never weighted;
coefficients equal ``g_b · Π_{i<j} c_i / #roots`` computed by hand; capacity overflow drops the last rows."""

from __future__ import annotations

import dataclasses
import types

import jax
import numpy as np
import pytest

from agentjax.rollout.oracle import to_oracle_batch
from agentjax.train.config import SeroConfig
from agentjax.train.sero import sero_credit, step_log_compat
from tests.rollout.test_oracle import CAP, KEY, NB, check_command_mask, sokoban, tokenizer  # noqa: F401 (the fixtures)


def test_oracle_batch_rows_are_branch_major_with_command_masks(sokoban, tokenizer):  # noqa: F811 (the fixtures)
    """The Sokoban branches packed with padding rows and branch slots, field by field against the host records,
    and the row coefficients of random behaviour log-probs against a by-hand product of compatibilities."""
    config, branches = sokoban.config, sokoban.run.branches
    rows = [(b, s) for b, br in enumerate(branches) for s in br.steps]
    n, nb, cap = len(rows), NB, CAP
    pad = nb - len(branches)
    assert pad >= 2 and cap > n
    oracle = to_oracle_batch(branches, config, num_branches=nb, capacity=cap)
    st = types.SimpleNamespace(**{f.name: np.asarray(getattr(oracle.steps, f.name))
                                  for f in dataclasses.fields(oracle.steps)})
    lp, lr = config.max_prompt_tokens, config.max_response_tokens
    assert st.prompt_tokens.shape == (cap, lp) and st.response_tokens.shape == (cap, lr)
    np.testing.assert_array_equal(st.row_mask, np.arange(cap) < n)
    np.testing.assert_array_equal(st.group[:n], [b for b, _ in rows])  # branch-major ...
    np.testing.assert_array_equal(st.step[:n], [s.depth for _, s in rows])  # ... in depth order
    assert (np.diff(st.group[:n]) >= 0).all()
    for r, (b, s) in enumerate(rows):
        k, m = len(s.prompt_ids), len(s.reply_ids)
        np.testing.assert_array_equal(st.prompt_tokens[r, lp - k:], s.prompt_ids)
        np.testing.assert_array_equal(st.prompt_mask[r], np.arange(lp) >= lp - k)
        np.testing.assert_array_equal(st.response_tokens[r, :m], s.reply_ids)
        cmd = st.response_mask[r]
        assert not cmd[m:].any()
        np.testing.assert_array_equal(cmd[:m], s.command_mask)
        check_command_mask(tokenizer, st.response_tokens[r, :m], cmd[:m], s.action, config.constrained_format)
        assert tokenizer.decode(st.response_tokens[r][cmd]) == s.action  # Sokoban: exactly the action's tokens
        assert st.task[r] == branches[b].root.task_index and st.valid[r]
        for j, choices in enumerate(s.allowed_ids):
            assert tuple(a for a in st.allowed_tokens[r, j] if a >= 0) == choices
    assert not st.prompt_mask[n:].any() and not st.response_mask[n:].any()
    np.testing.assert_array_equal(oracle.attempted, np.arange(nb) < len(branches))
    np.testing.assert_array_equal(oracle.valid, [b.valid for b in branches] + [False] * pad)
    np.testing.assert_array_equal(oracle.oracle_return, [b.oracle_return for b in branches] + [0] * pad)
    np.testing.assert_array_equal(oracle.suffix_return, [b.root.suffix_return for b in branches] + [0] * pad)

    # coefficients by hand: c_j = exp(mean command-token logp), w_j = prod_{i<j} c_i, coef = gate * w / #roots
    logp = -jax.random.uniform(jax.random.key(1), st.response_tokens.shape, maxval=2.0)
    log_c, mask = step_log_compat(logp, oracle.steps, nb, config.max_steps)
    credit = sero_credit(SeroConfig(), oracle, log_c, mask, KEY)
    logp = np.asarray(logp)
    expected = np.zeros(cap)
    for b, br in enumerate(branches):
        gate = float(br.valid and br.oracle_return > br.root.suffix_return)
        w = 1.0
        for r in [r for r, (bb, _) in enumerate(rows) if bb == b]:
            expected[r] = gate * w / len(branches)
            w *= np.exp(logp[r][st.response_mask[r]].mean())
    np.testing.assert_allclose(np.asarray(credit["coef_n"]), expected, rtol=1e-5, atol=1e-7)
    assert expected.any() and (np.asarray(credit["coef_n"])[n:] == 0).all()  # padding rows never weighted

    # a smaller capacity keeps the first rows (branch-major) and drops the rest
    small = to_oracle_batch(branches, config, num_branches=nb, capacity=n - 1)
    np.testing.assert_array_equal(np.asarray(small.steps.group), st.group[:n - 1])
    np.testing.assert_array_equal(np.asarray(small.steps.prompt_tokens), st.prompt_tokens[:n - 1])
    with pytest.raises(ValueError, match="branch slots"):
        to_oracle_batch(branches, config, num_branches=len(branches) - 1, capacity=cap)

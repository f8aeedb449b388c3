"""SERO's fixed oracle bank (agentjax/train/sero.py: save_bank, load_bank, draw_from_bank) on hand-made branches.

Checked: save -> load -> draw of every branch gives back the packed rows field by field, the branch arrays and the
stored log-compatibilities, also across two bank files (branch ids offset by the first file's attempted branches;
unattempted slots dropped); a draw of fewer branches keeps exactly the drawn branches' rows under their new ids,
depends on the rng, and pads the missing branch slots as never attempted; replayed with ``match_mass`` every scheme
puts SERO's supervision mass on each branch (weights and row coefficients), which it does not without it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.rollout.batch import StepBatch
from agentjax.rollout.collect import CollectConfig
from agentjax.rollout.oracle import Branch, OracleStep, RootRecord, to_oracle_batch
from agentjax.train.config import SeroConfig
from agentjax.train.sero import draw_from_bank, load_bank, save_bank, sero_credit, step_log_compat
from envs.base import Obs, Task

LP, LR, A, J = 12, 6, 3, 5  # prompt / reply widths, allowed slots, max depth
CONFIG = CollectConfig(max_steps=J, max_prompt_tokens=LP, constrained=True, masked_logp=True, max_allowed=A)
CONFIG = CONFIG.replace(sampling=dataclasses.replace(CONFIG.sampling, max_new_tokens=LR))
FIELDS = ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask", "step", "task", "allowed_tokens")


def _branches(rng: np.random.Generator, depths: list[int], first_task: int) -> list[Branch]:
    """Branches of the given depths with random prompts, replies, command masks and allowed tokens."""
    out = []
    for b, depth in enumerate(depths):
        steps = []
        for j in range(depth):
            k, m = int(rng.integers(3, LP + 1)), int(rng.integers(2, LR + 1))
            mask = np.zeros(m, bool)  # a run of command tokens, the last (stop) token outside it
            start = int(rng.integers(0, m - 1))
            mask[start:start + int(rng.integers(1, m - start))] = True
            allowed = tuple(tuple(int(x) for x in rng.choice(100, int(rng.integers(1, A + 1)), replace=False))
                            for _ in range(m))
            steps.append(OracleStep(depth=j, action=f"a{j}", prompt_ids=rng.integers(1, 1000, k).astype(np.int32),
                                    reply_ids=rng.integers(1, 1000, m).astype(np.int32), command_mask=mask,
                                    allowed_ids=allowed))
        task = Task(env="sokoban", task_id=f"t{b}", split="train")
        root = RootRecord(group=b, rollout=0, step=0, task=task, task_index=first_task + b, actions=(),
                          obs=Obs("o", "o", None, "i"), history=(), prompt_ids=np.zeros(1, np.int32), budget=J,
                          suffix_return=float(b % 2 == 0 and b > 2), snapshot=None)
        won = b % 3 != 1
        out.append(Branch(root=root, valid=b != 2, ended="won" if won else "budget", steps=tuple(steps), won=won,
                          oracle_return=float(won)))
    return out


def _bank_file(tmp_path, name: str, seed: int, depths: list[int], num_branches: int, first_task: int):
    rng = np.random.default_rng(seed)
    branches = _branches(rng, depths, first_task)
    oracle = to_oracle_batch(branches, CONFIG, num_branches=num_branches, capacity=sum(depths) + 3)
    log_c = np.where(np.arange(J) < np.array(depths + [0] * (num_branches - len(depths)))[:, None],
                     -rng.random((num_branches, J)), 0.0).astype(np.float32)
    path = str(tmp_path / f"{name}.npz")
    save_bank(path, oracle, jnp.asarray(log_c))
    return path, oracle, log_c


def _rows(oracle, n: int | None = None) -> dict[str, np.ndarray]:
    mask = np.asarray(oracle.steps.row_mask)
    return {k: np.asarray(getattr(oracle.steps, k))[mask][:n] for k in FIELDS + ("group",)}


TEMPLATE = StepBatch.empty(1, LP, LR)


@pytest.fixture
def banks(tmp_path):
    a = _bank_file(tmp_path, "a", 0, [3, 1, 4], num_branches=4, first_task=0)  # slot 3 unattempted
    b = _bank_file(tmp_path, "b", 1, [2, 5], num_branches=2, first_task=10)
    return a, b


def test_save_load_draw_round_trips_rows_and_compatibilities(banks):
    (pa, oa, la), (pb, ob, lb) = banks
    bank = load_bank([pa, pb])
    assert bank.num_branches == 5 and bank.attempted.all()
    np.testing.assert_array_equal(bank.valid, np.r_[np.asarray(oa.valid)[:3], np.asarray(ob.valid)])
    np.testing.assert_array_equal(bank.oracle_return, np.r_[np.asarray(oa.oracle_return)[:3], ob.oracle_return])
    np.testing.assert_array_equal(bank.suffix_return, np.r_[np.asarray(oa.suffix_return)[:3], ob.suffix_return])
    np.testing.assert_array_equal(bank.log_c_bj, np.r_[la[:3], lb])
    oracle, log_c = draw_from_bank(bank, np.random.default_rng(0), 5, 32, TEMPLATE)
    ra, rb = _rows(oa), _rows(ob)
    got = _rows(oracle)
    for k in FIELDS:
        np.testing.assert_array_equal(got[k], np.concatenate([ra[k], rb[k]]), err_msg=k)
    np.testing.assert_array_equal(got["group"], np.r_[ra["group"], rb["group"] + 3])  # ids offset by file a's 3
    np.testing.assert_array_equal(log_c, bank.log_c_bj)
    assert np.asarray(oracle.attempted).all() and int(np.asarray(oracle.steps.row_mask).sum()) == 15
    np.testing.assert_array_equal(oracle.valid, bank.valid)
    np.testing.assert_array_equal(oracle.oracle_return, bank.oracle_return)
    # a single file reloads to its own batch
    single, log_c = draw_from_bank(load_bank(pa), np.random.default_rng(0), 4, 32, TEMPLATE)
    for k in FIELDS + ("group",):
        np.testing.assert_array_equal(_rows(single)[k], ra[k], err_msg=k)
    np.testing.assert_array_equal(single.attempted, [True, True, True, False])
    np.testing.assert_array_equal(log_c[:3], la[:3])
    assert (log_c[3] == 0).all() and not np.asarray(single.valid)[3]


def test_a_draw_keeps_the_drawn_branches_rows(banks):
    (pa, *_), (pb, *_) = banks
    bank = load_bank([pa, pb])
    draws = set()
    for seed in range(12):
        oracle, log_c = draw_from_bank(bank, np.random.default_rng(seed), 2, 16, TEMPLATE)
        got = _rows(oracle)
        # which bank branch each new id came from: its stored compatibilities say (they are distinct)
        take = [int(np.nonzero((bank.log_c_bj == log_c[b]).all(1))[0][0]) for b in range(2)]
        assert take[0] < take[1]
        draws.add(tuple(take))
        for b, src in enumerate(take):
            mine = bank.rows["group"] == src
            for k in FIELDS:
                np.testing.assert_array_equal(got[k][got["group"] == b], bank.rows[k][mine], err_msg=k)
            assert oracle.valid[b] == bank.valid[src] and oracle.oracle_return[b] == bank.oracle_return[src]
        assert set(got["group"].tolist()) <= {0, 1}
        assert len(got["group"]) == sum((bank.rows["group"] == s).sum() for s in take)
    assert len(draws) >= 4  # the rng decides which branches
    oracle, log_c = draw_from_bank(bank, np.random.default_rng(0), 7, 32, TEMPLATE)  # more slots than branches
    np.testing.assert_array_equal(oracle.attempted, np.arange(7) < 5)
    assert (log_c[5:] == 0).all() and not np.asarray(oracle.valid)[5:].any()


@pytest.mark.parametrize("scheme", ["full_flat", "root_only", "depth_decay", "short_bridge", "shuffled"])
def test_match_mass_replay_equalises_the_mass_per_branch(banks, scheme):
    """The bank replayed as SeroBranch does (stored log c, step mask from the rows): with match_mass each branch's
    weights sum to SERO's Σ_j Π_{i<j} c_i, and its rows' coefficients to gate · that / #roots."""
    (pa, *_), (pb, *_) = banks
    bank = load_bank([pa, pb])
    oracle, log_c = draw_from_bank(bank, np.random.default_rng(0), 5, 32, TEMPLATE)
    _, step_mask = step_log_compat(jnp.zeros(oracle.steps.response_tokens.shape), oracle.steps, oracle.num_branches,
                                   J)
    key, log_c = jax.random.key(0), jnp.asarray(log_c)
    sero = sero_credit(SeroConfig(scheme="sero"), oracle, log_c, step_mask, key)
    matched = sero_credit(SeroConfig(scheme=scheme, match_mass=True), oracle, log_c, step_mask, key)
    plain = sero_credit(SeroConfig(scheme=scheme), oracle, log_c, step_mask, key)
    mask = np.asarray(step_mask)
    c = np.exp(log_c)
    mass = np.array([sum(np.prod(c[b, :j]) for j in range(J) if mask[b, j]) for b in range(5)])  # by hand
    np.testing.assert_allclose(np.asarray(sero["weight_bj"]).sum(1), mass, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(matched["weight_bj"]).sum(1), mass, rtol=1e-5)
    if scheme != "shuffled":  # a permutation keeps the mass anyway
        assert not np.allclose(np.asarray(plain["weight_bj"]).sum(1), mass, rtol=1e-3)
    group, coef = np.asarray(oracle.steps.group), np.asarray(matched["coef_n"])
    gate = np.asarray(matched["gate_b"])
    np.testing.assert_array_equal(gate, np.asarray(sero["gate_b"]))
    per_branch = np.array([coef[(group == b) & np.asarray(oracle.steps.row_mask)].sum() for b in range(5)])
    np.testing.assert_allclose(per_branch, gate * mass / 5, rtol=1e-5)
    assert gate.any() and not gate.all()  # an invalid branch (2) and a failed one have gate 0

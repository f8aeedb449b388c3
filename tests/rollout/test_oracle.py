"""SERO's oracle branch (agentjax/rollout/oracle.py) on real envs, with scripted policies and the real tokenizer.

Checked:

- roots: exactly one per group with a failed rollout (none for all-success groups or turnless failures), taken at a
  pre-action turn of a failed rollout, carrying its task, action prefix, observation, history, prompt, snapshot,
  budget ``H − t`` and suffix return; every failed (rollout, turn) is drawn and no won one; ``"prioritised"`` draws
  turns ∝ (1 − π_old(a_t)) + 1e-3 (frequencies over 3,000 fixed draws), ``"uniform"`` uniformly;
- branches in the pool's branch slots, the primary slots untouched (Sokoban, TextCraft, WebShop, and ALFWorld when
  ``$ALFWORLD_DATA`` is set): the root replayed from reset and its snapshot restored in a fresh env both give the
  record's observation (admissible actions included) and prompt; the oracle continuation equals the env's own oracle
  played from the replayed root (actions, won, return, why it ended), wins where a shortest solution fits the budget
  (Sokoban, by BFS) and wins somewhere; the collector itself, fed the root's replies and then the serialised oracle
  actions, builds exactly the recorded prompts (history included), replies and constrained choices at every oracle
  step, and the command mask is the smallest run of reply tokens covering the action;
- a tampered record (observation, snapshot, prompt; a snapshot that is missing or an error) invalidates that branch
  only: counted, reason kept, gate and row coefficients 0, the other branches unchanged;
- an env whose restore, oracle or step raises (SerialPool) and a worker killed before the oracle call or the env
  step (EnvPool) lose their branch only;

Packing the branches into the update's rows: tests/rollout/test_oracle_batch.py. No oracle at evaluation:
tests/rollout/test_eval_no_oracle.py.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import signal
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.agents.compact import templates
from agentjax.agents.projection import Projected
from agentjax.agents.prompts import build_messages, encode_prompt
from agentjax.models import Finish, SampleOutput, SamplingParams, load_tokenizer
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from agentjax.rollout.collect import CollectConfig, run_episodes
from agentjax.rollout.oracle import RootRecord, run_branches, select_roots, to_oracle_batch
from agentjax.rollout.records import Episode, Rollouts, Turn
from agentjax.train.config import SeroConfig
from agentjax.train.sero import branch_metrics, sero_credit, step_log_compat
from envs.base import Obs, Task
from envs.pool import EnvPool, SerialPool
from envs.sokoban.env import SokobanEnv
from envs.sokoban.solver import solution_length
from envs.textcraft.env import TextCraftEnv
from tests.envs.toy_env import HangingOracleSokoban

STOPS = (IM_END_ID, ENDOFTEXT_ID)
KEY = jax.random.key(0)
NB, CAP = 8, 64  # branch slots and oracle rows of every packed Sokoban batch here (one compilation of the credit)


# -- scripted policies and a pool that shows them the observations -----------------------------------------------------
class Scripted:
    """A policy replying ``reply(t, i)`` + <|im_end|> in live row ``i`` of turn ``t`` (dummy rows copy row 0), with
    log-prob -0.1 per token; the collector marks the dummy rows by their 1-token limit."""

    def __init__(self, tokenizer: Any, reply: Callable[[int, int], str]):
        self.tokenizer, self.reply, self.turn = tokenizer, reply, 0

    def generate(self, prompts, params, key, **kw) -> SampleOutput:
        live = int((np.asarray(kw["max_new_tokens"]) > 1).sum())
        texts = [self.reply(self.turn, i) for i in range(live)]
        self.turn += 1
        texts += texts[:1] * (len(prompts) - live)
        b, width = len(prompts), params.max_new_tokens
        tokens, length = np.zeros((b, width), np.int32), np.zeros(b, np.int32)
        for i, text in enumerate(texts):
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [IM_END_ID]
            assert len(ids) <= width, text
            tokens[i, :len(ids)], length[i] = ids, len(ids)
        logp = np.where(np.arange(width) < length[:, None], -0.1, 0.0).astype(np.float32)
        return SampleOutput(tokens_bt=tokens, logp_bt=logp, logp_unmasked_bt=logp, length_b=length,
                            finish_b=np.full(b, Finish.STOP_TOKEN, np.int32), texts=texts)


class Tap:
    """The collector's pool, keeping each slot's observation and the live slots (in slot order, as the collector
    batches its rows) for a policy that picks admissible actions."""

    def __init__(self, pool: SerialPool, n: int):
        self.pool, self.n, self.num_slots = pool, n, pool.num_slots
        self.obs: dict[int, Obs] = {}
        self.live: list[int] = []

    def reset(self, tasks):
        obs = self.pool.reset(tasks)
        self.obs, self.live = dict(enumerate(obs)), [s for s in range(self.n) if obs[s] is not None]
        return obs

    def step(self, actions):
        results = self.pool.step(actions)
        for slot, result in enumerate(results):
            if result is not None:
                self.obs[slot] = result.obs
                if result.done:
                    self.live.remove(slot)
        return results

    def snapshot(self, slots, *, strict=True):
        return self.pool.snapshot(slots, strict=strict)


@dataclasses.dataclass
class Case:
    """Primary rollouts of a random admissible policy, their roots and branches (run in the pool's branch slots)."""

    make_env: Callable[[], Any]
    config: CollectConfig
    pool: SerialPool
    slots: list[int]  # the branch slots
    rollouts: Rollouts
    roots: list[RootRecord]
    run: Any  # BranchRun
    primary: tuple[list[Any], list[Any]]  # snapshots of the primary rollouts' slots before and after the branches


def _case(tokenizer, make_env, tasks, config, seed: int, *, reply: str | None = None) -> Case:
    n = len(tasks) * config.group_size
    pool = SerialPool(make_env, n + len(tasks))
    tap = Tap(pool, n)
    rng = np.random.default_rng(seed)
    fmt = reply or config.constrained_format

    def pick(t, i):
        return fmt.format(action=str(rng.choice(tap.obs[tap.live[i]].admissible)))

    rollouts = run_episodes(tap, tasks, Scripted(tokenizer, pick), config, KEY)
    roots = select_roots(rollouts, np.random.default_rng(seed), config)
    slots = list(range(n, n + len(tasks)))
    before = pool.snapshot(range(n))
    run = run_branches(pool, slots, roots, tokenizer, config)
    return Case(make_env, config, pool, slots, rollouts, roots, run, (before, pool.snapshot(range(n))))


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _sampling(width: int, bucket: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_new_tokens=width, stop_token_ids=STOPS, prompt_bucket=bucket)


@pytest.fixture(scope="module")
def sokoban(tokenizer) -> Case:
    config = CollectConfig.sokoban(group_size=2, max_steps=8, max_prompt_tokens=1024, sampling=_sampling(10, 1024),
                                   constrained=True, masked_logp=True, snapshots=True, reward="env")
    return _case(tokenizer, SokobanEnv, SokobanEnv.tasks("train")[:5], config, seed=0)


@pytest.fixture(scope="module")
def textcraft(tokenizer) -> Case:
    config = CollectConfig(group_size=2, max_steps=12, max_prompt_tokens=4096, sampling=_sampling(48, 4096),
                           constrained=True, masked_logp=True, max_allowed=64, snapshots=True)
    return _case(tokenizer, functools.partial(TextCraftEnv, admissible=True), TextCraftEnv.tasks("val")[:3], config,
                 seed=1)


@pytest.fixture(scope="module")
def webshop(tokenizer) -> Case:
    from envs.webshop import WebShopEnv

    config = CollectConfig.webshop(group_size=2, max_steps=10, max_prompt_tokens=4096, sampling=_sampling(64, 4096),
                                   snapshots=True)
    return _case(tokenizer, WebShopEnv, WebShopEnv.tasks("test")[:2], config, seed=0,
                 reply="<think>ok</think><action>{action}</action>")


@pytest.fixture(scope="module")
def alfworld(tokenizer) -> Case:
    if not os.environ.get("ALFWORLD_DATA"):
        pytest.skip("ALFWORLD_DATA is not set (make test unpacks the games into .data/alfworld)")
    from envs.alfworld import AlfWorldEnv

    tasks = [t for t in AlfWorldEnv.tasks("valid_unseen") if t.meta["task_type"] == "pick_and_place_simple"][:1]
    config = CollectConfig.alfworld(group_size=2, max_steps=10, max_prompt_tokens=4096, sampling=_sampling(48, 4096),
                                    constrained=True, snapshots=True)
    return _case(tokenizer, AlfWorldEnv, tasks, config, seed=0)


@pytest.fixture(scope="module")
def webshop_constrained(tokenizer) -> Case:
    """The tiny presets' WebShop: constrained decoding over the listed actions, the instruction as the listed search
    (``search_query="instruction"``), so the expert's search is one of the policy's own replies."""
    from envs.webshop import WebShopEnv

    config = CollectConfig.webshop(group_size=2, max_steps=10, max_prompt_tokens=4096, sampling=_sampling(64, 4096),
                                   constrained=True, masked_logp=True, snapshots=True)
    return _case(tokenizer, functools.partial(WebShopEnv, search_query="instruction"), WebShopEnv.tasks("test")[:4],
                 config, seed=0)  # 3 of its 4 roots sit on the search page (with the placeholder: all 3 inadmissible)


CASES = ["sokoban", "textcraft", "webshop", "alfworld"]


def _replay(case: Case, root: RootRecord) -> tuple[Any, Obs, list[tuple[str, str]]]:
    """A fresh env reset to the root's task and stepped through its action prefix; its observation and history."""
    env = case.make_env()
    obs, history = env.reset(root.task), []
    for action in root.actions:
        history.append((obs.text, action))
        obs = env.step(action)[0]
    return env, obs, history


def check_command_mask(tokenizer, reply_ids, mask, action: str, fmt: str) -> None:
    """``mask`` is the smallest contiguous run of reply tokens whose text covers ``action`` where the format puts it
    (a token straddling the action's edge, e.g. ``]</``, belongs to it); the stop token is outside it."""
    ids, mask = np.asarray(reply_ids).tolist(), np.asarray(mask)
    (run,) = np.nonzero(mask)
    assert len(run) and (np.diff(run) == 1).all() and not mask[-1]
    start = fmt.index("{action}")
    end = start + len(action)
    text = lambda k: tokenizer.decode(ids[:k])  # noqa: E731  the reply's text up to token k
    assert text(len(ids) - 1) == fmt.format(action=action)
    assert len(text(run[0])) <= start < len(text(run[0] + 1))  # the first masked token holds the action's start
    assert len(text(run[-1])) < end <= len(text(run[-1] + 1))  # the last one holds its end


def _episode(case: Case, root: RootRecord) -> Episode:
    return case.rollouts.episodes[root.group * case.config.group_size + root.rollout]


# -- 1. roots ----------------------------------------------------------------------------------------------------------
def _turn(step: int, conf: float, won: bool = False, done: bool = False) -> Turn:
    """A host turn whose one response token had probability ``conf`` (logp_masked), env reward ``step``."""
    obs = Obs(text=f"obs {step}", anchor=f"a{step}", admissible=("x", "y"), instruction="do")
    return Turn(step=step, obs=obs, prompt_ids=np.array([step, 7], np.int32), prompt_truncated=False,
                response_ids=np.array([1, 2], np.int32), logp=np.full(2, -3.0, np.float32),
                logp_masked=np.array([np.log(conf), 0.0], np.float32), finish=int(Finish.STOP_TOKEN), reply="r",
                projected=Projected(action=f"act{step}", valid=True, reason="ok"), next_obs=obs,
                env_reward=float(step), reward=0.0, valid=True, env_valid=True, won=won, terminated=done and won,
                truncated=done and not won, crashed=False, info={}, snapshot=("snap", step))


def _synthetic(groups: list[list[tuple[bool, list[float]]]]) -> Rollouts:
    """Rollouts of hand-made episodes: per group, per rollout (won, per-turn confidences)."""
    episodes = []
    for g, rollouts in enumerate(groups):
        task = Task(env="sokoban", task_id=f"t{g}", split="train", seed=g)
        for r, (won, confs) in enumerate(rollouts):
            turns = tuple(_turn(t, c, won=won and t == len(confs) - 1, done=t == len(confs) - 1)
                          for t, c in enumerate(confs))
            episodes.append(Episode(task=task, task_index=10 + g, group=g, rollout=r, turns=turns))
    return Rollouts(episodes=tuple(episodes), num_groups=len(groups), group_size=len(groups[0]), live_per_call=(),
                    padded_per_call=(), prompt_seconds=0.0, generate_seconds=0.0, env_seconds=0.0, total_seconds=0.0)


SYNTH = _synthetic([
    [(True, [0.5, 0.5]), (True, [0.5])],  # all won: no root
    [(True, [0.5, 0.5, 0.5]), (False, [0.99, 0.5, 0.01, 0.99])],  # one failure: always rollout 1
    [(False, [0.5, 0.5]), (False, [0.5, 0.5, 0.5])],  # two failures
    [(False, []), (True, [0.5])],  # a failure without turns: no root
])
H_SYNTH = 6


def test_one_root_per_group_with_a_failure_at_a_pre_action_turn():
    """Hand-made groups (all won; one failure; two failures; a turnless failure): over 200 rngs and both gate
    returns, one root for each group with a failed turn, its fields copied from that turn and prefix, every failed
    (rollout, turn) drawn, nothing else."""
    config = CollectConfig(group_size=2, max_steps=H_SYNTH)
    seen = collections.Counter()
    for seed in range(200):
        for gate_on in ("success", "reward"):
            roots = select_roots(SYNTH, np.random.default_rng(seed), config, gate_on=gate_on)
            assert [r.group for r in roots] == [1, 2]
            for root in roots:
                ep = SYNTH.episodes[root.group * 2 + root.rollout]
                assert not ep.won and 0 <= root.step < ep.length
                turn = ep.turns[root.step]
                assert (root.task, root.task_index) == (ep.task, 10 + root.group)
                assert root.actions == tuple(f"act{t}" for t in range(root.step))
                assert root.history == tuple((f"obs {t}", f"act{t}") for t in range(root.step))
                assert root.obs == turn.obs and root.snapshot == ("snap", root.step)
                np.testing.assert_array_equal(root.prompt_ids, turn.prompt_ids)
                assert root.budget == H_SYNTH - root.step
                # success: the failed rollout's suffix return is 0; reward: the env rewards from t on (t + ... + T-1)
                expected = 0.0 if gate_on == "success" else float(sum(range(root.step, ep.length)))
                assert root.suffix_return == expected
                seen[root.group, root.rollout, root.step] += 1
    # every failed (rollout, turn) is drawn, nothing else
    assert set(seen) == {(1, 1, t) for t in range(4)} | {(2, 0, t) for t in range(2)} | {(2, 1, t) for t in range(3)}
    # the same rng state gives the same roots
    assert select_roots(SYNTH, np.random.default_rng(3), config) == select_roots(SYNTH, np.random.default_rng(3),
                                                                                 config)


def test_prioritised_roots_prefer_unsure_turns():
    """Group 1's failed rollout has turn confidences 0.99, 0.5, 0.01, 0.99: prioritised draws follow
    (1 − c) + 1e-3 normalised, uniform draws 1/4 each (3,000 draws, tolerance 5 standard errors)."""
    config = CollectConfig(group_size=2, max_steps=H_SYNTH)
    rng_p, rng_u = np.random.default_rng(0), np.random.default_rng(0)
    draws = 3000
    counts = {"prioritised": np.zeros(4), "uniform": np.zeros(4)}
    for _ in range(draws):
        counts["prioritised"][select_roots(SYNTH, rng_p, config, mode="prioritised")[0].step] += 1
        counts["uniform"][select_roots(SYNTH, rng_u, config, mode="uniform")[0].step] += 1
    p = 1.0 - np.array([0.99, 0.5, 0.01, 0.99]) + 1e-3
    p /= p.sum()
    tol = 5 * np.sqrt(0.25 / draws)
    np.testing.assert_allclose(counts["prioritised"] / draws, p, atol=tol)
    np.testing.assert_allclose(counts["uniform"] / draws, 0.25, atol=tol)
    assert counts["prioritised"][2] > 1.5 * counts["prioritised"][1] > 10 * counts["prioritised"][0]


# -- 2. restoration and the oracle continuation on real envs -----------------------------------------------------------
@pytest.mark.parametrize("name", [*CASES, "webshop_constrained"])
def test_branches_restore_the_root_and_follow_the_oracle(name, request, tokenizer):
    """Each root against a fresh env replayed from reset (observation, history, prompt, restore of its snapshot),
    and each branch against that env's own oracle played through the remaining budget."""
    case: Case = request.getfixturevalue(name)
    config, groups = case.config, case.rollouts.num_groups
    failing = {ep.group for ep in case.rollouts.episodes if not ep.won}
    assert [r.group for r in case.roots] == sorted(failing) and case.roots
    tmpl = templates(config.prompt)
    wins = 0
    for branch in case.run.branches:
        root = branch.root
        ep = _episode(case, root)
        assert not ep.won and root.obs == ep.turns[root.step].obs and root.budget == config.max_steps - root.step
        env, obs, history = _replay(case, root)
        assert obs == root.obs and tuple(history) == root.history  # the snapshot is of the state before the action
        assert case.make_env().restore(root.snapshot) == root.obs  # admissible actions included
        messages = build_messages(tmpl[root.task.env], obs, history, root.step, config.history_length)
        assert encode_prompt(tokenizer, messages) == root.prompt_ids.tolist()
        assert branch.valid and branch.ended in ("won", "done", "budget"), (branch.ended, branch.detail)
        actions, done, info = [], False, {}
        while not done and len(actions) < root.budget:
            actions.append(env.oracle())
            obs, _, done, info = env.step(actions[-1])
        assert [s.action for s in branch.steps] == actions and [s.depth for s in branch.steps] == list(
            range(len(actions)))
        assert branch.won == bool(done and info["won"]) and branch.oracle_return == float(branch.won)
        assert branch.ended == ("won" if branch.won else "done" if done else "budget")
        if name == "sokoban":  # the BFS oracle wins exactly when a shortest solution fits the remaining budget
            shortest = solution_length(_restored_state(root))
            assert branch.won == (shortest is not None and shortest <= root.budget)
        wins += branch.won
    assert wins >= 1
    if name == "webshop_constrained":  # the expert's first action there is the search the policy can send
        assert any(b.root.step == 0 for b in case.run.branches)
    assert case.run.env_steps == sum(len(b.steps) for b in case.run.branches)
    assert case.primary[0] == case.primary[1]  # the primary rollouts' envs were never touched
    assert len(case.run.branches) <= groups


def _restored_state(root: RootRecord):
    env = SokobanEnv()
    env.restore(root.snapshot)
    return env.state


@pytest.mark.parametrize("name", CASES)
def test_oracle_steps_read_what_the_collector_would_have_shown(name, request, tokenizer):
    """The collector, fed the root's replies and then the serialised oracle actions, records the same prompts,
    replies and constrained choices as the branch, and ends the episode the same way."""
    case: Case = request.getfixturevalue(name)
    config = case.config.replace(group_size=1)
    for branch in case.run.branches:
        root = branch.root
        replies = [t.reply for t in _episode(case, root).turns[:root.step]]
        replies += [config.constrained_format.format(action=s.action) for s in branch.steps]
        policy = Scripted(tokenizer, lambda t, i, replies=replies: replies[t])
        (ep,) = run_episodes(SerialPool(case.make_env, 1), [root.task], policy, config, KEY).episodes
        assert ep.length == root.step + len(branch.steps) and ep.won == branch.won
        np.testing.assert_array_equal(ep.turns[root.step].prompt_ids, root.prompt_ids)
        for step in branch.steps:
            turn = ep.turns[root.step + step.depth]
            np.testing.assert_array_equal(step.prompt_ids, turn.prompt_ids)
            np.testing.assert_array_equal(step.reply_ids, turn.response_ids)
            assert step.allowed_ids == turn.allowed_ids
            assert step.reply_ids[-1] == STOPS[0]
            check_command_mask(tokenizer, step.reply_ids, step.command_mask, step.action, config.constrained_format)


# -- 3. mismatches -----------------------------------------------------------------------------------------------------
def _credit(branches, config: CollectConfig):
    """The branches packed into ``NB`` slots and ``CAP`` rows, and their credit with every compatibility 1."""
    oracle = to_oracle_batch(branches, config, num_branches=NB, capacity=CAP)
    logp = jnp.zeros(oracle.steps.response_tokens.shape)
    log_c, mask = step_log_compat(logp, oracle.steps, NB, config.max_steps)
    return oracle, sero_credit(SeroConfig(), oracle, log_c, mask, KEY), log_c, mask


def _same_branch(a, b) -> bool:
    return ([(s.action, s.prompt_ids.tolist(), s.reply_ids.tolist()) for s in a.steps]
            == [(s.action, s.prompt_ids.tolist(), s.reply_ids.tolist()) for s in b.steps]
            and (a.valid, a.ended, a.won, a.oracle_return) == (b.valid, b.ended, b.won, b.oracle_return))


def test_a_tampered_record_invalidates_its_branch_only(sokoban, tokenizer):
    """Observation, snapshot (another room) and prompt tampered, a missing and a failed snapshot: those branches
    end ``mismatch`` / ``restore_error`` with their reason, count as attempted but not valid, get gate 0; the
    untouched roots give the same branches as before."""
    roots, branches = sokoban.roots, sokoban.run.branches
    assert len(roots) >= 4
    other = next(r for r in roots if r.task != roots[1].task)
    tampered = [
        dataclasses.replace(roots[0], obs=roots[0].obs._replace(text=roots[0].obs.text.replace("#", "_", 1))),
        dataclasses.replace(roots[1], snapshot=other.snapshot),  # another room
        dataclasses.replace(roots[2], prompt_ids=np.concatenate([roots[2].prompt_ids[:-1], [0]]).astype(np.int32)),
        *roots[3:],
        dataclasses.replace(roots[3], snapshot=None),
        dataclasses.replace(roots[3], snapshot=RuntimeError("snapshot failed")),
    ]
    run = run_branches(SerialPool(SokobanEnv, len(tampered)), range(len(tampered)), tampered, tokenizer,
                       sokoban.config)
    out = run.branches
    assert [b.ended for b in out[:3]] == ["mismatch"] * 3 and not any(b.valid or b.steps for b in out[:3])
    assert "text" in out[0].detail and "text" in out[1].detail and "prompt" in out[2].detail
    assert [b.ended for b in out[-2:]] == ["restore_error"] * 2 and not any(b.valid or b.steps for b in out[-2:])
    assert "snapshot failed" in out[-1].detail and "CollectConfig.snapshots" in out[-2].detail
    for b, ref in zip(out[3:-2], branches[3:], strict=True):
        assert _same_branch(b, ref)
    n = len(tampered)
    oracle, credit, log_c, mask = _credit(out, sokoban.config)
    gate = np.asarray(credit["gate_b"])[:n]
    assert (gate[:3] == 0).all() and (gate[-2:] == 0).all()
    np.testing.assert_array_equal(gate[3:-2], [float(b.won) for b in out[3:-2]])
    assert int(credit["num_roots"]) == n  # the invalid branches stay in the denominator
    metrics = branch_metrics(run, oracle, credit, log_c, mask)
    assert (metrics["ended_mismatch"], metrics["ended_restore_error"]) == (3, 2)
    assert metrics["roots_attempted"] == n and metrics["roots_valid"] == n - 5


# -- 4. exceptions and crashes -----------------------------------------------------------------------------------------
class Poison(NamedTuple):
    """A snapshot marked for :class:`FlakySokoban`: ``where`` in "restore", "oracle" (at depth 1), "step"."""

    where: str
    inner: Any


class FlakySokoban(SokobanEnv):
    """Sokoban whose restore, oracle (its second call) or step raises after restoring a :class:`Poison`."""

    poison: str | None = None
    oracle_calls = 0

    def restore(self, snapshot):
        self.poison, self.oracle_calls = None, 0
        if isinstance(snapshot, Poison):
            if snapshot.where == "restore":
                raise RuntimeError("poisoned restore")
            self.poison, snapshot = snapshot.where, snapshot.inner
        return super().restore(snapshot)

    def oracle(self):
        self.oracle_calls += 1
        if self.poison == "oracle" and self.oracle_calls == 2:
            raise RuntimeError("poisoned oracle")
        return super().oracle()

    def _step(self, action):
        if self.poison == "step":
            raise RuntimeError("poisoned step")
        return super()._step(action)


def test_an_env_that_raises_loses_its_branch_only(sokoban, tokenizer):
    """Restore raising: ``restore_error``; oracle raising at depth 1: ``oracle_error``, its first step kept, still
    valid, not won; step raising: ``crash``, invalid; the other branches unchanged; gate and coefficients 0."""
    deep = [i for i, b in enumerate(sokoban.run.branches) if len(b.steps) >= 2]
    assert len(deep) >= 2 and len(sokoban.roots) >= 4
    poisoned = {deep[0]: "oracle", deep[1]: "step"}
    poisoned[min(set(range(len(sokoban.roots))) - set(poisoned))] = "restore"
    restore_err = next(i for i, where in poisoned.items() if where == "restore")
    roots = [dataclasses.replace(r, snapshot=Poison(poisoned[i], r.snapshot)) if i in poisoned else r
             for i, r in enumerate(sokoban.roots)]
    pool = SerialPool(FlakySokoban, len(roots))
    out = run_branches(pool, range(len(roots)), roots, tokenizer, sokoban.config).branches
    ref = sokoban.run.branches
    assert out[restore_err].ended == "restore_error" and "poisoned restore" in out[restore_err].detail
    assert not out[restore_err].valid and not out[restore_err].steps
    oracle_err = out[deep[0]]  # keeps its first step, stays valid, fails to improve
    assert oracle_err.ended == "oracle_error" and "poisoned oracle" in oracle_err.detail and oracle_err.valid
    assert [s.action for s in oracle_err.steps] == [ref[deep[0]].steps[0].action] and not oracle_err.won
    step_err = out[deep[1]]  # the env raised in step: truncated by the pool, the branch is lost
    assert step_err.ended == "crash" and "poisoned step" in step_err.detail and not step_err.valid
    assert len(step_err.steps) == 1
    for i, (b, r) in enumerate(zip(out, ref, strict=True)):
        if i not in poisoned:
            assert _same_branch(b, r)
    oracle, credit, _, _ = _credit(out, sokoban.config)
    coef, group = np.asarray(credit["coef_n"]), np.asarray(oracle.steps.group)
    for i in poisoned:
        assert credit["gate_b"][i] == 0 and (coef[group == i] == 0).all()


class Saboteur:
    """The branch pool, SIGKILLing the worker of ``kill[(call, k)]`` before the ``k``-th ``call`` ("oracle",
    "step")."""

    def __init__(self, pool: EnvPool, kill: dict[tuple[str, int], int]):
        self.pool, self.kill, self.num_slots = pool, kill, pool.num_slots
        self.calls = collections.Counter()

    def _sabotage(self, call: str) -> None:
        slot = self.kill.get((call, self.calls[call]))
        self.calls[call] += 1
        if slot is not None:
            os.kill(self.pool.worker_pids()[self.pool.worker_of(slot)], signal.SIGKILL)

    def restore(self, slots, snaps, *, strict=True):
        return self.pool.restore(slots, snaps, strict=strict)

    def oracle(self, slots, *, strict=True, timeout=None):
        self._sabotage("oracle")
        return self.pool.oracle(slots, strict=strict, timeout=timeout)

    def step(self, actions):
        self._sabotage("step")
        return self.pool.step(actions)


def test_an_oracle_past_its_timeout_loses_its_branch_only(sokoban, tokenizer):
    """SeroConfig.oracle_timeout: the first root's oracle hangs (a planner without a time limit); its worker is
    killed after the timeout and the branch ends ``timeout`` (invalid, no steps, counted); the others run as in the
    serial pool. A SerialPool cannot bound a call and says so."""
    roots, ref = sokoban.roots[:3], sokoban.run.branches[:3]
    assert len({r.task.task_id for r in roots}) == 3 and all(b.steps for b in ref)
    make_env = functools.partial(HangingOracleSokoban, hang=(roots[0].task.task_id,))
    with EnvPool(make_env, num_slots=3, num_workers=3) as pool:
        run = run_branches(pool, [0, 1, 2], roots, tokenizer, sokoban.config, oracle_timeout=3.0)
    out = run.branches
    assert out[0].ended == "timeout" and not out[0].valid and not out[0].steps and "timed out" in out[0].detail
    assert _same_branch(out[1], ref[1]) and _same_branch(out[2], ref[2])
    oracle, credit, log_c, mask = _credit(out, sokoban.config)
    assert (np.asarray(credit["coef_n"])[np.asarray(oracle.steps.group) == 0] == 0).all()
    assert branch_metrics(run, oracle, credit, log_c, mask)["ended_timeout"] == 1
    with pytest.raises(ValueError, match="EnvPool"):
        run_branches(SerialPool(SokobanEnv, 1), [0], roots[1:2], tokenizer, sokoban.config, oracle_timeout=3.0)


def test_a_crashed_worker_loses_its_branch_only(sokoban, tokenizer):
    """Three branches in three workers: the first's worker dies before the first oracle call, the second's before
    the first env step; the third runs as in the serial pool."""
    ref = sokoban.run.branches[:3]
    assert all(b.steps for b in ref)
    with EnvPool(SokobanEnv, num_slots=3, num_workers=3, timeout=60.0) as pool:
        run = run_branches(Saboteur(pool, {("oracle", 0): 0, ("step", 0): 1}), [0, 1, 2], sokoban.roots[:3],
                           tokenizer, sokoban.config)
    out = run.branches
    assert out[0].ended == "crash" and not out[0].valid and not out[0].steps and "SIGKILL" in out[0].detail
    assert out[1].ended == "crash" and not out[1].valid and len(out[1].steps) == 1 and "SIGKILL" in out[1].detail
    assert _same_branch(out[2], ref[2])
    oracle, credit, log_c, mask = _credit(out, sokoban.config)
    assert (np.asarray(credit["coef_n"])[np.asarray(oracle.steps.group) < 2] == 0).all()
    assert branch_metrics(run, oracle, credit, log_c, mask)["ended_crash"] == 2

"""SERO's oracle branch on the host: root records, restoration in isolated env slots, oracle continuations and
the :class:`OracleBatch` the trainer scores and trains on (METHODS.md "SERO" 1-3; papers/SERO.txt §4.2, §C, §D).

One update's branch, in order:

1. :func:`select_roots` — from each group of the primary rollouts with at least one failure, one failed rollout drawn
   uniformly and one of its pre-action turns ``t`` (uniformly, or ``"prioritised"``: ∝ (1 − π_old(a_t))^p + 1e-3,
   the turns where the behaviour policy was least sure of what it did — our reading of §G's suggested extension).
   A :class:`RootRecord` keeps the task, the action prefix, the policy-visible observation and history, the legal
   actions, the prompt the policy saw, the remaining budget ``H − t`` (``H`` the collector's step cap), the original
   suffix return and the env snapshot the collector took before the turn's action (``CollectConfig.snapshots``).
2. :func:`run_branches` — restores every root into its own slot of the pool's *branch slots* (never a primary
   rollout's env: the caller passes slots the collector does not use), by the env's ``restore`` (exact for Sokoban,
   WebShop, TextCraft, TextWorld-Sync; ALFWorld's and TextWorld's snapshot is its command prefix, which ``restore``
   replays on a reset game and checks). The restored observation, admissible actions and the rebuilt prompt must
   equal the record's, else the branch is invalid (its reason is kept, it is counted and never trained on). Then the
   env's training-only oracle acts from every valid root at once, one ``pool.oracle`` + ``pool.step`` per depth,
   through the remaining budget (or ``max_oracle_steps``), recording at each step the prompt the policy would have
   seen there — same template, same history window, built from the branch's own history — and the oracle's action
   serialised as the policy's reply (``CollectConfig.constrained_format`` and the stop token) with its command-token
   mask (the tokens of the action text) and, with ``masked_logp``, the tokens the constrained decoder would have
   allowed. An oracle that raises (e.g. ALFWorld's expert with an inadmissible command), an action the constrained
   policy could not emit, or a crashed worker ends that branch only: a crash makes it invalid, the others keep
   their steps and fail to improve (gate 0). With an ``oracle_timeout`` every ``pool.oracle`` call is bounded: a
   worker past it is killed and restarted, and the branches it held end ``timeout`` (invalid, counted). It is meant
   for ALFWorld's planner, a blind search whose time per plan spans four orders of magnitude; the restores and env
   steps are left unbounded (their cost is linear in the prefix, and a bound on them would cut valid branches
   whenever the machine is busy).
3. :func:`to_oracle_batch` — the branches as fixed-capacity arrays: the real oracle steps as rows of a
   :class:`~agentjax.rollout.StepBatch` (branch-major, real rows first; ``group`` = branch, ``step`` = oracle
   depth, ``response_mask`` = command tokens), and per branch ``attempted``, ``valid``, ``oracle_return``,
   ``suffix_return``.

Returns compare like with like over the same remaining horizon: ``gate_on="success"`` (binary task success; the
failed rollout's suffix return is 0) or ``"reward"`` (the env's own reward summed from the root on). Plain Python +
NumPy; the policy is never called here (the behaviour scores are the trainer's, :mod:`agentjax.train.sero`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Literal

import flax.struct
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from agentjax.agents.compact import templates
from agentjax.agents.prompts import PromptTemplate
from agentjax.rollout.batch import StepBatch
from agentjax.rollout.calls import ReplyTokens
from agentjax.rollout.collect import PROJECTORS, CollectConfig, Projector, turn_prompt
from agentjax.rollout.policy import Tokenizer, constrained_choices
from agentjax.rollout.records import Rollouts
from envs.base import Obs, Task
from envs.pool import WorkerCrashError, WorkerTimeoutError, timed_out

GateOn = Literal["success", "reward"]


@dataclasses.dataclass(frozen=True)
class RootRecord:
    """A policy-visited decision point to branch from (module docstring, 1)."""

    group: int  # the primary group it comes from
    rollout: int
    step: int  # t: actions taken before it
    task: Task
    task_index: int
    actions: tuple[str, ...]  # the action prefix a_0 .. a_{t-1}
    obs: Obs  # the policy-visible observation at t (its admissible actions are the legal ones)
    history: tuple[tuple[str, str], ...]  # every (observation text, action) record before t
    prompt_ids: np.ndarray  # the prompt the policy saw at t
    budget: int  # H − t
    suffix_return: float  # the on-policy return from t on
    snapshot: Any  # the env snapshot before the action at t (or the error that taking it raised)


@dataclasses.dataclass(frozen=True)
class OracleStep:
    """One oracle step of a branch: what the policy would have read, and the oracle's reply."""

    depth: int  # j: oracle steps before it
    action: str
    prompt_ids: np.ndarray  # [k] int32
    reply_ids: np.ndarray  # [n] int32: constrained_format(action) + stop token
    command_mask: np.ndarray  # [n] bool: the tokens of the action text
    allowed_ids: tuple[tuple[int, ...], ...] | None  # per reply token, the constrained decoder's choices


@dataclasses.dataclass(frozen=True)
class Branch:
    """The oracle continuation from one root."""

    root: RootRecord
    valid: bool  # restored and validated, and not lost to a crash
    ended: str  # why it stopped: "won", "done", "budget", "oracle_error", "inadmissible", "prompt", "crash",
    # "restore_error", "mismatch"
    steps: tuple[OracleStep, ...]
    won: bool
    oracle_return: float
    detail: str = ""  # the error or the mismatch, for the logs


@dataclasses.dataclass(frozen=True)
class BranchRun:
    """What :func:`run_branches` returns."""

    branches: tuple[Branch, ...]
    restore_seconds: float
    oracle_seconds: float  # pool.oracle + pool.step
    prompt_seconds: float
    env_steps: int  # oracle actions executed


def _suffix_return(episode: Any, t: int, gate_on: GateOn) -> float:
    if gate_on == "success":
        return float(episode.won)
    return float(sum(turn.env_reward for turn in episode.turns[t:]))


def select_roots(
    rollouts: Rollouts,
    rng: np.random.Generator,
    config: CollectConfig,
    *,
    mode: Literal["uniform", "prioritised"] = "uniform",
    priority_power: float = 1.0,
    gate_on: GateOn = "success",
) -> list[RootRecord]:
    """At most one root per group: a failed rollout drawn uniformly, then one of its turns (module docstring, 1).

    Groups without a failure (or whose failed rollouts have no turn) give none. ``rng`` makes the draw repeatable.
    """
    g_size = rollouts.group_size
    roots = []
    for g in range(rollouts.num_groups):
        episodes = rollouts.episodes[g * g_size:(g + 1) * g_size]
        failed = [ep for ep in episodes if not ep.won and ep.turns]
        if not failed:
            continue
        ep = failed[int(rng.integers(len(failed)))]
        if mode == "prioritised":
            conf = np.array([np.exp(float(np.sum(turn.logp_masked))) for turn in ep.turns])
            p = (1.0 - np.clip(conf, 0.0, 1.0)) ** priority_power + 1e-3
            t = int(rng.choice(len(ep.turns), p=p / p.sum()))
        elif mode == "uniform":
            t = int(rng.integers(len(ep.turns)))
        else:
            raise ValueError(f"select_roots: mode={mode!r}; use 'uniform' or 'prioritised'")
        turn = ep.turns[t]
        roots.append(RootRecord(
            group=g, rollout=ep.rollout, step=t, task=ep.task, task_index=ep.task_index,
            actions=tuple(x.projected.action for x in ep.turns[:t]), obs=turn.obs,
            history=tuple((x.obs.text, x.projected.action) for x in ep.turns[:t]), prompt_ids=turn.prompt_ids,
            budget=config.max_steps - t, suffix_return=_suffix_return(ep, t, gate_on), snapshot=turn.snapshot))
    return roots


def _mismatch(restored: Obs, record: Obs) -> str:
    for name in ("text", "anchor", "admissible", "instruction"):
        a, b = getattr(restored, name), getattr(record, name)
        if (tuple(a) if a is not None else None) != (tuple(b) if b is not None else None):
            return f"the restored {name} differs from the record's ({str(a)[:80]!r} vs {str(b)[:80]!r})"
    return ""


class _Serialiser:
    """The oracle's action as the policy's reply: token ids, command-token mask, the constrained choices."""

    def __init__(self, tokenizer: Tokenizer, config: CollectConfig):
        self.tokenizer, self.config = tokenizer, config
        self.stop = int(config.sampling.stop_token_ids[0]) if config.sampling.stop_token_ids else None
        self.ids = ReplyTokens(tokenizer)

    def __call__(self, action: str, admissible: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray, Any] | str:
        """(reply ids, command mask, allowed ids) or the reason the policy could not emit the action."""
        cfg = self.config
        reply = cfg.constrained_format.format(action=action)
        start = cfg.constrained_format.index("{action}")
        enc = self.tokenizer(reply, return_offsets_mapping=True, add_special_tokens=False)
        ids = list(enc["input_ids"])
        if ids != self.ids(reply):
            raise ValueError(f"oracle: the tokenizer's offsets encoding of {reply!r} differs from its plain encoding")
        mask = [a < start + len(action) and b > start for a, b in enc["offset_mapping"]]
        if self.stop is not None:
            ids, mask = ids + [self.stop], mask + [False]
        if len(ids) > cfg.max_response_tokens:
            return f"the reply {reply!r} needs {len(ids)} tokens, more than max_new_tokens={cfg.max_response_tokens}"
        allowed = None
        if cfg.constrained:
            if admissible is not None and action not in admissible:
                return f"the oracle's action {action!r} is not admissible, so the constrained policy cannot emit it"
            if cfg.masked_logp:
                if not admissible:
                    return "no admissible actions to build the constrained choices from"
                replies = [self.ids(cfg.constrained_format.format(action=a)) for a in admissible]
                allowed = constrained_choices(replies, cfg.sampling.stop_token_ids, ids)
        return np.asarray(ids, np.int32), np.asarray(mask, bool), allowed


def run_branches(
    pool: Any,
    slots: Sequence[int],
    roots: Sequence[RootRecord],
    tokenizer: Tokenizer,
    config: CollectConfig,
    *,
    template: PromptTemplate | None = None,
    projector: Projector | None = None,
    max_oracle_steps: int | None = None,
    gate_on: GateOn = "success",
    oracle_timeout: float | None = None,
) -> BranchRun:
    """Restore every root into ``slots[i]`` and run the oracle from it (module docstring, 2).

    Args:
      pool: an :class:`envs.pool.EnvPool` / :class:`envs.pool.SerialPool`; ``slots`` are its branch slots (one per
        root; the caller keeps them apart from the primary rollouts' slots).
      roots: from :func:`select_roots` (their snapshots from a collection with ``CollectConfig.snapshots``).
      tokenizer: the policy's tokenizer (prompts and replies are encoded as the collector does).
      config: the primary rollouts' collector config (template set, history window, constrained format, sizes).
      template: the prompt template (default: ``config.prompt``'s template of the root's env).
      projector: the reply projection (default ``PROJECTORS[env]``; an env without one records the oracle's action):
        the branch's history records the projection of the serialised reply, as the collector records the
        projection of the policy's reply, so the later prompts are the ones the policy would have seen.
      max_oracle_steps: a cap on each branch's steps besides its remaining budget.
      gate_on: the return the branch reports (module docstring).
      oracle_timeout: seconds each ``pool.oracle`` call may take (module docstring, 2; None: the pool's own bound).
        It needs an :class:`envs.pool.EnvPool`: a :class:`~envs.pool.SerialPool` cannot bound a call and raises.
    """
    if len(slots) < len(roots):
        raise ValueError(f"run_branches: {len(roots)} roots need as many branch slots, got {len(slots)}")
    slots = [int(s) for s in slots[:len(roots)]]
    serialise = _Serialiser(tokenizer, config)
    table = templates(config.prompt)
    tmpl = [template or table[r.task.env] for r in roots]
    projectors = [projector or PROJECTORS.get(r.task.env) for r in roots]
    require_think = config.require_think and not config.constrained  # as the collector projects
    n = len(roots)
    steps: list[list[OracleStep]] = [[] for _ in range(n)]
    state: list[dict[str, Any]] = [dict(valid=True, ended="", detail="", won=False, ret=0.0) for _ in range(n)]
    restore_s = oracle_s = prompt_s = 0.0
    env_steps = 0

    t0 = time.perf_counter()
    have = [i for i in range(n) if not isinstance(roots[i].snapshot, (Exception, type(None)))]
    for i in set(range(n)) - set(have):
        snap = roots[i].snapshot
        state[i] |= dict(valid=False, ended="restore_error",
                         detail=f"no snapshot: {snap}" if snap is not None else "no snapshot (collect with "
                                "CollectConfig.snapshots=True)")
    restored = pool.restore([slots[i] for i in have], [roots[i].snapshot for i in have], strict=False) if have else []
    restore_s += time.perf_counter() - t0
    obs: list[Obs | None] = [None] * n
    history: list[list[tuple[str, str]]] = [list(r.history) for r in roots]
    live = []
    for i, result in zip(have, restored, strict=True):
        if isinstance(result, Exception):
            ended = "timeout" if isinstance(result, WorkerTimeoutError) else "restore_error"
            state[i] |= dict(valid=False, ended=ended, detail=str(result)[-300:])
            continue
        why = _mismatch(result, roots[i].obs)
        if not why:
            ids, _ = turn_prompt(tokenizer, tmpl[i], result, history[i], roots[i].step, config, "a SERO root")
            if ids != [int(x) for x in roots[i].prompt_ids]:
                why = "the rebuilt prompt differs from the one the policy saw"
        if why:
            state[i] |= dict(valid=False, ended="mismatch", detail=why)
            continue
        obs[i] = result
        live.append(i)

    depth = 0
    while live:
        t0 = time.perf_counter()
        actions = pool.oracle([slots[i] for i in live], strict=False, timeout=oracle_timeout)
        oracle_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        acting, step_actions = [], [None] * pool.num_slots
        for i, action in zip(live, actions, strict=True):
            if isinstance(action, Exception):
                crash = isinstance(action, WorkerCrashError)
                ended = "timeout" if isinstance(action, WorkerTimeoutError) else "crash" if crash else "oracle_error"
                state[i] |= dict(ended=ended, detail=str(action)[-300:], valid=state[i]["valid"] and not crash)
                continue
            try:
                ids, _ = turn_prompt(tokenizer, tmpl[i], obs[i], history[i], roots[i].step + depth, config,
                                     f"oracle step {depth} of a SERO branch")
            except ValueError as e:  # a prompt longer than max_prompt_tokens with truncation="error"
                state[i] |= dict(ended="prompt", detail=str(e))
                continue
            reply = serialise(action, obs[i].admissible)
            if isinstance(reply, str):
                state[i] |= dict(ended="inadmissible", detail=reply)
                continue
            steps[i].append(OracleStep(depth=depth, action=action, prompt_ids=np.asarray(ids, np.int32),
                                       reply_ids=reply[0], command_mask=reply[1], allowed_ids=reply[2]))
            step_actions[slots[i]] = action
            acting.append(i)
        prompt_s += time.perf_counter() - t0
        if not acting:
            break
        t0 = time.perf_counter()
        results = pool.step(step_actions)
        oracle_s += time.perf_counter() - t0
        env_steps += len(acting)
        depth += 1
        live = []
        for i in acting:
            res = results[slots[i]]
            action = steps[i][-1].action
            if projectors[i] is not None:  # what the collector would record for this reply (e.g. Sokoban: "up")
                reply = config.constrained_format.format(action=action)
                action = projectors[i](reply, obs[i].admissible, require_think=require_think).action
            history[i].append((obs[i].text, action))
            obs[i] = res.obs
            info = res.info
            if "worker_crash" in info or "error" in info:
                why = str(info.get("worker_crash") or info["error"])
                ended = "timeout" if "worker_crash" in info and timed_out(why) else "crash"
                state[i] |= dict(valid=False, ended=ended, detail=why[-300:])
                continue
            won = bool(res.done and info.get("won", False))
            state[i]["ret"] += float(won) if gate_on == "success" else float(res.reward)
            if res.done:
                state[i] |= dict(won=won, ended="won" if won else "done")
            elif depth >= roots[i].budget or (max_oracle_steps is not None and depth >= max_oracle_steps):
                state[i]["ended"] = "budget"
            else:
                live.append(i)
    branches = tuple(Branch(root=roots[i], valid=state[i]["valid"], ended=state[i]["ended"], steps=tuple(steps[i]),
                            won=state[i]["won"], oracle_return=state[i]["ret"], detail=state[i]["detail"])
                     for i in range(n))
    return BranchRun(branches=branches, restore_seconds=restore_s, oracle_seconds=oracle_s, prompt_seconds=prompt_s,
                     env_steps=env_steps)


@flax.struct.dataclass(frozen=True)
class OracleBatch:
    """One update's oracle branches as arrays (module docstring, 3): ``Br`` branch slots, ``N`` step rows."""

    steps: StepBatch  # [N] rows: prompt, reply (response_mask = command tokens), allowed tokens; group = branch,
    # step = oracle depth, row_mask = real step; real rows first, branch-major in depth order
    attempted: Bool[Array, " Br"]  # a root was attempted in this slot (the loss's denominator counts these)
    valid: Bool[Array, " Br"]  # restored, validated, not lost to a crash
    oracle_return: Float[Array, " Br"]
    suffix_return: Float[Array, " Br"]

    @property
    def num_branches(self) -> int:
        return self.attempted.shape[0]


def to_oracle_batch(branches: Sequence[Branch], config: CollectConfig, *, num_branches: int,
                    capacity: int) -> OracleBatch:
    """Pack ``branches`` (at most ``num_branches``) into an :class:`OracleBatch` of ``capacity`` step rows with the
    primary batch's prompt / reply widths (``config``). Steps that do not fit the capacity are dropped from the end
    of the branches that overflow it (a fixed capacity means one compiled update; the default holds every step)."""
    if len(branches) > num_branches:
        raise ValueError(f"to_oracle_batch: {len(branches)} branches for {num_branches} branch slots")
    lp, lr = config.max_prompt_tokens, config.max_response_tokens
    rows = [(b, s) for b, br in enumerate(branches) for s in br.steps][:capacity]
    n = len(rows)
    prompt = np.zeros((n, lp), np.int32)
    prompt_mask = np.zeros((n, lp), bool)
    reply = np.zeros((n, lr), np.int32)
    mask = np.zeros((n, lr), bool)
    for r, (_, s) in enumerate(rows):
        k, m = len(s.prompt_ids), len(s.reply_ids)
        prompt[r, lp - k:], prompt_mask[r, lp - k:] = s.prompt_ids, True
        reply[r, :m], mask[r, :m] = s.reply_ids, s.command_mask
    fields: dict[str, Any] = dict(
        prompt_tokens=prompt, prompt_mask=prompt_mask, response_tokens=reply, response_mask=mask,
        group=np.array([b for b, _ in rows], np.int32), step=np.array([s.depth for _, s in rows], np.int32),
        task=np.array([branches[b].root.task_index for b, _ in rows], np.int32), valid=np.ones(n, bool))
    if config.masked_logp:
        allowed = np.full((n, lr, config.max_allowed), -1, np.int32)
        for r, (_, s) in enumerate(rows):
            for j, choices in enumerate(s.allowed_ids or ()):
                if len(choices) > config.max_allowed:
                    raise ValueError(f"to_oracle_batch: an oracle reply position has {len(choices)} allowed tokens, "
                                     f"more than CollectConfig.max_allowed={config.max_allowed}; raise it")
                allowed[r, j, :len(choices)] = choices
        fields["allowed_tokens"] = allowed
    steps = StepBatch.from_rows(capacity, lp, lr, **fields)
    pad = num_branches - len(branches)
    col = lambda f, dtype: jnp.asarray(np.array([f(br) for br in branches] + [0] * pad, dtype))  # noqa: E731
    return OracleBatch(steps=steps, attempted=jnp.arange(num_branches) < len(branches),
                       valid=col(lambda br: br.valid, bool), oracle_return=col(lambda br: br.oracle_return, np.float32),
                       suffix_return=col(lambda br: br.root.suffix_return, np.float32))


__all__ = ["Branch", "BranchRun", "OracleBatch", "OracleStep", "RootRecord", "run_branches", "select_roots",
           "to_oracle_batch"]

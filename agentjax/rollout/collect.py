"""The rollout collector: groups of G rollouts per task, one batched policy call per turn, a `StepBatch` out.

``collect(pool, tasks, policy, config, key)`` runs ``G = config.group_size`` episodes of every task in the slots
of an env pool (slots ``i*G .. i*G+G-1`` share task ``i`` and its seed, hence the reset state: every env is
deterministic given its task) and returns the turns as one padded :class:`~agentjax.rollout.StepBatch` plus
:class:`~agentjax.rollout.stats.RolloutStats`. It is :func:`run_episodes` (the env ⇄ policy loop, host records)
followed by :func:`to_step_batch` (the one conversion into arrays) and :func:`summarize`. Each turn ``t``:

1. *Prompts* of the live slots: the env's :class:`~agentjax.agents.PromptTemplate` over the current observation
   and the last ``history_length`` ``(observation text, action)`` records (verl-agent; the action is the projected
   string that was sent to the env, also for an invalid reply), as chat messages, encoded with the policy's
   tokenizer, its chat template and the generation prompt (``encode_prompt``). A prompt longer than
   ``max_prompt_tokens`` is an error (``truncation="error"``, verl's default) or keeps its *last*
   ``max_prompt_tokens`` tokens (``truncation="left"``: the generation prompt, current observation and admissible
   actions sit at the end; the system prompt and the oldest text are cut). Under ``"error"`` a prompt that is too
   long only with its history records shows fewer of them, the oldest dropped first (what the model wrote never
   stops the run; :func:`turn_prompt`). Truncations are counted in the stats.
2. *One* ``policy.generate`` call for all live rows, the batch padded with dummy rows (a copy of the first prompt,
   one new token) to a multiple of ``batch_bucket`` (or a power of two, ``pow2_batches``) so that a run compiles
   a bounded number of programs. The
   key of turn ``t`` is ``fold_in(key, t)``: the same key and tasks give the same batch. With ``row_keys`` each
   slot ``s`` samples from its own stream ``fold_in(fold_in(key, t), s)``, so an episode's draws do not depend
   on which other episodes are still running (common random numbers: two policies evaluated with one key see
   the same uniforms in the same episode and turn). With ``constrained``,
   every row may only emit ``constrained_format.format(action=a)`` for an admissible action ``a`` of its
   observation, then a stop token (a trie over the tokenisations; rows whose env has no admissible list are
   free); the reply is then projected without the ``<think>`` requirement.
3. *Projection* of every reply onto an action string (:data:`PROJECTORS`, per env). The action is sent to the
   env even when the projection fails (verl-agent: the env answers "Nothing happens" / leaves the state as it
   is); a turn is **valid** iff the projection is valid *and* the env reports ``info["valid"]``.
4. *Step* the pool with the live slots' actions. A slot whose episode ends (done, or the collector's cap
   ``max_steps``) drops out; the next turn batches the remaining ones only, so short episodes never stall long
   ones and finished rows cost nothing.

Per-row fields (METHODS.md notation; DESIGN.md "Core data"):

- ``reward = base - invalid_penalty * (not valid)`` with ``base`` = ``success_reward * won`` on the winning
  (last) step (``reward="success"``, METHODS.md's convention; ALFWorld's own reward is the same 10·won) or the
  env's own reward (``reward="env"``; Sokoban's shaped ``-0.1`` per move, ``+1`` on target, ``+10`` finished).
- ``response_tokens`` / ``response_mask``: every generated token, the stop token included (the policy must learn
  to stop); a reply cut at ``max_new_tokens`` has no stop token. ``prompt_tokens`` are left-padded to
  ``max_prompt_tokens``, the responses right-padded to ``sampling.max_new_tokens``.
- ``behaviour_logp``: ``log softmax(logits / τ)`` at each generated token, **without** the constraint mask
  (the sampler's ``logp_unmasked``), 0 outside the mask. This is the quantity the trainer recomputes with the
  current parameters (a plain forward pass over the full vocabulary), so the importance ratio is 1 at the first
  epoch (up to the numerical difference between cached decoding and a teacher-forced forward pass).
  Unconstrained, masked and unmasked are equal. ``masked_logp=True`` (needs ``constrained``) stores the
  renormalised log-prob of the constrained sampling distribution instead, and ``allowed_tokens`` ``[B, Lr, A]``
  (``A = max_allowed``): at each response position the tokens the trie allowed there (the next tokens of the
  admissible replies that agree with the prefix, plus the stop ids where a reply is complete), so the trainer
  renormalises its own log-probs over the same choices (:func:`agentjax.train.update.forward_rows`). Then a
  forced token has probability 1 and no gradient, and the policy is trained on the distribution it samples
  from; without it a constrained tiny policy's updates spread probability over the whole vocabulary (AdamW
  moves every unembedding row, however small its gradient), which the constrained sampler never sees.
- ``done = terminated | truncated`` on an episode's last row; ``terminated``: the env ended the episode
  (success or failure state), ``truncated``: the env's step limit or the collector's ``max_steps``;
  ``won``: the env's ``info["won"]`` on the last row only.
- ``anchor`` / ``next_anchor``: group-local dense ids (:func:`~agentjax.rollout.group_local_ids`) of
  ``Obs.anchor`` before / after the step, in one id space per group (``next_anchor`` of a last step is the final
  observation's anchor). ``action``: group-local id of the executed (projected) action string; two invalid
  replies that project to different strings are different actions.
- ``group`` = task position in ``tasks`` (``[0, len(tasks))``), ``task`` = ``task_indices[group]`` (default the
  same), ``rollout`` in ``[0, G)``, ``step`` in ``[0, T)``; ``node, parent, depth = NO_ID, NO_ID, 0``. Rows are
  ordered by (group, rollout, step) and padded to ``capacity`` (default: rounded up to ``row_bucket``).

With ``sample_seeds`` each slot's task carries its episode's own ``meta["sample_seed"]``, drawn from ``key`` and the
slot (:func:`with_sample_seeds`), for environments with random transitions (envs/mdp's slips): one stream per
episode, a function of the batch's key.

With ``snapshots`` every turn also keeps the env's snapshot of the state the policy read (``Turn.snapshot``), taken
before its action; SERO restores its roots from them (:mod:`agentjax.rollout.oracle`).

A worker crash or an env exception (``info["worker_crash"]`` / ``info["error"]``, envs/pool.py) ends that episode
as truncated; the turn is not charged the invalid penalty (the env never judged it) and the stats count it.

Deviations from verl-agent (``agent_system/multi_turn_rollout``): the invalid penalty uses the env's verdict as
well as the projection's (verl-agent: the projection's only); the reward is METHODS.md's ``10·won`` unless
``reward="env"``; constrained decoding has no counterpart there; only ``"error"`` and ``"left"`` prompt truncation.
"""

from __future__ import annotations

import dataclasses
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import jax
import numpy as np

from agentjax.agents.compact import PROMPT_STYLES, templates
from agentjax.agents.projection import (
    INVALID_PENALTY,
    Projected,
    project_action,
    project_mdp,
    project_sokoban,
    project_textcraft,
    project_webshop,
)
from agentjax.agents.prompts import PromptTemplate, build_messages, encode_prompt
from agentjax.rollout.batch import NO_ID, StepBatch
from agentjax.rollout.calls import ReplyTokens, encode_messages, generate_batch, tokenizer_of
from agentjax.rollout.ids import group_local_ids
from agentjax.rollout.policy import CHAT_STOP_IDS, Policy, SampleOutput, SamplingParams, Tokenizer, constrained_choices
from agentjax.rollout.records import Episode, Rollouts, Turn
from agentjax.rollout.stats import RolloutStats, summarize
from envs.base import Obs, Task
from envs.pool import group_tasks

Projector = Callable[..., Projected]  # (reply, admissible, *, require_think) -> Projected

# Environment name -> projection of a reply onto its action (read-only; pass ``projector=`` for other envs).
PROJECTORS: Mapping[str, Projector] = types.MappingProxyType({
    "alfworld": project_action,
    "textworld": project_action,
    "textworld_sync": project_action,
    "sokoban": project_sokoban,
    "webshop": project_webshop,
    "textcraft": project_textcraft,
    "textcraft_synth": project_textcraft,
    "mdp": project_mdp,
})
SAMPLE_SEED_SALT = 0x5A3D_5EED  # sample seeds: fold_in(fold_in(key, SALT), slot), apart from the turn keys (t < cap)


@runtime_checkable
class Pool(Protocol):
    """What the collector needs of an env pool (:class:`envs.pool.EnvPool`, :class:`envs.pool.SerialPool`)."""

    num_slots: int

    def reset(self, tasks: Any) -> Any: ...

    def step(self, actions: Any) -> Any: ...


@dataclasses.dataclass(frozen=True)
class CollectConfig:
    """How to collect (module docstring). Presets: :meth:`alfworld`, :meth:`webshop`, :meth:`sokoban`."""

    group_size: int = 8  # G rollouts per task, from the same reset state
    max_steps: int = 50  # the collector's cap on turns per episode (the env's own limit applies as well)
    history_length: int = 2  # (observation, action) records shown in the prompt (METHODS.md: 2)
    prompt: Literal["verl-agent", "compact"] = "verl-agent"  # the template set (agentjax.agents.compact)
    row_keys: bool = False  # one sampling stream per slot and turn (common random numbers; evaluation uses it)
    sampling: SamplingParams = SamplingParams(temperature=1.0, max_new_tokens=512, stop_token_ids=CHAT_STOP_IDS,
                                              prompt_bucket=256)  # max_new_tokens is the response capacity Lr
    max_prompt_tokens: int = 2048  # the prompt capacity Lp of the StepBatch
    truncation: Literal["error", "left"] = "error"  # what to do with a longer prompt
    constrained: bool = False  # decode only admissible actions (tiny, untrained policies)
    constrained_format: str = "<action>{action}</action>"  # the reply a constrained row emits for action a
    require_think: bool = True  # unconstrained replies must hold a <think> </think> block to be valid
    invalid_penalty: float = INVALID_PENALTY  # subtracted from the reward of an invalid turn
    reward: Literal["success", "env"] = "success"  # success_reward * won on the last step, or the env's reward
    success_reward: float = 10.0  # METHODS.md: 10 * R_i
    masked_logp: bool = False  # store the constrained log-probs as behaviour_logp, and allowed_tokens
    sparse_logits: bool = False  # sample from the allowed tokens' logits only (needs masked_logp; Sampler sparse=)
    dense_draws: bool = False  # flat collector: sparse decoding with the dense draws, the same samples (Sampler)
    max_allowed: int = 16  # A: allowed-token slots per response position with masked_logp
    batch_bucket: int = 8  # the policy batch is padded to a multiple of this ...
    pow2_batches: bool = False  # ... or to a power of two >= batch_bucket (log-many batch shapes to compile)
    row_bucket: int = 64  # the StepBatch capacity is rounded up to a multiple of this ...
    capacity: int | None = None  # ... unless a fixed capacity is given (then more rows are an error)
    max_trie_edges: int = 1024  # trie edge capacity for constrained decoding (rounded to a power of two)
    snapshots: bool = False  # record each turn's env snapshot before its action (SERO's roots restore them)
    sample_seeds: bool = False  # each episode's task carries meta["sample_seed"] from (key, slot) (stochastic envs)

    def __post_init__(self):
        positive = dict(group_size=self.group_size, max_steps=self.max_steps, max_prompt_tokens=self.max_prompt_tokens,
                        batch_bucket=self.batch_bucket, row_bucket=self.row_bucket, max_trie_edges=self.max_trie_edges)
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"CollectConfig.{name} must be >= 1, got {value}")
        if self.history_length < 0:
            raise ValueError(f"CollectConfig.history_length must be >= 0, got {self.history_length}")
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"CollectConfig.capacity must be >= 1 or None, got {self.capacity}")
        if self.prompt not in PROMPT_STYLES:
            raise ValueError(f"CollectConfig.prompt must be one of {PROMPT_STYLES}, got {self.prompt!r}")
        if self.truncation not in ("error", "left"):
            raise ValueError(f"CollectConfig.truncation must be 'error' or 'left', got {self.truncation!r}")
        if self.reward not in ("success", "env"):
            raise ValueError(f"CollectConfig.reward must be 'success' or 'env', got {self.reward!r}")
        if self.invalid_penalty < 0:
            raise ValueError(f"CollectConfig.invalid_penalty must be >= 0 (it is subtracted), got "
                             f"{self.invalid_penalty}")
        if self.constrained and not self.sampling.stop_token_ids:
            raise ValueError("CollectConfig.constrained needs sampling.stop_token_ids: a constrained reply ends with "
                             "a stop token, e.g. SamplingParams(stop_token_ids=CHAT_STOP_IDS)")
        if self.masked_logp and not self.constrained:
            raise ValueError("CollectConfig.masked_logp trains on the constrained decoder's distribution; it needs "
                             "constrained=True")
        if self.dense_draws and not self.sparse_logits:
            raise ValueError("CollectConfig.dense_draws gives sparse decoding the dense path's draws; it needs "
                             "sparse_logits=True")
        if self.sparse_logits and not self.masked_logp:
            raise ValueError("CollectConfig.sparse_logits computes only the allowed tokens' logits, so there are no "
                             "unmasked log-probs to train on; it needs masked_logp=True")
        if self.max_allowed < 1:
            raise ValueError(f"CollectConfig.max_allowed must be >= 1, got {self.max_allowed}")
        if "{action}" not in self.constrained_format:
            raise ValueError(f"CollectConfig.constrained_format must contain '{{action}}', got "
                             f"{self.constrained_format!r}")

    @property
    def max_response_tokens(self) -> int:
        return self.sampling.max_new_tokens

    def replace(self, **changes: Any) -> CollectConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def alfworld(cls, **kw: Any) -> CollectConfig:
        """ALFWorld (verl-agent / CRBC): 50 steps, 2 history records, 2048 prompt and 512 response tokens."""
        return cls(**(dict(max_steps=50, max_prompt_tokens=2048) | kw))

    @classmethod
    def webshop(cls, **kw: Any) -> CollectConfig:
        """WebShop: 15 steps, 4096 prompt tokens (long result pages), 512 response tokens."""
        return cls(**(dict(max_steps=15, max_prompt_tokens=4096) | kw))

    @classmethod
    def sokoban(cls, **kw: Any) -> CollectConfig:
        """Sokoban 6×6: 15 steps, 1024 prompt tokens, success reward (METHODS.md; ``reward="env"`` for RAGEN's)."""
        return cls(**(dict(max_steps=15, max_prompt_tokens=1024) | kw))


# ------------------------------------------------------------------------------------------------ the loop


def _lookup(table: Mapping[str, Any], env: str, what: str, arg: str) -> Any:
    if env not in table:
        raise ValueError(f"collect: no {what} for env {env!r} (known: {sorted(table)}); pass {arg}=")
    return table[env]


def turn_prompt(tokenizer: Tokenizer, template: PromptTemplate, obs: Obs, history: Sequence[tuple[str, str]], step: int,
                config: CollectConfig, where: str) -> tuple[list[int], bool]:
    """The prompt ids of one turn exactly as the collector builds them (template, the last ``history_length``
    records, chat encoding, truncation) and whether it was cut; SERO rebuilds its oracle steps' prompts with it.

    With ``truncation="error"``, a prompt that is too long only with its history records (past observations and
    the actions the model wrote: a malformed reply's action can be :data:`~agentjax.agents.MAX_ACTION_BYTES` long)
    shows fewer of them, the oldest dropped first, and counts as cut; only a prompt too long without any record is
    the error."""
    records, full = list(history), min(step, config.history_length)
    shown = full
    while True:
        messages = build_messages(template, obs, records, step, shown)
        if config.truncation != "error" or shown == 0:
            ids, cut = encode_messages(tokenizer, messages, max_prompt_tokens=config.max_prompt_tokens,
                                       truncation=config.truncation, where=where)
            return ids, cut or shown < full
        ids = encode_prompt(tokenizer, messages)
        if len(ids) <= config.max_prompt_tokens:
            return ids, shown < full
        shown -= 1


def sample_seeds(key: jax.Array, num_slots: int, offset: int = 0) -> list[int]:
    """``[num_slots]`` the sample seed of each slot's episode in a batch collected with ``key``: the two words of
    ``fold_in(fold_in(key, SAMPLE_SEED_SALT), slot)`` as one 64-bit integer (``CollectConfig.sample_seeds``), for the
    slots ``offset, offset + 1, ...`` of the batch."""
    base = jax.random.fold_in(key, SAMPLE_SEED_SALT)
    slots = np.arange(offset, offset + num_slots, dtype=np.uint32)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(base, slots)
    words = np.asarray(jax.random.key_data(keys), np.uint64).reshape(num_slots, -1)
    return [int(w[0]) << 32 | int(w[-1]) for w in words]


def with_sample_seeds(slot_tasks: Sequence[Task], key: jax.Array, offset: int = 0) -> list[Task]:
    """The slots' tasks, each with its episode's own ``meta["sample_seed"]`` (:func:`sample_seeds`): an env whose
    transitions are random (envs/mdp's slips) seeds each episode's draws from it, so the rollouts of a group draw
    independently and a batch's draws are a function of its key (runs and resumed runs repeat them; evaluation,
    whose key is fixed, sees the same draws in the same episode at every eval point)."""
    seeds = sample_seeds(key, len(slot_tasks), offset)
    return [dataclasses.replace(t, meta={**t.meta, "sample_seed": s}) for t, s in zip(slot_tasks, seeds, strict=True)]


def _make_turn(step: int, obs: Obs, prompt: list[int], prompt_truncated: bool, out: SampleOutput, row: int,
               projected: Projected, result: Any, config: CollectConfig,
               replies: list[list[int]] | None = None, snapshot: Any = None) -> Turn:
    """The record of one row of a turn: validity, reward and episode flags (module docstring)."""
    info = dict(result.info)
    crashed = "worker_crash" in info or "error" in info  # envs/pool.py: the env never judged the action
    env_valid = bool(info.get("valid", True))
    valid = projected.valid and (env_valid or crashed)
    won = bool(result.done and info.get("won", False))
    env_truncated = bool(info.get("truncated", False))
    capped = not result.done and step + 1 >= config.max_steps
    penalty = 0.0 if valid or crashed else config.invalid_penalty
    base = float(result.reward) if config.reward == "env" else (config.success_reward if won else 0.0)
    n = int(out.length_b[row])
    allowed_ids = None
    if config.masked_logp:
        if not replies:
            raise ValueError(f"collect: masked_logp needs admissible actions on every turn, but the observation of "
                             f"step {step} has none ({obs.instruction[:60]!r}...); use an env with an admissible "
                             "list (e.g. TextCraft(admissible=True)) or masked_logp=False")
        allowed_ids = constrained_choices(replies, config.sampling.stop_token_ids, out.tokens_bt[row, :n].tolist())
    return Turn(
        step=step, obs=obs, prompt_ids=np.asarray(prompt, np.int32), prompt_truncated=prompt_truncated,
        response_ids=out.tokens_bt[row, :n].astype(np.int32), logp=out.logp_unmasked_bt[row, :n].astype(np.float32),
        logp_masked=out.logp_bt[row, :n].astype(np.float32), finish=int(out.finish_b[row]), reply=out.texts[row],
        projected=projected, next_obs=result.obs, env_reward=float(result.reward), reward=base - penalty,
        valid=valid, env_valid=env_valid, won=won, terminated=bool(result.done and not (env_truncated or crashed)),
        truncated=bool(env_truncated or crashed or capped), crashed=crashed, info=info, allowed_ids=allowed_ids,
        snapshot=snapshot,
    )


def run_episodes(
    pool: Pool,
    tasks: Sequence[Task],
    policy: Policy,
    config: CollectConfig,
    key: jax.Array,
    *,
    template: PromptTemplate | None = None,
    projector: Projector | None = None,
    task_indices: Sequence[int] | None = None,
    slot_offset: int = 0,
) -> Rollouts:
    """The env ⇄ policy loop of :func:`collect` (module docstring), returning host records.

    Args:
      pool: an :class:`envs.pool.EnvPool` / :class:`envs.pool.SerialPool` with at least ``len(tasks) * G`` slots
        (the first ``len(tasks) * G`` are used, the rest stay idle); it is reset here.
      tasks: the tasks of the batch, one group each.
      policy: a policy of :mod:`agentjax.rollout.policy` (``generate`` and ``tokenizer``; e.g.
        :class:`~agentjax.models.Sampler`).
      config: :class:`CollectConfig`.
      key: PRNG key; turn ``t`` samples with ``fold_in(key, t)``.
      template: the prompt template for every task (default: ``config.prompt``'s template of ``task.env``).
      projector: the reply projection for every task (default ``PROJECTORS[task.env]``), called as
        ``projector(reply, admissible, require_think=...)``.
      task_indices: the StepBatch ``task`` id of each task (e.g. its index in the split's manifest); default
        its position in ``tasks``.
      slot_offset: the batch slot of this call's first slot, where a batch is played in parts (one per process,
        :mod:`agentjax.parallel.multihost`): slot ``s`` of the call draws its sampling stream (``row_keys``) and
        sample seed as slot ``slot_offset + s`` of the whole batch, so an episode's draws do not depend on the
        part that plays it. Groups, rollouts and steps stay numbered within the call.
    """
    t_start = time.perf_counter()
    if not tasks:
        raise ValueError("collect: no tasks")
    tokenizer = tokenizer_of(policy)
    g_size = config.group_size
    n = len(tasks) * g_size
    if pool.num_slots < n:
        raise ValueError(f"collect: {len(tasks)} tasks x group_size {g_size} need {n} env slots, the pool has "
                         f"{pool.num_slots}; build the pool with num_slots >= {n} or pass fewer tasks")
    task_index = list(range(len(tasks))) if task_indices is None else [int(i) for i in task_indices]
    if len(task_index) != len(tasks):
        raise ValueError(f"collect: {len(task_index)} task_indices for {len(tasks)} tasks")
    table = templates(config.prompt)
    templates_ = [template or _lookup(table, t.env, "prompt template", "template") for t in tasks]
    projectors = [projector or _lookup(PROJECTORS, t.env, "projector", "projector") for t in tasks]
    require_think = config.require_think and not config.constrained
    prompt_s = generate_s = env_s = 0.0

    t0 = time.perf_counter()
    slot_tasks = group_tasks(tasks, g_size)
    if config.sample_seeds:
        slot_tasks = with_sample_seeds(slot_tasks, key, slot_offset)
    obs: list[Obs] = list(pool.reset(slot_tasks + [None] * (pool.num_slots - n)))[:n]
    env_s += time.perf_counter() - t0
    history: list[list[tuple[str, str]]] = [[] for _ in range(n)]
    turns: list[list[Turn]] = [[] for _ in range(n)]
    live = list(range(n))
    live_per_call, padded_per_call = [], []
    reply_tokens = ReplyTokens(tokenizer)

    for step in range(config.max_steps):
        if not live:
            break
        # 1. prompts
        t0 = time.perf_counter()
        prompts, truncated = [], []
        for slot in live:
            g = slot // g_size
            ids, cut = turn_prompt(tokenizer, templates_[g], obs[slot], history[slot], step, config,
                                   f"slot {slot} (task {tasks[g].task_id!r}, step {step})")
            prompts.append(ids)
            truncated.append(cut)
        allowed = None
        if config.constrained:
            allowed = reply_tokens.rows([[config.constrained_format.format(action=a) for a in obs[s].admissible or ()]
                                         for s in live], config.max_response_tokens)
        prompt_s += time.perf_counter() - t0

        # 2. one batched policy call; with row_keys slot s samples at turn t from fold_in(fold_in(key, t), s),
        # whoever else is still playing
        t0 = time.perf_counter()
        out, pad = generate_batch(policy, prompts, config.sampling, jax.random.fold_in(key, step),
                                  bucket=config.batch_bucket, pow2=config.pow2_batches, allowed=allowed,
                                  max_trie_edges=config.max_trie_edges, sparse=config.sparse_logits,
                                  dense_draws=config.dense_draws,
                                  row_ids=[slot_offset + s for s in live] if config.row_keys else None,
                                  pad_row_id=slot_offset + n)
        generate_s += time.perf_counter() - t0
        live_per_call.append(len(live))
        padded_per_call.append(len(live) + pad)

        snaps = [None] * len(live)
        if config.snapshots:  # the state the policy just read, before its action (a failed snapshot: the error)
            t0 = time.perf_counter()
            snaps = pool.snapshot(live, strict=False)
            env_s += time.perf_counter() - t0
        # 3. projection, 4. step
        projected = []
        actions: list[str | None] = [None] * pool.num_slots
        for i, slot in enumerate(live):
            p = projectors[slot // g_size](out.texts[i], obs[slot].admissible, require_think=require_think)
            projected.append(p)
            actions[slot] = p.action
        t0 = time.perf_counter()
        results = pool.step(actions)
        env_s += time.perf_counter() - t0

        still_live = []
        for i, slot in enumerate(live):
            turn = _make_turn(step, obs[slot], prompts[i], truncated[i], out, i, projected[i], results[slot], config,
                              None if allowed is None else allowed[i], snaps[i])
            turns[slot].append(turn)
            history[slot].append((obs[slot].text, turn.projected.action))
            obs[slot] = turn.next_obs
            if not turn.done:
                still_live.append(slot)
        live = still_live

    episodes = tuple(
        Episode(task=tasks[slot // g_size], task_index=task_index[slot // g_size], group=slot // g_size,
                rollout=slot % g_size, turns=tuple(turns[slot]))
        for slot in range(n)
    )
    return Rollouts(episodes=episodes, num_groups=len(tasks), group_size=g_size,
                    live_per_call=tuple(live_per_call), padded_per_call=tuple(padded_per_call),
                    prompt_seconds=prompt_s, generate_seconds=generate_s, env_seconds=env_s,
                    total_seconds=time.perf_counter() - t_start)


# ------------------------------------------------------------------------------------------------ to arrays


def _capacity(num_rows: int, config: CollectConfig) -> int:
    if config.capacity is not None:
        if num_rows > config.capacity:
            raise ValueError(f"collect: {num_rows} turns do not fit CollectConfig.capacity={config.capacity}; raise "
                             "it (at most len(tasks) * group_size * max_steps rows) or set it to None")
        return config.capacity
    return max(1, -(-num_rows // config.row_bucket) * config.row_bucket)


def to_step_batch(rollouts: Rollouts, config: CollectConfig) -> StepBatch:
    """The turns of ``rollouts`` as one padded :class:`StepBatch` (field conventions: module docstring).

    Rows are ordered by (group, rollout, step); ``prompt_tokens`` is ``[capacity, max_prompt_tokens]``,
    ``response_tokens`` / ``behaviour_logp`` are ``[capacity, sampling.max_new_tokens]``.
    """
    lp, lr = config.max_prompt_tokens, config.max_response_tokens
    rows = [(ep, turn) for ep in rollouts.episodes for turn in ep.turns]
    n = len(rows)
    prompt = np.zeros((n, lp), np.int32)
    prompt_mask = np.zeros((n, lp), bool)
    response = np.zeros((n, lr), np.int32)
    response_mask = np.zeros((n, lr), bool)
    logp = np.zeros((n, lr), np.float32)
    for i, (_, turn) in enumerate(rows):
        k, m = len(turn.prompt_ids), len(turn.response_ids)
        if k > lp or m > lr:
            raise ValueError(f"to_step_batch: a turn has {k} prompt / {m} response tokens, more than the config's "
                             f"{lp} / {lr}; pack with the config the rollouts were collected with")
        prompt[i, lp - k:], prompt_mask[i, lp - k:] = turn.prompt_ids, True
        response[i, :m], response_mask[i, :m] = turn.response_ids, True
        logp[i, :m] = turn.logp_masked if config.masked_logp else turn.logp
    allowed = None
    if config.masked_logp:
        allowed = np.full((n, lr, config.max_allowed), NO_ID, np.int32)
        for i, (_, turn) in enumerate(rows):
            for j, choices in enumerate(turn.allowed_ids or ()):
                if len(choices) > config.max_allowed:
                    raise ValueError(f"to_step_batch: a response position had {len(choices)} allowed tokens, more "
                                     f"than CollectConfig.max_allowed={config.max_allowed}; raise it")
                allowed[i, j, : len(choices)] = choices
    group = np.array([ep.group for ep, _ in rows], np.int32)
    anchor_texts = [t.obs.anchor for _, t in rows] + [t.next_obs.anchor for _, t in rows]
    anchors = group_local_ids(anchor_texts, group.tolist() * 2)
    col = lambda f, dtype: np.array([f(ep, t) for ep, t in rows], dtype)  # noqa: E731
    fields = dict(
        prompt_tokens=prompt, prompt_mask=prompt_mask, response_tokens=response, response_mask=response_mask,
        behaviour_logp=logp,
        reward=col(lambda ep, t: t.reward, np.float32),
        done=col(lambda ep, t: t.done, bool),
        terminated=col(lambda ep, t: t.terminated, bool),
        truncated=col(lambda ep, t: t.truncated, bool),
        won=col(lambda ep, t: t.won, bool),
        valid=col(lambda ep, t: t.valid, bool),
        group=group,
        task=col(lambda ep, t: ep.task_index, np.int32),
        rollout=col(lambda ep, t: ep.rollout, np.int32),
        step=col(lambda ep, t: t.step, np.int32),
        anchor=anchors[:n],
        next_anchor=anchors[n:],
        action=group_local_ids([t.projected.action for _, t in rows], group.tolist()),
        depth=np.zeros(n, np.int32),
    )
    if allowed is not None:
        fields["allowed_tokens"] = allowed
    return StepBatch.from_rows(_capacity(n, config), lp, lr, **fields)


def collect(
    pool: Pool,
    tasks: Sequence[Task],
    policy: Policy,
    config: CollectConfig,
    key: jax.Array,
    *,
    template: PromptTemplate | None = None,
    projector: Projector | None = None,
    task_indices: Sequence[int] | None = None,
    slot_offset: int = 0,
) -> tuple[StepBatch, RolloutStats]:
    """``G = config.group_size`` rollouts of every task, as a :class:`StepBatch` and :class:`RolloutStats`.

    :func:`run_episodes` (arguments there), then :func:`to_step_batch` and :func:`summarize`. The batch holds
    ``len(tasks)`` groups of ``G`` rollouts of at most ``config.max_steps`` steps:
    ``to_groups(batch, num_groups=len(tasks), num_rollouts=G, max_steps=config.max_steps)``.
    Use :func:`run_episodes` directly to keep the host records (texts, actions, observations).
    """
    rollouts = run_episodes(pool, tasks, policy, config, key, template=template, projector=projector,
                            task_indices=task_indices, slot_offset=slot_offset)
    return to_step_batch(rollouts, config), summarize(rollouts)

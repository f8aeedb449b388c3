"""The collector's host records: a :class:`Turn` per policy turn, an :class:`Episode` per rollout, and the
:class:`Rollouts` of one :func:`agentjax.rollout.collect.run_episodes` call (texts, actions, observations)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentjax.agents.projection import Projected
from envs.base import Obs, Task


@dataclasses.dataclass(frozen=True)
class Turn:
    """One policy turn of one episode, as the collector saw it (host side)."""

    step: int  # actions taken before this turn
    obs: Obs  # the observation the policy read (its anchor is the turn's anchor)
    prompt_ids: np.ndarray  # [k] int32, the prompt given to the policy (after truncation)
    prompt_truncated: bool  # the prompt was cut to max_prompt_tokens
    response_ids: np.ndarray  # [n] int32 generated tokens, the stop token included when there is one
    logp: np.ndarray  # [n] float32 log-prob at τ without the constraint mask
    logp_masked: np.ndarray  # [n] float32 log-prob under the (constrained) sampling distribution
    finish: int  # a rollout.policy.Finish
    reply: str  # the decoded response (without the stop token)
    projected: Projected  # the action sent to the env, the projection's verdict and reason
    next_obs: Obs  # the observation after the step
    env_reward: float  # the env's own reward of the step
    reward: float  # the collector's reward (module docstring), penalty included
    valid: bool  # projection valid and env valid
    env_valid: bool  # the env's info["valid"]
    won: bool  # the env reported success on this step
    terminated: bool  # the episode ended in a terminal state on this step
    truncated: bool  # the episode was cut on this step (step limit, collector cap, crash)
    crashed: bool  # the pool reported a worker crash or an env exception
    info: Mapping[str, Any]  # the env's info dict
    allowed_ids: tuple[tuple[int, ...], ...] | None = None  # per response token, the constrained decoder's choices
    snapshot: Any = None  # the env's snapshot before the action (CollectConfig.snapshots), or the error taking it

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@dataclasses.dataclass(frozen=True)
class Episode:
    """The turns of one rollout (slot ``group * G + rollout``)."""

    task: Task
    task_index: int  # the StepBatch ``task`` id
    group: int
    rollout: int
    turns: tuple[Turn, ...]

    @property
    def length(self) -> int:
        return len(self.turns)

    @property
    def won(self) -> bool:
        return bool(self.turns) and self.turns[-1].won

    @property
    def episode_return(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(t.projected.action for t in self.turns)


@dataclasses.dataclass(frozen=True)
class Rollouts:
    """What :func:`run_episodes` returns: the episodes (group-major) and how the loop spent its time."""

    episodes: tuple[Episode, ...]  # episodes[g * G + r]
    num_groups: int
    group_size: int
    live_per_call: tuple[int, ...]  # real rows of each batched policy call (one call per turn)
    padded_per_call: tuple[int, ...]  # rows of each call after padding to batch_bucket
    prompt_seconds: float  # building and tokenising prompts (and tries)
    generate_seconds: float  # policy.generate
    env_seconds: float  # pool.reset + pool.step
    total_seconds: float


__all__ = ["Episode", "Rollouts", "Turn"]

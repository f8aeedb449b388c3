"""Episode statistics of a collection round: success, returns, invalid actions, lengths, tokens, time.

:func:`summarize` reads the host records of :func:`agentjax.rollout.collect.run_episodes`; every number is a plain
Python value, so :meth:`RolloutStats.as_dict` goes straight into a JSONL / TensorBoard logger. Rates are over
episodes (success, truncation, per task type) or over turns (invalid, length cut); a rate over nothing is 0.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

from agentjax.rollout.policy import Finish
from agentjax.rollout.records import Rollouts

NO_TASK_TYPE = "all"  # the key of tasks without ``meta["task_type"]`` in ``success_by_task_type``


@dataclasses.dataclass(frozen=True)
class RolloutStats:
    """What one call of ``collect`` did (module docstring)."""

    num_episodes: int  # len(tasks) * group_size
    num_groups: int  # len(tasks)
    success_rate: float  # share of episodes won
    success_by_task_type: Mapping[str, float]  # Task.meta["task_type"] -> success rate (NO_TASK_TYPE: none)
    mean_return: float  # sum of the collector's rewards (success / env reward minus penalties) per episode
    mean_env_return: float  # sum of the env's own rewards per episode
    invalid_rate: float  # share of turns that were invalid (projection or env)
    invalid_reasons: Mapping[str, int]  # invalid turns by projection reason; "env" when only the env refused
    mean_episode_length: float  # turns per episode
    truncation_rate: float  # share of episodes cut by a step limit (or a crash)
    mixed_group_rate: float  # share of groups with both a success and a failure (non-zero GRPO signal)
    num_turns: int  # policy turns = real StepBatch rows
    num_generate_calls: int  # batched policy calls (one per turn of the longest episode)
    num_padded_rows: int  # dummy rows added to fill the batch buckets
    num_prompt_tokens: int  # prompt tokens over all turns
    num_response_tokens: int  # generated tokens over all turns
    num_truncated_prompts: int  # prompts cut to max_prompt_tokens, or shown with fewer history records to fit
    num_length_cut_responses: int  # replies that hit max_new_tokens without a stop
    num_crashes: int  # episodes ended by a worker crash or an env exception
    prompt_seconds: float  # building / tokenising prompts
    generate_seconds: float  # the policy's generate calls
    env_seconds: float  # env resets and steps
    total_seconds: float  # the whole collection

    def as_dict(self, prefix: str = "rollout/") -> dict[str, float | int]:
        """Flat ``{name: number}``; mappings become ``<prefix>success/<task_type>`` and ``<prefix>invalid/<reason>``."""
        out: dict[str, float | int] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "success_by_task_type":
                out.update({f"{prefix}success/{k}": v for k, v in value.items()})
            elif field.name == "invalid_reasons":
                out.update({f"{prefix}invalid/{k}": v for k, v in value.items()})
            else:
                out[prefix + field.name] = value
        return out


def _rate(num: float | int, den: float | int) -> float:
    return float(num) / den if den else 0.0


def summarize(rollouts: Rollouts) -> RolloutStats:
    """:class:`RolloutStats` of the episodes and timings of ``rollouts``."""
    episodes = rollouts.episodes
    turns = [t for ep in episodes for t in ep.turns]
    by_type: dict[str, list[bool]] = collections.defaultdict(list)
    for ep in episodes:
        by_type[str(ep.task.meta.get("task_type", NO_TASK_TYPE))].append(ep.won)
    reasons: collections.Counter[str] = collections.Counter()
    for t in turns:
        if not t.valid:
            reasons[t.projected.reason if not t.projected.valid else "env"] += 1
    groups: dict[int, set[bool]] = collections.defaultdict(set)
    for ep in episodes:
        groups[ep.group].add(ep.won)
    n_ep = len(episodes)
    return RolloutStats(
        num_episodes=n_ep,
        num_groups=rollouts.num_groups,
        success_rate=_rate(sum(ep.won for ep in episodes), n_ep),
        success_by_task_type={k: _rate(sum(v), len(v)) for k, v in sorted(by_type.items())},
        mean_return=_rate(sum(ep.episode_return for ep in episodes), n_ep),
        mean_env_return=_rate(sum(t.env_reward for t in turns), n_ep),
        invalid_rate=_rate(sum(not t.valid for t in turns), len(turns)),
        invalid_reasons=dict(sorted(reasons.items())),
        mean_episode_length=_rate(len(turns), n_ep),
        truncation_rate=_rate(sum(bool(ep.turns) and ep.turns[-1].truncated for ep in episodes), n_ep),
        mixed_group_rate=_rate(sum(len(v) == 2 for v in groups.values()), len(groups)),
        num_turns=len(turns),
        num_generate_calls=len(rollouts.live_per_call),
        num_padded_rows=sum(rollouts.padded_per_call) - sum(rollouts.live_per_call),
        num_prompt_tokens=sum(len(t.prompt_ids) for t in turns),
        num_response_tokens=sum(len(t.response_ids) for t in turns),
        num_truncated_prompts=sum(t.prompt_truncated for t in turns),
        num_length_cut_responses=sum(t.finish == Finish.LENGTH for t in turns),
        num_crashes=sum(t.crashed for t in turns),
        prompt_seconds=rollouts.prompt_seconds,
        generate_seconds=rollouts.generate_seconds,
        env_seconds=rollouts.env_seconds,
        total_seconds=rollouts.total_seconds,
    )

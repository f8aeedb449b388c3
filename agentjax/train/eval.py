"""Evaluation on a fixed split: ``seeds`` sampled rollouts of each of the first N tasks, success mean ± std over seeds.

One :func:`agentjax.rollout.collect.run_episodes` call runs every task ``seeds`` times (group size = seeds, so
the rollouts of a task start from the same reset and differ only by their sampling randomness, drawn from
``key``); seed ``s`` is rollout ``s`` of every task. Success is averaged over the tasks of each seed and
reported as the mean and the (population) standard deviation over seeds, with the success rate per task type
(``Task.meta["task_type"]``), the mean return, invalid rate and episode length over all episodes.

Common random numbers. The loop evaluates every checkpoint of a run with the *same* key (:func:`eval_key` of the
run's seed), on the same tasks, and the eval collector samples each episode from its own stream
(``CollectConfig.row_keys``: slot and turn, not the batch's composition). Two evaluations of a run, or of two
runs with the same seed, then see the same uniforms in the same episode and turn, and their difference is the
policies' difference, not two sampling noises: :func:`paired_difference` reads it episode by episode. The key
never comes from the training PRNG stream: evaluating more or less often does not change the training numbers.

On several processes each plays its share of the tasks (:func:`agentjax.train.shares.play_episodes`: the same
episodes and draws as one process) and every process gets the whole evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from agentjax.rollout.collect import CollectConfig
from agentjax.rollout.stats import summarize
from agentjax.train.shares import play_episodes

EVAL_SALT = 0x5EED_E7A1


def eval_key(seed: int, step: int = 0) -> jax.Array:
    """The evaluation key of a run with ``seed`` (the loop uses ``step = 0`` at every eval point: common random
    numbers; another ``step`` gives an independent draw)."""
    return jax.random.fold_in(jax.random.key(seed ^ EVAL_SALT), step)


def evaluate(pool: Any, tasks: Sequence[Any], policy: Any, config: CollectConfig, key: jax.Array, *,
             task_indices: Sequence[int] | None = None) -> dict[str, float]:
    """Evaluate ``policy`` on ``tasks`` with ``config.group_size`` seeds (module docstring).

    Returns ``success_rate`` (mean over seeds), ``success_std`` (std over seeds), ``success_se`` (standard error
    of the mean over all episodes), ``success_seed<s>``, ``success/<task type>``, ``return_mean``,
    ``invalid_rate``, ``episode_length_mean``, ``episodes``, ``seconds`` and ``outcomes``: ``[tasks][seeds]``
    0/1 per episode (a list, for paired comparisons; not a scalar metric).
    """
    rollouts = play_episodes(pool, tasks, policy, config, key, task_indices=task_indices).merged
    stats = summarize(rollouts)
    won_ts = np.array([ep.won for ep in rollouts.episodes], np.float64).reshape(len(tasks), config.group_size)
    per_seed = won_ts.mean(0)
    n = won_ts.size
    out = {"success_rate": float(per_seed.mean()), "success_std": float(per_seed.std()),
           "success_se": float(won_ts.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
           **{f"success_seed{s}": float(v) for s, v in enumerate(per_seed)},
           **{f"success/{k}": v for k, v in stats.success_by_task_type.items()},
           "return_mean": stats.mean_return, "invalid_rate": stats.invalid_rate,
           "episode_length_mean": stats.mean_episode_length, "episodes": float(stats.num_episodes),
           "seconds": stats.total_seconds, "outcomes": won_ts.astype(int).tolist()}
    return out


def paired_difference(a: Any, b: Any) -> dict[str, float]:
    """Mean and standard error of ``a − b`` over paired episodes (two ``outcomes`` of the same tasks and keys,
    or any equal-shaped arrays of per-episode results): ``mean``, ``se`` (std of the differences / √n), ``n``,
    and ``z = mean / se``. Pairing removes the shared per-episode noise (which room, which draws)."""
    d = (np.asarray(a, np.float64) - np.asarray(b, np.float64)).ravel()
    if d.size == 0:
        raise ValueError("paired_difference: no episodes")
    se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("nan")
    mean = float(d.mean())
    return {"mean": mean, "se": se, "n": float(d.size), "z": mean / se if se and np.isfinite(se) else float("nan")}

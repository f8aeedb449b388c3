"""Multi-host SPMD training: which part of a batch each process plays, and how the parts come back together.

One process per host (:func:`~agentjax.parallel.mesh.initialize_distributed`); every process runs the same
program. Collection is host work (env pools, Python), so each process plays a *share* of the update's groups and
of the evaluation's tasks with its own env pool; the arrays then meet on the global mesh
(:mod:`agentjax.parallel.global_batch`), where credit and the update run as the same sharded program a single
process would run::

    groups [0, G)  --share-->  process p plays groups [start_p, stop_p)     (contiguous, balanced, p = 0 .. P-1)
    host records   --gather_objects-->  every process holds all P parts     (pickled, through a device all-gather)
    merge_rollouts                          one Rollouts, as one process would have collected it

Randomness does not depend on the split: the task stream is a function of (seed, data position) and is drawn
whole by every process; a group's sampling streams and sample seeds are drawn from the batch key and the group's
*global* env slots (``run_episodes(..., slot_offset=share.start * G)``; trees: ``tree_offset``). So 1 process × 8
devices and 2 processes × 4 devices play the same episodes with the same draws.

What is logged or written once (metrics lines, evaluation files, saved trees) is written by process 0
(:func:`is_main`, :func:`on_main`); every process holds the same merged records, so control flow never diverges.
With one process every function here is the identity (no communication).
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

from agentjax.rollout.records import Rollouts
from agentjax.rollout.tree_records import TreeRollouts

T = TypeVar("T")


# -- shares ------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Share:
    """Items ``[start, stop)`` of ``total`` (groups of an update, tasks of an evaluation): one process's part."""

    start: int
    stop: int
    total: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def indices(self) -> range:
        return range(self.start, self.stop)

    def take(self, items: Sequence[T]) -> list[T]:
        """This share's items of the whole sequence ``items`` (``len(items) == total``)."""
        if len(items) != self.total:
            raise ValueError(f"Share.take: {len(items)} items for a share of {self.total}")
        return list(items[self.start:self.stop])


def share(total: int, *, index: int | None = None, count: int | None = None) -> Share:
    """Process ``index``'s share of ``total`` items among ``count`` processes (default: this process of this job).

    Contiguous and balanced: process ``p`` gets ``[⌊p·total/count⌋, ⌊(p+1)·total/count⌋)``, a function of
    ``(total, index, count)`` only, so every process computes every share alike. With fewer items than processes
    some shares are empty (those processes collect nothing and still take part in every collective).
    """
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"share: process index {index} of {count} processes is out of range")
    if total < 0:
        raise ValueError(f"share: total must be >= 0, got {total}")
    return Share(start=index * total // count, stop=(index + 1) * total // count, total=total)


def shares(total: int, count: int | None = None) -> list[Share]:
    """Every process's :func:`share` of ``total`` items, in process order."""
    count = jax.process_count() if count is None else count
    return [share(total, index=p, count=count) for p in range(count)]


# -- process 0 writes ------------------------------------------------------------------------------------------------
def is_main() -> bool:
    """Whether this process writes what is written once (metrics, evaluation files): JAX process 0."""
    return jax.process_index() == 0


def on_main(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """``fn(*args, **kwargs)`` on process 0; None on the others."""
    return fn(*args, **kwargs) if is_main() else None


def barrier(name: str) -> None:
    """Wait until every process reached the barrier ``name`` (a no-op with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def local_key(key: jax.Array) -> jax.Array:
    """This process's own copy of a PRNG key that is replicated over a mesh spanning processes (the training
    state's stream): host work that draws from it (the collector, the sampler on this host's devices) must not mix
    it with arrays on this host alone. The key itself with one process."""
    if jax.process_count() == 1 or key.is_fully_addressable:
        return key
    return jax.random.wrap_key_data(np.asarray(jax.random.key_data(key)), impl=jax.random.key_impl(key))


# -- gathering host objects ------------------------------------------------------------------------------------------
def gather_objects(obj: Any) -> list[Any]:
    """Every process's ``obj``, in process order, on every process (``[obj]`` with one process).

    ``obj`` is pickled and the bytes travel through one device all-gather (``process_allgather``); every process
    must call this at the same point of the program. For host records (rollouts, evaluation outcomes, timings) —
    arrays that live on the mesh are gathered by the mesh.
    """
    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [pickle.loads(rows[p, :int(n)].tobytes()) for p, n in enumerate(sizes)]


def gather_ints(values: Sequence[int]) -> np.ndarray:
    """``[P, len(values)]`` int64: every process's ``values`` (the same length on every process), in process order."""
    local = np.asarray(values, np.int64).reshape(1, -1)
    if jax.process_count() == 1:
        return local
    if np.abs(local).max(initial=0) >= 2**31:
        raise ValueError(f"gather_ints: {local.tolist()} do not fit int32")
    return np.asarray(multihost_utils.process_allgather(local.astype(np.int32))).reshape(jax.process_count(), -1
                                                                                        ).astype(np.int64)


# -- merging the records of the processes ----------------------------------------------------------------------------
def _sum_per_call(parts: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Turn ``t``'s rows over all processes (a process whose episodes all ended before turn ``t`` adds 0)."""
    return tuple(sum(col) for col in itertools.zip_longest(*parts, fillvalue=0))


def merge_rollouts(parts: Sequence[Rollouts]) -> Rollouts:
    """The processes' :class:`Rollouts` (process order, each of its share's groups) as one collection.

    Episodes are concatenated with their group renumbered to the global position (the previous parts' groups
    first), so :func:`~agentjax.rollout.stats.summarize` of the result equals that of one process collecting every
    group with the same draws. Per turn, the rows of the policy calls add up (``live_per_call``,
    ``padded_per_call``: the number of calls is the longest share's, as for one process; the padding is what the
    processes padded, which differs from one process's). Seconds are the slowest process's: the processes collect
    at the same time and the update waits for the last.
    """
    if not parts:
        raise ValueError("merge_rollouts: no parts")
    group_size = {p.group_size for p in parts}
    if len(group_size) != 1:
        raise ValueError(f"merge_rollouts: the parts have different group sizes {sorted(group_size)}")
    episodes, offset = [], 0
    for part in parts:
        episodes += [dataclasses.replace(ep, group=ep.group + offset) for ep in part.episodes]
        offset += part.num_groups
    return dataclasses.replace(parts[0], episodes=tuple(episodes), num_groups=offset, group_size=group_size.pop(),
                               live_per_call=_sum_per_call([p.live_per_call for p in parts]),
                               padded_per_call=_sum_per_call([p.padded_per_call for p in parts]),
                               prompt_seconds=max(p.prompt_seconds for p in parts),
                               generate_seconds=max(p.generate_seconds for p in parts),
                               env_seconds=max(p.env_seconds for p in parts),
                               total_seconds=max(p.total_seconds for p in parts))


def merge_tree_rollouts(parts: Sequence[TreeRollouts]) -> TreeRollouts:
    """The processes' :class:`TreeRollouts` as one collection (as :func:`merge_rollouts`): trees concatenated with
    their group renumbered, fork and search groups pointing at the renumbered trees, the judges' counters summed
    (``judge/calls`` counts every process's calls: one a turn on each process that judged, where one process makes
    one call a turn). SERA's rubric counters hold a ratio (``grade/agreement``) that does not merge from the
    counters; such parts raise."""
    if not parts:
        raise ValueError("merge_tree_rollouts: no parts")
    if any(p.rubric_metrics for p in parts):
        raise ValueError("merge_tree_rollouts: the parts carry SERA's rubric counters, whose grade/agreement is a "
                         "ratio of counts they do not keep; merge rubric statistics per process, or train SERA on "
                         "one process")
    per_task = {p.trees_per_task for p in parts}
    if len(per_task) != 1:
        raise ValueError(f"merge_tree_rollouts: the parts have different trees per task {sorted(per_task)}")
    trees, forks, searches, groups = [], [], [], 0
    for part in parts:
        tree_offset = len(trees)
        trees += [dataclasses.replace(t, group=t.group + groups) for t in part.trees]
        forks += [dataclasses.replace(f, tree=f.tree + tree_offset) for f in part.forks]
        searches += list(part.searches)
        groups += part.num_groups
    judge: dict[str, float] = {}
    for part in parts:
        for k, v in part.judge_metrics.items():
            judge[k] = judge.get(k, 0.0) + v
    slowest = lambda name: max(getattr(p, name) for p in parts)  # noqa: E731
    return dataclasses.replace(parts[0], trees=tuple(trees), forks=tuple(forks), searches=tuple(searches),
                               searches_not_run=sum(p.searches_not_run for p in parts), num_groups=groups,
                               trees_per_task=per_task.pop(),
                               live_per_call=_sum_per_call([p.live_per_call for p in parts]),
                               padded_per_call=_sum_per_call([p.padded_per_call for p in parts]),
                               judge_metrics=judge, rubric_metrics={}, prompt_seconds=slowest("prompt_seconds"),
                               generate_seconds=slowest("generate_seconds"), env_seconds=slowest("env_seconds"),
                               judge_seconds=slowest("judge_seconds"), rubric_seconds=slowest("rubric_seconds"),
                               total_seconds=slowest("total_seconds"))


def portable(rollouts: Rollouts) -> Rollouts:
    """``rollouts`` without the env snapshots of its turns (SERO's roots: env state, possibly large, that only the
    process holding the env pool can restore), for :func:`gather_objects`."""
    return dataclasses.replace(rollouts, episodes=tuple(
        dataclasses.replace(ep, turns=tuple(dataclasses.replace(t, snapshot=None) for t in ep.turns))
        for ep in rollouts.episodes))


__all__ = ["Share", "barrier", "gather_ints", "gather_objects", "is_main", "local_key", "merge_rollouts",
           "merge_tree_rollouts", "on_main", "portable", "share", "shares"]

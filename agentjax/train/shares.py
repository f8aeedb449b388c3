"""Collection on several hosts: each process plays its share of a batch's groups (or of an evaluation's tasks), and
every process ends up with the whole batch's records and, for an update, its arrays on the mesh.

:func:`play_share` runs a collector (``play(tasks, task_indices, first_slot)``) on this process's
:func:`~agentjax.parallel.multihost.share` of the tasks, with the share's first batch slot so that every episode
draws what it would draw in one process's batch, then gathers every process's records and merges them in group
order. :func:`flat_batch` and :func:`tree_batch` turn the records into the update's batch: the process's own piece,
assembled on the mesh (:mod:`agentjax.parallel.global_batch`).

With one process the share is everything, nothing is exchanged, and the results are those of the collectors
themselves (the batch stays on the host, as the trainer has always passed it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import jax
from jax.sharding import Mesh

from agentjax.parallel.global_batch import global_step_batch, global_tree_batch
from agentjax.parallel.multihost import Share, gather_ints, gather_objects, merge_rollouts, portable, share
from agentjax.parallel.rules import ModelSharding, fsdp_tp
from agentjax.rollout.batch import StepBatch
from agentjax.rollout.collect import CollectConfig, run_episodes, to_step_batch
from agentjax.rollout.records import Rollouts
from agentjax.rollout.tree_batch import TreeBatch
from agentjax.rollout.tree_collect import TreeCollectConfig
from agentjax.rollout.tree_records import TreeRollouts, to_tree_batch
from agentjax.train.advantages import check_batch_fits
from agentjax.train.config import RolloutConfig, SERACredit
from agentjax.train.runconfig import RunConfig
from envs.mdp import MDPEnv

R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class Played(Generic[R]):
    """What :func:`play_share` returns."""

    share: Share  # this process's tasks
    local: R | None  # this process's records (its share's groups numbered from 0); None for an empty share
    merged: R  # every process's records in group order (on several processes: without env snapshots)


def play_share(play: Callable[[list, list[int], int], R], tasks: Sequence[Any], task_indices: Sequence[int], *,
               slots_per_task: int, merge: Callable[[list[R]], R], portable_form: Callable[[R], R] = lambda r: r,
               allow_empty: bool = True) -> Played[R]:
    """Play this process's share of ``tasks`` with ``play(share's tasks, their task indices, first slot)`` (the
    first slot is the share's first task times ``slots_per_task``: the collector's ``slot_offset`` /
    ``tree_offset``), then gather every process's records (``portable_form`` of them) and ``merge`` them.

    ``allow_empty=False`` (training batches) raises when a process would get no task."""
    mine = share(len(tasks))
    if not allow_empty and jax.process_count() > len(tasks):
        raise ValueError(f"a batch of {len(tasks)} groups cannot give each of {jax.process_count()} processes a "
                         "group; use at least as many groups per batch (train.rollout.num_groups) as processes")
    local = play(mine.take(list(tasks)), mine.take(list(task_indices)), mine.start * slots_per_task) \
        if mine.size else None
    if jax.process_count() == 1:
        return Played(mine, local, local)
    parts = gather_objects(None if local is None else portable_form(local))
    return Played(mine, local, merge([p for p in parts if p is not None]))


def play_episodes(pool: Any, tasks: Sequence[Any], policy: Any, config: CollectConfig, key: jax.Array, *,
                  task_indices: Sequence[int] | None = None, allow_empty: bool = True) -> Played[Rollouts]:
    """:func:`play_share` of the flat collector: ``run_episodes(pool, tasks, policy, config, key, task_indices=,
    slot_offset=)`` on this process's groups."""
    indices = range(len(tasks)) if task_indices is None else task_indices
    return play_share(lambda t, i, first: run_episodes(pool, t, policy, config, key, task_indices=i,
                                                       slot_offset=first),
                      tasks, indices, slots_per_task=config.group_size, merge=merge_rollouts,
                      portable_form=portable, allow_empty=allow_empty)


def flat_batch(played: Played[Rollouts], config: CollectConfig, rollout: RolloutConfig, mesh: Mesh | None,
               rules: ModelSharding | None = None) -> StepBatch:
    """The update's :class:`StepBatch` of a flat collection: with one process ``to_step_batch`` of the records; on
    several, this process's piece (checked by :func:`~agentjax.train.advantages.check_batch_fits`, so credit runs
    with ``check=False``) assembled on ``mesh`` in the single-process layout. Without a fixed
    ``config.capacity`` the global capacity comes from every process's rows (``row_bucket``)."""
    if jax.process_count() == 1:
        return to_step_batch(played.local, config)
    if mesh is None:
        raise ValueError("training on several processes needs a mesh over their devices (RunConfig.mesh)")
    if config.capacity is None:
        rows = int(gather_ints([sum(len(ep.turns) for ep in played.local.episodes)]).sum())
        config = config.replace(capacity=max(1, -(-rows // config.row_bucket) * config.row_bucket))
    piece = to_step_batch(played.local, config)
    check_batch_fits(piece, rollout)
    return global_step_batch(piece, played.share, mesh, rules or fsdp_tp())


def tree_batch(played: Played[TreeRollouts], config: TreeCollectConfig, mesh: Mesh | None,
               rules: ModelSharding | None = None) -> TreeBatch:
    """The update's :class:`TreeBatch` (``config.capacity`` set by the caller from the merged records' rows): with
    one process ``to_tree_batch`` of the records; on several, this process's whole trees assembled on ``mesh``."""
    if jax.process_count() == 1:
        return to_tree_batch(played.local, config)
    if mesh is None:
        raise ValueError("training on several processes needs a mesh over their devices (RunConfig.mesh)")
    if config.capacity is None:
        raise ValueError("tree_batch on several processes: give the batch's capacity (config.capacity)")
    return global_tree_batch(to_tree_batch(played.local, config), played.share, mesh, rules or fsdp_tp())


def check_processes(run: RunConfig) -> None:
    """Raise, naming the fix, where ``run`` cannot train on this job's processes (nothing to check for one): a mesh
    over every process's devices with the tensor-parallel axis within a host, at least one group per process, and
    none of the parts that read host records across processes (SERO's oracle branch restores env snapshots of the
    process that played the root; SERA's rubric counters and fork trees; the exact probe of ``--env mdp``)."""
    count = jax.process_count()
    if count == 1:
        return
    why = None
    if run.mesh is None:
        why = "needs a mesh over every process's devices: set RunConfig.mesh (--mesh FSDP TP, FSDP x TP = all devices)"
    elif run.mesh[1] > jax.local_device_count():
        why = (f"keeps the tensor-parallel axis within a host: tp={run.mesh[1]} is more than this host's "
               f"{jax.local_device_count()} devices; move the rest to fsdp")
    elif run.train.rollout.num_groups < count:
        why = (f"gives each process at least one group: {run.train.rollout.num_groups} groups for {count} processes; "
               "raise --num-groups")
    elif run.train.sero is not None:
        why = "does not run SERO's oracle branch (it restores env snapshots of the process that played the root)"
    elif isinstance(run.train.credit, SERACredit):
        why = "does not train SERA (its rubric counters and fork trees are per process); RAO trains"
    elif run.tree is None and issubclass(run.spec.env_class(), MDPEnv):
        why = "does not run the mdp env's exact probe; train the credit testbed on one process"
    if why is not None:
        raise ValueError(f"training on {count} processes {why}")


__all__ = ["Played", "check_processes", "flat_batch", "play_episodes", "play_share", "tree_batch"]

"""Global arrays from per-process pieces (the batch of a multi-host update), and per-process copies for sampling.

**Rows.** Each process collects its share of the groups (:mod:`agentjax.parallel.multihost`) into a fixed-capacity
piece: its real rows first, then padding. :func:`global_rows` puts the pieces on the mesh and lays them out as
one process would have collected the whole batch — every process's real rows in process order (its groups are
contiguous, so this is group order), then padding rows::

    piece_p [L, ...] (host)  --make_array_from_process_local_data-->  staging [P·L, ...]   (process p: rows p·L ..)
    staging  --one jitted gather (idx: counts of real rows, all-gathered)-->  [capacity, ...] on the mesh

The gather is the only communication (an all-to-all inside XLA); the result is sharded like any batch
(``row_spec``, e.g. the rules' ``P("fsdp")`` on the rows), so credit and the update run on it exactly as on a
single process's batch. :func:`global_step_batch` and :func:`global_tree_batch` renumber the groups (and trees) of
a piece to their global positions first.

**Sampling copies.** The parameters are sharded over the whole mesh, across hosts, but each process samples its
own prompts. :func:`host_local_params` all-gathers them over ``fsdp`` into the sampling layout (split over ``tp``
only) and hands each process the copy its own devices hold (``multihost_utils.global_array_to_host_local_array``,
on ``mesh.local_mesh``); :func:`host_local_model` builds the module whose activation constraints refer to that
local mesh. The tensor-parallel axis must then lie within a host (``jax.make_mesh`` puts the last axis on the most
local devices).

With one process, :func:`global_rows` places the rows on the mesh (the gather is the identity up to padding) and
the local mesh is the mesh.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from agentjax.models.qwen import Qwen
from agentjax.parallel.multihost import Share, gather_ints, shares
from agentjax.parallel.rules import ModelSharding, activation_sharding, fit_spec, param_shardings, sampling
from agentjax.rollout.batch import StepBatch
from agentjax.rollout.tree_batch import TreeBatch

T = TypeVar("T")
STAGING_AXES = ("process", "local")


# -- layout ------------------------------------------------------------------------------------------------------------
def process_devices(mesh: Mesh) -> np.ndarray:
    """``[P, D/P]``: the mesh's devices in its own (row-major) order, one row per process.

    Raises ``ValueError`` unless each process's devices are one contiguous run of that order and every process
    has as many: :func:`global_rows` stages process ``p``'s piece on row ``p``, in the device order of ``mesh``
    (one device assignment for the staging and the result).
    """
    flat = list(mesh.devices.flat)
    count = jax.process_count()
    if len(flat) % count:
        raise ValueError(f"the mesh's {len(flat)} devices do not split evenly over {count} processes")
    rows = np.array(flat, dtype=object).reshape(count, -1)
    for p, row in enumerate(rows):
        owners = {d.process_index for d in row}
        if owners != {p}:
            raise ValueError(f"devices {len(row) * p}..{len(row) * (p + 1) - 1} of the mesh belong to processes "
                             f"{sorted(owners)}, not to process {p} alone; build the mesh with make_mesh "
                             "(jax.make_mesh keeps each host's devices together)")
    return rows


def gather_index(counts: Sequence[int] | np.ndarray, length: int, capacity: int) -> np.ndarray:
    """``[capacity]`` int32: the staging row of each global row — process ``p``'s real row ``j`` (staged at
    ``p·length + j``) lands at ``Σ_{q<p} counts_q + j``; the rows after the last real one copy the first staging row
    that is padding (row ``counts_p`` of the first process with ``counts_p < length``).

    Raises ``ValueError`` when the real rows do not fit ``capacity``, a count exceeds ``length``, or padding is
    needed and no piece has a padding row.
    """
    counts = np.asarray(counts, np.int64).reshape(-1)
    total = int(counts.sum())
    if (counts < 0).any() or (counts > length).any():
        raise ValueError(f"global_rows: real-row counts {counts.tolist()} outside [0, {length}] (the piece length)")
    if total > capacity:
        raise ValueError(f"global_rows: {total} real rows over all processes ({counts.tolist()}) do not fit the "
                         f"global capacity {capacity}; raise the capacity")
    idx = np.concatenate([p * length + np.arange(n) for p, n in enumerate(counts)] + [np.zeros(0, np.int64)])
    if total < capacity:
        padded = np.nonzero(counts < length)[0]
        if not len(padded):
            raise ValueError(f"global_rows: the batch needs {capacity - total} padding rows but every piece is full; "
                             "build the pieces with a padding row (capacity above the real rows)")
        pad = padded[0] * length + counts[padded[0]]
        idx = np.concatenate([idx, np.full(capacity - total, pad)])
    return idx.astype(np.int32)


@functools.lru_cache(maxsize=64)
def _gather_fn(out_shardings: tuple[NamedSharding, ...]) -> Any:
    return jax.jit(lambda leaves, idx: [jnp.take(x, idx, axis=0) for x in leaves], out_shardings=list(out_shardings))


def _row_sharding(x: Any, capacity: int, mesh: Mesh, row_spec: P) -> NamedSharding:
    """A leaf's sharding on ``mesh``: ``row_spec`` on its leading (row) axis by the divisibility rule, the rest
    replicated."""
    shape = (capacity,) + tuple(np.shape(x))[1:]
    return NamedSharding(mesh, fit_spec(P(*row_spec[:1]), shape, mesh))


REPLICATED = P()


def global_rows(local: T, count: int, capacity: int, mesh: Mesh, row_spec: P = REPLICATED) -> T:
    """``[capacity, ...]`` arrays on ``mesh`` from every process's piece (module docstring).

    Args:
      local: this process's piece, a pytree of host (or single-device) arrays ``[L, ...]``, ``L`` the same on every
        process and for every leaf: real rows ``[0, count)``, padding after (padding rows alike on every process,
        e.g. the collector's).
      count: this process's real rows.
      capacity: the global rows (the same on every process).
      mesh: the mesh of the result (each process's devices contiguous in its order: :func:`process_devices`).
      row_spec: the sharding of the row axis (e.g. ``P("fsdp")``); a leaf whose rows the axis does not divide is
        replicated.

    Returns:
      The global arrays: every process's real rows in process order, then copies of a padding row.
    """
    leaves, treedef = jax.tree.flatten(local)
    lengths = {np.shape(x)[0] for x in leaves}
    if len(lengths) != 1:
        raise ValueError(f"global_rows: the piece's leaves have different row counts {sorted(lengths)}")
    length = lengths.pop()
    counts = gather_ints([count, length])
    if len(set(counts[:, 1].tolist())) != 1:
        raise ValueError(f"global_rows: the processes' pieces have different lengths {counts[:, 1].tolist()}; build "
                         "every piece with the same capacity")
    idx = gather_index(counts[:, 0], length, capacity)
    rows = process_devices(mesh)
    staging_mesh = Mesh(rows, STAGING_AXES)
    split = P(STAGING_AXES) if length % rows.shape[1] == 0 else P("process")  # over the local devices if they divide

    def stage(x):
        x = np.asarray(x)
        sharding = NamedSharding(staging_mesh, P(*split, *([None] * (x.ndim - 1))))
        return jax.make_array_from_process_local_data(sharding, x, (rows.shape[0] * length,) + x.shape[1:])

    out_shardings = tuple(_row_sharding(x, capacity, mesh, row_spec) for x in leaves)
    return jax.tree.unflatten(treedef, _gather_fn(out_shardings)([stage(x) for x in leaves], idx))


# -- batches -----------------------------------------------------------------------------------------------------------
def _real_rows(batch: StepBatch) -> int:
    """The real rows of a piece, which must come first (the collectors' layout)."""
    mask = np.asarray(batch.row_mask)
    count = int(mask.sum())
    if not mask[:count].all():
        raise ValueError("global_step_batch: the piece's real rows must come first (the collector's layout)")
    return count


def _regroup(batch: StepBatch, group_offset: int) -> StepBatch:
    """``batch`` with the group of every real row moved by ``group_offset`` (host arrays)."""
    mask = np.asarray(batch.row_mask)
    return batch.replace(group=jnp.asarray(np.where(mask, np.asarray(batch.group) + group_offset,
                                                    np.asarray(batch.group))))


def global_step_batch(batch: StepBatch, groups: Share, mesh: Mesh, rules: ModelSharding, *,
                      capacity: int | None = None) -> StepBatch:
    """The update's :class:`StepBatch` on ``mesh`` from this process's piece (its share ``groups`` of the groups,
    collected with groups numbered from 0 and the global capacity): the groups renumbered to their global
    positions, then :func:`global_rows` with the rows split like the rules' tokens (``rules.tokens_bl``).

    ``capacity`` defaults to the piece's; the result has every real row of every process in group order, as one
    process collecting every group would have laid them out.
    """
    capacity = batch.capacity if capacity is None else capacity
    return global_rows(_regroup(batch, groups.start), _real_rows(batch), capacity, mesh, P(*rules.tokens_bl[:1]))


def global_tree_batch(batch: TreeBatch, groups: Share, mesh: Mesh, rules: ModelSharding, *,
                      capacity: int | None = None) -> TreeBatch:
    """The update's :class:`TreeBatch` on ``mesh`` from this process's piece (whole trees: its share ``groups`` of
    the root tasks, ``K`` trees each): the rows as :func:`global_step_batch`, the tree arrays of every process's
    trees concatenated in group order (replicated: credit reads them whole), their groups renumbered."""
    k = batch.trees_per_task
    if batch.num_trees != groups.size * k:
        raise ValueError(f"global_tree_batch: the piece has {batch.num_trees} trees for {groups.size} groups x {k}")
    capacity = batch.steps.capacity if capacity is None else capacity
    count = _real_rows(batch.steps)
    steps, role = global_rows((_regroup(batch.steps, groups.start), np.asarray(batch.role)), count, capacity, mesh,
                              P(*rules.tokens_bl[:1]))
    trees = batch.trees.replace(group_t=jnp.asarray(np.asarray(batch.trees.group_t) + groups.start))
    most = max(s.size for s in shares(groups.total)) * k  # pieces padded to the largest share for the staging
    trees = jax.tree.map(lambda x: np.concatenate([np.asarray(x), np.zeros((most - len(x),) + np.shape(x)[1:],
                                                                             np.asarray(x).dtype)]), trees)
    trees = global_rows(trees, groups.size * k, groups.total * k, mesh, P())
    return TreeBatch(steps=steps, role=role, trees=trees, trees_per_task=k)


# -- per-process copies for sampling -----------------------------------------------------------------------------------
def host_local_params(params: Any, mesh: Mesh, rules: ModelSharding | None = None) -> Any:
    """This process's full copy of ``params`` (sharded on ``mesh``, across hosts) on its own devices
    (``mesh.local_mesh``), laid out by ``rules`` (default :func:`~agentjax.parallel.rules.sampling`: split over
    ``tp``, replicated over ``fsdp``). One all-gather over ``fsdp`` inside XLA, then no communication.

    Raises ``ValueError`` when the rules split a parameter over mesh axes that span processes (``tp`` larger than
    a host's devices)."""
    rules = sampling() if rules is None else rules
    shardings = param_shardings(params, rules, mesh)
    local = mesh.local_mesh
    for sharding in jax.tree.leaves(shardings, is_leaf=lambda s: isinstance(s, NamedSharding)):
        for axes in sharding.spec:
            for name in (() if axes is None else (axes,) if isinstance(axes, str) else axes):
                if local.shape[name] != mesh.shape[name]:
                    raise ValueError(f"host_local_params: the sampling rules split parameters over '{name}', which "
                                     f"spans processes ({mesh.shape[name]} devices, {local.shape[name]} on this host); "
                                     "keep the tensor-parallel axis within a host")
    if jax.process_count() == 1:
        return jax.device_put(params, shardings)
    gathered = jax.jit(lambda x: x, out_shardings=shardings)(params)
    specs = jax.tree.map(lambda s: s.spec, shardings, is_leaf=lambda s: isinstance(s, NamedSharding))
    return multihost_utils.global_array_to_host_local_array(gathered, mesh, specs)


def host_local_model(model: Qwen, mesh: Mesh, rules: ModelSharding | None = None) -> Qwen:
    """A :class:`Qwen` for this process's sampler: ``model``'s structure and parameters (:func:`host_local_params`)
    on ``mesh.local_mesh``, its activation constraints bound to that mesh. Refresh its parameters after an update
    with ``nnx.update(local, host_local_params(state.params, mesh, rules))``."""
    rules = sampling() if rules is None else rules
    graphdef, state = nnx.split(model)
    local = nnx.merge(graphdef, host_local_params(state, mesh, rules))
    local.act_sharding = activation_sharding(rules, mesh.local_mesh)
    return local


__all__ = ["gather_index", "global_rows", "global_step_batch", "global_tree_batch", "host_local_model",
           "host_local_params", "process_devices"]

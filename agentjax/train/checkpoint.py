"""Orbax checkpoints of a whole `TrainState`, atomic, keep-N, verified on restore, with fallback past corrupt ones.

Layout: ``<directory>/<step>/state`` (the state pytree: params, optimizer state, reference params, value head,
PRNG stream, step, data position, skip count; the stage schedule's state where the method has one) and
``<directory>/<step>/meta`` (JSON: step, data position, a fingerprint of every array, the caller's metadata such
as the config). A resumed run restores all of it, so it
continues to the same numbers as an uninterrupted one (tests/train/test_checkpoint.py checks bitwise equality).

Atomicity is orbax's: a checkpoint is written under a temporary name and renamed into place when complete
(and marked committed), so a crash mid-save leaves no half checkpoint under a step name; leftover temporary
folders are removed when the manager opens the directory. Saving is asynchronous (orbax copies the arrays to
the host before ``save`` returns, so the state may be donated to the next update right away); ``wait`` or
``close`` blocks until the files are written.

Corruption. Orbax restores some damaged files silently (a garbled chunk decodes to wrong numbers), so every
array's fingerprint — a position-mixed sum of its bit patterns modulo 2³², computed on device, exact and
independent of reduction order — is stored at save time and checked after restore. :meth:`Checkpointer.restore_latest`
tries the newest step first; a step that fails (unreadable files, missing metadata, fingerprint mismatch) is
reported with a :class:`CorruptCheckpointWarning` naming its folder, and the previous step is tried. Once an older
step restores, the failed newer ones are moved to ``<directory>/corrupt/`` (kept for inspection, out of the way
of the steps the resumed run will save again). If no step restores — e.g. the state's structure changed because
the config did — nothing is moved and :class:`CheckpointError` lists every step's error.

One trainer per run folder: :func:`run_folder_lock` holds ``<out_dir>/.train.lock`` (``fcntl.flock``, released by
the OS when the process ends, however it ends) while a run trains, so a second process started on the same folder
(a resumed run launched twice, two experiment drivers racing) stops with an error naming the holder instead of
interleaving its checkpoints, metrics and evaluations with the first's; :func:`being_trained` asks without waiting.
In a multi-host run, JAX process 0 takes it for all.

Several processes (one per host, :mod:`agentjax.parallel.multihost`): every process calls ``save`` and ``restore``
with the same state, sharded over all of them; orbax writes each process's shards and process 0 the metadata and
the commit, with barriers between, so ``directory`` must be on storage every host sees. The fingerprints are
computed on the mesh, so every process verifies the whole state, falls back past the same damaged step, and the
damaged steps are moved by process 0. A checkpoint written by N processes restores on any mesh of the same state
(tests/parallel/test_multihost.py: 2 processes × 4 devices write, 1 process × 8 devices reads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import socket
import time
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from agentjax.train.state import TrainState

FORMAT = 1  # version of the meta layout


class CheckpointError(RuntimeError):
    """No checkpoint of a directory could be restored (the message lists each step's error)."""


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint step could not be restored or failed verification; an older one is tried."""


@dataclasses.dataclass(frozen=True)
class Restored:
    """A restored checkpoint."""

    state: TrainState
    step: int  # the state's step (updates done)
    data_position: int  # the state's position in the task stream
    metadata: dict[str, Any]  # what the caller passed to `save`
    path: str  # the step's folder


def _leaf_fingerprint(x: jax.Array) -> jax.Array:
    """``Σ_i mix(bits_i, i) mod 2³²`` over the array's elements (uint32; order-independent, exact)."""
    if x.dtype == jnp.bool_:
        u = x.astype(jnp.uint32)
    elif x.dtype.itemsize == 8:
        u = jax.lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
    else:
        narrow = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
        u = jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32)
    u = u.reshape(-1)
    h = u + jnp.arange(u.size, dtype=jnp.uint32) * jnp.uint32(0x9E3779B9)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 15)
    h = h * jnp.uint32(0xC2B2AE35)
    h = h ^ (h >> 13)
    return jnp.sum(h, dtype=jnp.uint32)


@jax.jit
def _fingerprints(leaves: list[jax.Array]) -> list[jax.Array]:
    return [_leaf_fingerprint(x) for x in leaves]


def fingerprint(tree: Any) -> dict[str, int]:
    """``{key path: fingerprint}`` of every array leaf of ``tree`` (computed on device, one small transfer)."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    values = jax.device_get(_fingerprints([x for _, x in flat]))
    return {jax.tree_util.keystr(p): int(v) for (p, _), v in zip(flat, values, strict=True)}


def _saved_form(state: TrainState) -> TrainState | dict[str, Any]:
    """What is written for ``state``: the state itself, or, without a stage schedule, its other fields as a dict —
    the layout of every checkpoint from before TrainState had the ``schedule`` field, so those restore unchanged
    (and the arrays and fingerprints are the same either way)."""
    if state.schedule is not None:
        return state
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.name != "schedule"}


def _abstract(x: Any) -> jax.ShapeDtypeStruct:
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))


class Checkpointer:
    """Saves and restores `TrainState` checkpoints in ``directory`` (module docstring).

    Args:
      directory: the run's checkpoint folder (created if missing).
      max_to_keep: the newest N checkpoints are kept; older ones are deleted after each save.
      async_save: write in a background thread after the arrays reach the host.
      read_only: restore only: no folder is created and no unfinished save is cleaned up, so a run that is still
        writing checkpoints can be read (analyses, evaluation of a live run).
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3, async_save: bool = True,
                 read_only: bool = False):
        if max_to_keep < 1:
            raise ValueError(f"Checkpointer: max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(max_to_keep=None if read_only else max_to_keep, create=not read_only,
                                               cleanup_tmp_directories=not read_only, read_only=read_only,
                                               enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    # -- saving ---------------------------------------------------------------------------------------------------
    def save(self, state: TrainState, *, metadata: dict[str, Any] | None = None) -> int:
        """Checkpoint ``state`` under its step (``state.step``); ``metadata`` must be JSON-serialisable (e.g.
        ``{"config": config.to_dict(), "sampler": ...}``). Returns the step."""
        step = int(state.step)
        meta = {"format": FORMAT, "step": step, "data_position": int(state.data_position), "time": time.time(),
                "fingerprints": fingerprint(state), "metadata": metadata or {}}
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_saved_form(state)),
                                                         meta=ocp.args.JsonSave(meta)))
        return step

    def wait(self) -> None:
        """Block until every pending save is on disk."""
        self._manager.wait_until_finished()

    def steps(self) -> list[int]:
        """Steps with a committed checkpoint, oldest first."""
        self.wait()
        return sorted(self._manager.all_steps())

    def step_path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    # -- restoring ------------------------------------------------------------------------------------------------
    def restore(self, step: int, like: TrainState) -> Restored:
        """Restore ``step`` into the structure, dtypes and shardings of ``like`` (a state, or its
        ``jax.ShapeDtypeStruct`` tree) and verify every array's fingerprint; raises on any failure."""
        self.wait()
        abstract = jax.tree.map(_abstract, like)
        target = _saved_form(abstract)
        out = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                                  meta=ocp.args.JsonRestore()))
        meta, state = out.meta, (TrainState(**out.state) if isinstance(out.state, dict) else out.state)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or "fingerprints" not in meta:
            raise CheckpointError(f"{self.step_path(step)}: metadata missing or of an unknown format")
        got = fingerprint(state)
        if set(got) != set(meta["fingerprints"]):
            raise CheckpointError(f"{self.step_path(step)}: the saved arrays do not match the state's structure")
        bad = [k for k, v in got.items() if meta["fingerprints"][k] != v]
        if bad:
            raise CheckpointError(f"{self.step_path(step)}: {len(bad)} array(s) fail verification, e.g. {bad[0]}")
        if int(state.step) != step or int(meta["step"]) != step:
            raise CheckpointError(f"{self.step_path(step)}: holds step {int(state.step)}, not {step}")
        return Restored(state=state, step=step, data_position=int(state.data_position),
                        metadata=meta.get("metadata", {}), path=self.step_path(step))

    def restore_latest(self, like: TrainState) -> Restored | None:
        """The newest checkpoint that restores and verifies, or None if the directory has none.

        Failed newer steps are reported (:class:`CorruptCheckpointWarning`) and, once an older step restores,
        moved to ``<directory>/corrupt/``. Raises :class:`CheckpointError` if checkpoints exist but none restores.
        """
        failures = []
        for step in reversed(self.steps()):
            try:
                restored = self.restore(step, like)
            except Exception as e:  # noqa: BLE001 — any failure of one step means: try the previous one
                reason = " ".join(f"{type(e).__name__}: {e}".split())  # one line
                failures.append((step, reason))
                warnings.warn(f"checkpoint {self.step_path(step)} (step {step}) could not be restored "
                              f"({reason[:300]}); falling back to the previous checkpoint",
                              CorruptCheckpointWarning, stacklevel=2)
                continue
            self._quarantine([s for s, _ in failures])
            return restored
        if failures:
            listing = "\n".join(f"  step {s}: {err[:500]}" for s, err in failures)
            raise CheckpointError(f"no checkpoint in {self.directory} could be restored (if the config changed, the "
                                  f"state no longer matches the saved one):\n{listing}")
        return None

    def _quarantine(self, steps: list[int]) -> None:
        if not steps:
            return
        if jax.process_index() == 0:
            target = os.path.join(self.directory, "corrupt")
            os.makedirs(target, exist_ok=True)
            for step in steps:
                shutil.move(self.step_path(step), os.path.join(target, f"{step}-{int(time.time())}"))
        if jax.process_count() > 1:
            ocp.multihost.sync_global_processes("agentjax_checkpoint_quarantine")
        self._manager.reload()

    # -- lifetime -------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish pending saves and release the manager."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- one trainer per run folder ---------------------------------------------------------------------------------------
LOCK = ".train.lock"


class RunFolderBusy(RuntimeError):
    """Another process is training into the same run folder."""


def _try_lock(out_dir: str) -> tuple[Any, str]:
    """``(open lock file, "")`` with the lock held, or ``(None, holder)`` when another open file holds it."""
    os.makedirs(out_dir, exist_ok=True)
    f = open(os.path.join(out_dir, LOCK), "a+")  # noqa: SIM115 - held for the caller's with-block
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        return None, holder or "a process"
    return f, ""


@contextlib.contextmanager
def run_folder_lock(out_dir: str) -> Iterator[None]:
    """Hold ``out_dir``'s trainer lock for the with-block (module docstring); :class:`RunFolderBusy` names the
    holder when another process (or another open of the lock in this one) has it."""
    if jax.process_index() != 0:
        yield
        return
    f, holder = _try_lock(out_dir)
    if f is None:
        raise RunFolderBusy(f"{out_dir} is being trained by {holder}; wait for that run to end (it resumes from its "
                            "checkpoints if stopped), or give this run another out_dir")
    try:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        yield
    finally:
        f.close()  # closing the file releases the lock


def being_trained(out_dir: str) -> bool:
    """Whether a process holds ``out_dir``'s trainer lock now (no waiting; a folder without one is free)."""
    if not os.path.exists(os.path.join(out_dir, LOCK)):
        return False
    f, _ = _try_lock(out_dir)
    if f is not None:
        f.close()
    return f is None

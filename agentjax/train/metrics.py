"""Per-update metrics: rollout statistics of a batch, stage timings, a JSONL + TensorBoard writer, a progress bar.

A trainer loop assembles one flat dict per update with :func:`update_metrics` — keys ``rollout/…`` (success
rate, per-task-type success, returns, invalid rate, episode length), ``train/…`` (the update's loss terms, KL,
entropy, clip fraction, grad norm, lr, skips), ``credit/…`` (advantage statistics of the method) and
``time/…`` (env / generate / credit / update seconds) — and hands it to :class:`MetricsWriter`, which appends a
JSON line and writes TensorBoard scalars (``tensorboardX``, the light writer without TensorFlow).

Non-finite values are kept: JSON lines carry them as ``NaN`` / ``Infinity`` (what Python's ``json`` reads back).

A multi-host run logs once: the writer writes files and the progress bar shows on JAX process 0 only; the other
processes compute the same lines and write nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import rich.progress
import tensorboardX

from agentjax.parallel.multihost import is_main
from agentjax.rollout.batch import StepBatch


def rollout_metrics(batch: StepBatch, *, task_types: Sequence[str] | None = None) -> dict[str, float]:
    """Episode statistics of a batch (host NumPy), one episode per ``(group, rollout)`` of real rows.

    Returns ``success_rate`` (episodes with ``won`` on a row), ``success/<type>`` per task type when
    ``task_types[task]`` names each task's type, ``return_mean`` (total reward per episode, invalid penalties
    included), ``episode_length_mean`` (turns), ``truncated_rate``, ``invalid_rate`` (share of turns whose action was
    invalid), ``episodes``, ``turns`` and ``response_tokens_mean`` (trained tokens per turn).
    """
    host = jax.device_get({k: getattr(batch, k) for k in ("row_mask", "group", "rollout", "task", "won", "reward",
                                                          "valid", "truncated", "response_mask")})
    m = np.asarray(host["row_mask"], bool)
    if not m.any():
        return {"episodes": 0.0, "turns": 0.0}
    keys = np.stack([host["group"][m], host["rollout"][m]], -1)
    _, episode, turns_e = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    episode = episode.reshape(-1)
    n = len(turns_e)
    won_e = np.zeros(n, bool)
    np.logical_or.at(won_e, episode, host["won"][m])
    trunc_e = np.zeros(n, bool)
    np.logical_or.at(trunc_e, episode, host["truncated"][m])
    return_e = np.bincount(episode, weights=host["reward"][m].astype(np.float64), minlength=n)
    task_e = np.zeros(n, np.int64)
    task_e[episode] = host["task"][m]
    out = {
        "success_rate": float(won_e.mean()),
        "return_mean": float(return_e.mean()),
        "episode_length_mean": float(turns_e.mean()),
        "truncated_rate": float(trunc_e.mean()),
        "invalid_rate": float(1.0 - np.asarray(host["valid"][m], np.float64).mean()),
        "episodes": float(n),
        "turns": float(m.sum()),
        "response_tokens_mean": float(np.asarray(host["response_mask"])[m].sum(-1).mean()),
    }
    if task_types is not None:
        if task_e.max() >= len(task_types):
            raise ValueError(f"rollout_metrics: task index {int(task_e.max())} has no entry in task_types "
                             f"(length {len(task_types)}); pass one type name per task of the split")
        names = np.asarray(task_types, dtype=object)[task_e]
        for name in sorted(set(names)):
            out[f"success/{name}"] = float(won_e[names == name].mean())
    return out


class StageTimer:
    """Wall-clock seconds per stage of an update: ``with timer("env"): ...``; :meth:`metrics` reads and resets.

    Device work is asynchronous: end a timed block with its results on the host (or ``jax.block_until_ready``),
    or its time is charged to whichever stage waits for it.
    """

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[stage] = self._seconds.get(stage, 0.0) + time.perf_counter() - start

    def metrics(self, *, reset: bool = True) -> dict[str, float]:
        """``{stage: seconds, "total": sum}`` since the last reset."""
        out = dict(self._seconds) | {"total": float(sum(self._seconds.values()))}
        if reset:
            self._seconds = {}
        return out


def to_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Scalars (Python, NumPy or JAX, fetched in one transfer) as Python floats; raises on a non-scalar."""
    host = jax.device_get(dict(metrics))
    out = {}
    for k, v in host.items():
        arr = np.asarray(v)
        if arr.size != 1:
            raise ValueError(f"metric {k!r} is not a scalar (shape {arr.shape}); log a summary of it instead")
        out[k] = float(arr.reshape(()))
    return out


def update_metrics(
    *,
    train: Mapping[str, Any] | None = None,
    rollout: Mapping[str, Any] | None = None,
    credit: Mapping[str, Any] | None = None,
    timing: Mapping[str, Any] | None = None,
    **other: Mapping[str, Any],
) -> dict[str, float]:
    """One flat dict of floats with the section names as prefixes (``train/loss``, ``rollout/success_rate``,
    ``credit/adv_std``, ``time/env`` from ``timing``; further sections by keyword, e.g. ``eval=...``)."""
    sections = {"train": train, "rollout": rollout, "credit": credit, "time": timing} | other
    out: dict[str, float] = {}
    for name, values in sections.items():
        if values:
            out |= {f"{name}/{k}": v for k, v in to_floats(values).items()}
    return out


class MetricsWriter:
    """Appends one JSON line per update to ``<directory>/metrics.jsonl`` and writes TensorBoard scalars to
    ``<directory>/tb``.

    Args:
      directory: the run's folder (created if missing).
      tensorboard: also write TensorBoard event files.
      resume_step: when resuming from a checkpoint at this step, drop what the interrupted run logged for later
        steps (JSON lines with ``step > resume_step``; TensorBoard's ``purge_step``), so the log reads as one run.
      files: write (and truncate) the files; default: on JAX process 0 only (module docstring). Without files
        ``write`` still returns the line.
    """

    def __init__(self, directory: str | os.PathLike, *, tensorboard: bool = True, resume_step: int | None = None,
                 files: bool | None = None):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, "metrics.jsonl")
        self._file, self._tb = None, None
        if not (is_main() if files is None else files):
            return
        os.makedirs(self.directory, exist_ok=True)
        if resume_step is not None and os.path.exists(self.path):
            self._truncate_after(resume_step)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 — closed in close()
        if tensorboard:
            purge = None if resume_step is None else resume_step + 1
            self._tb = tensorboardX.SummaryWriter(os.path.join(self.directory, "tb"), purge_step=purge)

    def _truncate_after(self, step: int) -> None:
        with open(self.path, encoding="utf-8") as f:
            lines = f.readlines()
        keep = []
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the crash
                continue
            if record.get("step", math.inf) <= step:
                keep.append(json.dumps(record) + "\n")
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(keep)
        os.replace(tmp, self.path)

    def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Log ``metrics`` (scalars) for ``step``; returns them as floats."""
        values = to_floats(metrics)
        if self._file is None:
            return values
        self._file.write(json.dumps({"step": int(step), "time": time.time()} | values) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, global_step=int(step))
        return values

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (a directory is read as ``<directory>/metrics.jsonl``)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class ProgressBar:
    """A ``rich`` progress bar over updates that shows a few chosen metrics.

    ``with ProgressBar(total, shown=("rollout/success_rate", "train/loss")) as bar: bar.advance(metrics)``.
    Shown on JAX process 0 only.
    """

    def __init__(self, total: int, *, description: str = "train", completed: int = 0,
                 shown: Sequence[str] = ("rollout/success_rate", "train/loss", "train/kl"), disable: bool = False):
        self.shown = tuple(shown)
        self._progress = rich.progress.Progress(
            rich.progress.TextColumn("[bold]{task.description}"), rich.progress.BarColumn(),
            rich.progress.MofNCompleteColumn(), rich.progress.TimeElapsedColumn(),
            rich.progress.TimeRemainingColumn(), rich.progress.TextColumn("{task.fields[info]}"),
            disable=disable or not is_main())
        self._task = self._progress.add_task(description, total=total, completed=completed, info="")

    def advance(self, metrics: Mapping[str, float] | None = None, steps: int = 1) -> None:
        info = ""
        if metrics:
            info = "  ".join(f"{k.split('/')[-1]} {metrics[k]:.4g}" for k in self.shown if k in metrics)
        self._progress.update(self._task, advance=steps, info=info)

    @property
    def completed(self) -> int:
        return int(self._progress.tasks[0].completed)

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

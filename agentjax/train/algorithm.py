"""What a training method hands the trainer: an :class:`Algorithm`.

The :class:`~agentjax.train.trainer.Trainer` owns the loop (task stream and data position, PRNG keys, timers and
progress, non-finite checks, checkpoints, the evaluation schedule, metrics); the algorithm owns what differs between
methods. Each step the trainer calls, in this order (``timer`` is the step's
:class:`~agentjax.train.metrics.StageTimer`; the stages named are the ``time/`` keys)::

    batch = algorithm.collect(state, policy, tasks, task_indices, key)        # the step's tasks and first key
    with timer("credit"):
        batch = algorithm.credit(state, batch)
    batch = algorithm.after_credit(state, batch, timer, evaluating=...)       # the method's own timed stages
    with timer("update"):
        state, metrics = algorithm.update(state, batch, key)                  # the step's second key
    if due:                                                                   # on the trainer's schedule
        with timer("eval"):
            evaluation = algorithm.evaluate(state, policy, step)
    algorithm.save(state, batch, step, timer)                                 # per-step files
    line = algorithm.record(state, batch, metrics, evaluation)               # the metrics line, without time/
    algorithm.check(state, batch, metrics)                                    # raises to stop the run
    line |= time/ of algorithm.timings(batch) | timer.metrics()

``batch`` is the algorithm's own record of the step (collected rollouts, then their credit); the trainer only passes
it along. ``progress(state)`` counts the steps toward ``RunConfig.updates`` (a flat method: ``state.step``, every
update; a tree method: the optimizer steps its stage schedule applied), and evaluation and checkpoints are due after
a step that advanced it.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import jax

from agentjax.train.metrics import StageTimer
from agentjax.train.state import TrainState

Batch = TypeVar("Batch")


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation point: ``result`` is the main series' evaluation (``success_rate``, …, ``outcomes``; the
    summary's ``last_eval``), ``sections`` its metrics by line prefix (``{"eval": {...}, "held_out": {...}}``)."""

    result: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    sections: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


NO_EVALUATION = Evaluation()


class Algorithm(abc.ABC, Generic[Batch]):
    """A training method as the trainer runs it (module docstring)."""

    shown: tuple[str, ...] = ()  # the metrics the progress bar shows
    schedule: bool = False  # the state carries a stage schedule (agentjax.train.schedule)

    def progress(self, state: TrainState) -> int:
        """The steps toward ``RunConfig.updates`` that ``state`` has made."""
        return int(state.step)

    @abc.abstractmethod
    def collect(self, state: TrainState, policy: Any, tasks: Sequence[Any], task_indices: Sequence[int],
                key: jax.Array) -> Batch:
        """Play ``tasks`` (the task stream's ``task_indices``) with ``policy`` (synced with ``state``) from ``key``."""

    @abc.abstractmethod
    def credit(self, state: TrainState, batch: Batch) -> Batch:
        """The batch's credit (timed ``credit`` by the trainer; blocked until ready)."""

    def after_credit(self, state: TrainState, batch: Batch, timer: StageTimer, *, evaluating: bool) -> Batch:
        """The method's stages between credit and update, each timed with ``timer`` (``evaluating``: an evaluation
        follows this step if it advances ``progress``). Default: none."""
        return batch

    @abc.abstractmethod
    def update(self, state: TrainState, batch: Batch, key: jax.Array) -> tuple[TrainState, Mapping[str, Any]]:
        """The update on the credited batch (blocked until ready); returns the new state and its metrics."""

    @abc.abstractmethod
    def evaluate(self, state: TrainState, policy: Any, step: int) -> Evaluation:
        """Evaluate ``policy`` (synced with ``state``) at metrics step ``step``; writes the evaluation's files."""

    def save(self, state: TrainState, batch: Batch, step: int, timer: StageTimer) -> None:
        """Per-step files of the batch, timed with ``timer``. Default: none."""

    @abc.abstractmethod
    def record(self, state: TrainState, batch: Batch, metrics: Mapping[str, Any],
               evaluation: Evaluation) -> dict[str, Any]:
        """The step's metrics line but its ``time/`` keys."""

    @abc.abstractmethod
    def check(self, state: TrainState, batch: Batch, metrics: Mapping[str, Any]) -> None:
        """Raise a ``RuntimeError`` to stop the run after this step (its metrics line is written first, its
        checkpoint is not)."""

    @abc.abstractmethod
    def timings(self, batch: Batch) -> dict[str, float]:
        """The collection's seconds by stage (the trainer adds its timer's stages and ``total``)."""

    def summary(self, state: TrainState) -> dict[str, Any]:
        """Keys the method adds to :func:`~agentjax.train.trainer.train`'s summary after ``step``. Default: none."""
        return {}

    def close(self) -> None:
        """Release what the method holds (env pools). Default: nothing."""


__all__ = ["NO_EVALUATION", "Algorithm", "Evaluation"]

"""The SERA / RAO stage schedule: which objective each optimizer step trains, as training state.

METHODS.md SERA 7; papers/SERA.txt §3.6, §B.2. Each optimizer step trains one stage — execution, decomposition
(leaf coverage) or rubric generation — on its own freshly sampled batch, in cycles of ``e : d : r`` steps
(steps ``0 .. e−1`` execution, ``e .. e+d−1`` decomposition, ``e+d .. e+d+r−1`` rubric, repeat), for a fixed
total number of steps. The released controller (``Training/sera_training/stage_kernel.py``) routes on the
policy version, which advances only when an optimizer step is applied: a batch that yields nothing to train (no
trainable data, or a step skipped for a NaN/Inf) does not advance the schedule. Here that counter is
:class:`ScheduleState`, a small pytree kept in :class:`~agentjax.train.state.TrainState` (``state.schedule``) and
saved in its orbax checkpoint, so a resumed run lands on the same stage::

    schedule = StageSchedule.sera(total_steps=250)
    stage = stage_name(schedule, state.schedule.step)          # sample a batch for this stage, train it
    state = state.replace(schedule=advance(state.schedule, applied))
    if finished(schedule, state.schedule): stop

Presets (the released recipes, ``Training/README.md``): SERA 16 : 2 : 2, SERA w/o D 16 : 0 : 2, execution only
(rubric-score rewards, "SERA w/o D & RT") 1 : 0 : 0, RAO 1 : 0 : 0, RAO + D 12 : 4 : 0, RAO + RT 16 : 0 : 2.
Total steps: 250 on TextCraft-Synth, 400 on TextWorld-Sync.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

STAGES = ("execution", "decomposition", "rubric")
EXECUTION, DECOMPOSITION, RUBRIC = range(3)
TOTAL_STEPS = {"textcraft_synth": 250, "textworld_sync": 400}  # the paper's evaluated checkpoints


class ScheduleState(NamedTuple):
    """The schedule's place in a run (STYLE.md 4): a pytree of int32 scalars, checkpointed with the train state."""

    step: Int[Array, ""]  # [] int32, optimizer steps applied under the schedule (the released policy version)
    skipped: Int[Array, ""]  # [] int32, batches that trained nothing (they do not advance `step`)


@dataclasses.dataclass(frozen=True)
class StageSchedule:
    """Steps per cycle of each stage, and the run's fixed total of optimizer steps (METHODS.md SERA 7)."""

    execution: int = 16
    decomposition: int = 2
    rubric: int = 2
    total_steps: int = 250

    def __post_init__(self):
        counts = (self.execution, self.decomposition, self.rubric)
        if min(counts) < 0 or sum(counts) == 0:
            raise ValueError(f"StageSchedule: stage steps must be >= 0 and not all 0, got {counts}")
        if self.total_steps < 1:
            raise ValueError(f"StageSchedule: total_steps must be >= 1, got {self.total_steps}")

    @property
    def cycle(self) -> int:
        """Optimizer steps per cycle, ``e + d + r``."""
        return self.execution + self.decomposition + self.rubric

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages that occur, in cycle order."""
        return tuple(s for s, n in zip(STAGES, (self.execution, self.decomposition, self.rubric), strict=True) if n)

    def steps_of(self, stage: str) -> int:
        """Optimizer steps of ``stage`` over the whole run (``total_steps`` of them in all)."""
        return sum(stage_name(self, t) == stage for t in range(self.total_steps))

    @classmethod
    def sera(cls, total_steps: int = 250) -> StageSchedule:
        """SERA: execution 16, decomposition 2, rubric 2."""
        return cls(16, 2, 2, total_steps)

    @classmethod
    def sera_without_decomposition(cls, total_steps: int = 250) -> StageSchedule:
        """SERA w/o D: execution 16, rubric 2."""
        return cls(16, 0, 2, total_steps)

    @classmethod
    def execution_only(cls, total_steps: int = 250) -> StageSchedule:
        """Execution only with rubric-score rewards (SERA w/o D & RT): 1 : 0 : 0."""
        return cls(1, 0, 0, total_steps)

    @classmethod
    def rao(cls, total_steps: int = 250) -> StageSchedule:
        """RAO: execution only, with binary verifier / judge labels (METHODS.md SERA 8)."""
        return cls(1, 0, 0, total_steps)

    @classmethod
    def rao_decomposition(cls, total_steps: int = 250) -> StageSchedule:
        """RAO + D: execution 12, decomposition 4."""
        return cls(12, 4, 0, total_steps)

    @classmethod
    def rao_rubric_training(cls, total_steps: int = 250) -> StageSchedule:
        """RAO + RT: execution 16 (binary labels), rubric 2."""
        return cls(16, 0, 2, total_steps)


def init_schedule() -> ScheduleState:
    """The state of a fresh run: step 0, nothing skipped."""
    return ScheduleState(step=jnp.zeros((), jnp.int32), skipped=jnp.zeros((), jnp.int32))


def stage_at(schedule: StageSchedule, step: int | Int[Array, "*S"]) -> Int[Array, "*S"]:
    """The stage index (``STAGES``) of optimizer step ``step``, elementwise (pure, jittable; periodic past
    ``total_steps``).

    With ``o = step mod (e + d + r)``: execution for ``o < e``, decomposition for ``e ≤ o < e + d``, rubric
    otherwise (a stage of 0 steps never occurs).
    """
    offset = jnp.asarray(step, jnp.int32) % schedule.cycle
    bounds = jnp.array([schedule.execution, schedule.execution + schedule.decomposition], jnp.int32)
    return jnp.searchsorted(bounds, offset, side="right").astype(jnp.int32)


def stage_name(schedule: StageSchedule, step: int | Int[Array, ""]) -> str:
    """:func:`stage_at` as a name, on the host (the loop samples the batch for this stage)."""
    offset = int(step) % schedule.cycle
    if offset < schedule.execution:
        return STAGES[EXECUTION]
    return STAGES[DECOMPOSITION] if offset < schedule.execution + schedule.decomposition else STAGES[RUBRIC]


def advance(state: ScheduleState, applied: bool | Bool[Array, ""]) -> ScheduleState:
    """The state after one batch: ``step + 1`` if an optimizer step was applied, else ``skipped + 1``."""
    applied = jnp.asarray(applied, jnp.bool_)
    return ScheduleState(step=state.step + applied.astype(jnp.int32),
                         skipped=state.skipped + (~applied).astype(jnp.int32))


def finished(schedule: StageSchedule, state: ScheduleState) -> Bool[Array, ""]:
    """Whether the run has applied its ``total_steps`` optimizer steps."""
    return state.step >= schedule.total_steps

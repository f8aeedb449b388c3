"""The stage schedule: presets, stage boundaries, jit == host, skipped batches, and resume onto the same stage
through the orbax checkpoint (also from a checkpoint written before TrainState had the field)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from agentjax.train import Checkpointer, abstract_state, fingerprint, init_state
from agentjax.train.schedule import (
    STAGES,
    ScheduleState,
    StageSchedule,
    advance,
    finished,
    init_schedule,
    stage_at,
    stage_name,
)

PRESETS = {
    "sera": (StageSchedule.sera(), (16, 2, 2)),
    "sera_without_decomposition": (StageSchedule.sera_without_decomposition(), (16, 0, 2)),
    "execution_only": (StageSchedule.execution_only(), (1, 0, 0)),
    "rao": (StageSchedule.rao(), (1, 0, 0)),
    "rao_decomposition": (StageSchedule.rao_decomposition(), (12, 4, 0)),
    "rao_rubric_training": (StageSchedule.rao_rubric_training(), (16, 0, 2)),
}


def test_sera_boundaries():
    s = StageSchedule.sera()
    names = [stage_name(s, t) for t in range(42)]
    assert names[:16] == ["execution"] * 16
    assert names[16:18] == ["decomposition"] * 2 and names[18:20] == ["rubric"] * 2
    assert names[20:40] == names[:20] and names[40] == "execution"  # the next cycle
    assert s.cycle == 20 and s.stages == STAGES and s.total_steps == 250


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets(name):
    s, ratio = PRESETS[name]
    assert (s.execution, s.decomposition, s.rubric) == ratio
    counts = [sum(stage_name(s, t) == stage for t in range(s.cycle)) for stage in STAGES]
    assert tuple(counts) == ratio  # a stage of 0 steps never occurs
    assert sum(s.steps_of(stage) for stage in STAGES) == s.total_steps
    got = jax.jit(lambda t: stage_at(s, t))(jnp.arange(3 * s.cycle + 7))  # jit, over many steps at once
    want = [STAGES.index(stage_name(s, t)) for t in range(3 * s.cycle + 7)]
    np.testing.assert_array_equal(got, want)
    assert StageSchedule.sera(total_steps=400).total_steps == 400


def test_invalid_schedules():
    with pytest.raises(ValueError):
        StageSchedule(0, 0, 0)
    with pytest.raises(ValueError):
        StageSchedule(1, -1, 0)
    with pytest.raises(ValueError):
        StageSchedule.sera(total_steps=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        StageSchedule.sera().execution = 3  # type: ignore[misc]


def test_skipped_batches_do_not_advance():
    s = StageSchedule(2, 1, 1, total_steps=5)
    state = init_schedule()
    seen = []
    for applied in [True, False, True, False, False, True, True, True]:  # skipped batches resample the stage
        seen.append(stage_name(s, state.step))
        state = advance(state, applied)
    assert seen == ["execution", "execution", "execution", "decomposition", "decomposition", "decomposition",
                    "rubric", "execution"]
    assert int(state.step) == 5 and int(state.skipped) == 3 and bool(finished(s, state))
    jitted = jax.jit(advance)(ScheduleState(jnp.int32(4), jnp.int32(0)), jnp.bool_(False))
    assert int(jitted.step) == 4 and int(jitted.skipped) == 1


def test_resume_lands_on_the_same_stage(tmp_path, tiny_config, tiny_model, tiny_tx):
    s = StageSchedule.sera()
    state = init_state(tiny_config, tiny_model, jax.random.key(0), tiny_tx, schedule=True)
    for applied in [True] * 9 + [False] + [True] * 8 + [False]:  # 17 optimizer steps applied, 2 batches skipped
        state = state.replace(schedule=advance(state.schedule, applied))
    state = state.replace(step=jnp.int32(19))
    assert stage_name(s, state.schedule.step) == "decomposition"
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(state)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        restored = ckpt.restore_latest(abstract_state(tiny_config, tiny_model, tiny_tx, schedule=True))
    assert int(restored.state.schedule.step) == 17 and int(restored.state.schedule.skipped) == 2
    assert stage_name(s, restored.state.schedule.step) == "decomposition"
    assert int(stage_at(s, restored.state.schedule.step)) == STAGES.index("decomposition")


@flax.struct.dataclass(frozen=True)
class LegacyTrainState:
    """TrainState as it was before the `schedule` field."""

    step: Any
    params: Any
    value_head: Any
    opt_state: Any
    ref_params: Any
    rng: Any
    data_position: Any
    nonfinite: Any


def test_checkpoint_without_the_schedule_field_restores(tmp_path, tiny_config, tiny_model, tiny_tx):
    """A checkpoint written before TrainState had `schedule` (its state item holds the other fields only) still
    restores into a state without a schedule; a schedule-less state round-trips as before."""
    state = init_state(tiny_config, tiny_model, jax.random.key(1), tiny_tx).replace(step=jnp.int32(4))
    assert state.schedule is None
    with Checkpointer(tmp_path / "old") as ckpt:  # written as Checkpointer.save did before the field existed
        old = LegacyTrainState(**{name: getattr(state, name) for name in LegacyTrainState.__dataclass_fields__})
        meta = {"format": 1, "step": 4, "data_position": 0, "time": time.time(), "fingerprints": fingerprint(old),
                "metadata": {}}
        ckpt._manager.save(4, args=ocp.args.Composite(state=ocp.args.StandardSave(old), meta=ocp.args.JsonSave(meta)))
    with Checkpointer(tmp_path / "old") as ckpt:
        restored = ckpt.restore_latest(abstract_state(tiny_config, tiny_model, tiny_tx))
    assert restored.step == 4 and restored.state.schedule is None
    with Checkpointer(tmp_path / "new") as ckpt:
        ckpt.save(state)
    with Checkpointer(tmp_path / "new") as ckpt:
        assert ckpt.restore_latest(abstract_state(tiny_config, tiny_model, tiny_tx)).state.schedule is None

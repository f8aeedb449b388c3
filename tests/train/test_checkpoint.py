"""Checkpoints: resume equals an uninterrupted run bit for bit; keep-N; damaged files (garbled, truncated,
bad metadata) are reported and the previous checkpoint is used; failures that are not corruption raise."""

from __future__ import annotations

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.train import (
    Checkpointer,
    CheckpointError,
    CorruptCheckpointWarning,
    PPOCredit,
    TrainConfig,
    UpdateBatch,
    abstract_state,
    compute_advantages,
    fingerprint,
    init_state,
    make_update,
    next_key,
)
from tests.train.conftest import leaves_equal

# A failed restore of a damaged file leaves orbax's other pending read coroutines un-awaited when its event loop
# closes; Python reports them as unraisable exceptions. They are orbax's, harmless, and not what these tests check.
orbax_leftovers = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def run(update, state, batch, adv, n):
    """``n`` loop iterations: draw a key from the state's stream, update, advance the data position."""
    for _ in range(n):
        state, key = next_key(state)
        state, _ = update(state, UpdateBatch.of(batch, adv), key)
        state = state.replace(data_position=state.data_position + 1)
    return state


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_resume_continues_to_the_same_numbers(tmp_path, tiny_config, tiny_model, tiny_tx, tiny_batch):
    adv = compute_advantages(tiny_config.credit, tiny_batch, tiny_config.rollout)
    update = make_update(tiny_config, tiny_model, tiny_tx)
    fresh = lambda seed: init_state(tiny_config, tiny_model, jax.random.key(seed), tiny_tx)  # noqa: E731
    uninterrupted = run(update, fresh(0), tiny_batch, adv, 3)

    with Checkpointer(tmp_path / "ckpt") as ckpt:
        state = run(update, fresh(0), tiny_batch, adv, 1)
        ckpt.save(state, metadata={"config": tiny_config.to_dict()})  # async; the state is donated right after
        run(update, state, tiny_batch, adv, 1)  # progress the interrupted run loses
    with Checkpointer(tmp_path / "ckpt") as ckpt:  # a new process: restore into the abstract state
        restored = ckpt.restore_latest(abstract_state(tiny_config, tiny_model, tiny_tx))
    assert restored.step == 1 and restored.data_position == 1
    assert restored.metadata["config"]["credit"]["method"] == "grpo"
    resumed = run(update, restored.state, tiny_batch, adv, 2)
    assert leaves_equal(resumed, uninterrupted)  # params, optimizer, reference, rng, step, data position
    assert int(resumed.step) == 3 and int(resumed.data_position) == 3


@pytest.fixture()
def small_state(tiny_config, tiny_model, tiny_tx):
    return init_state(tiny_config, tiny_model, jax.random.key(0), tiny_tx)


def save_steps(ckpt, state, steps):
    for s in steps:  # each step's arrays differ (params scaled), so a damaged step cannot match another
        ckpt.save(state.replace(step=jnp.int32(s), data_position=jnp.int32(10 * s),
                                params=jax.tree.map(lambda p, s=s: p * (1.0 + s), state.params)))
    ckpt.wait()


def test_keeps_the_newest_n(tmp_path, small_state):
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        save_steps(ckpt, small_state, [1, 2, 3, 4])
        assert ckpt.steps() == [3, 4]
        assert sorted(os.listdir(tmp_path)) == ["3", "4"]
        assert ckpt.restore_latest(small_state).data_position == 40


def largest_data_file(step_dir):
    return max(glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True), key=os.path.getsize)


def garble(step_dir):
    path = largest_data_file(step_dir)
    data = bytearray(open(path, "rb").read())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0x5A
    open(path, "wb").write(bytes(data))


def truncate(step_dir):
    path = largest_data_file(step_dir)
    os.truncate(path, os.path.getsize(path) // 2)


def bad_meta(step_dir):
    open(os.path.join(step_dir, "meta", "metadata"), "w").write("{not json")


def no_array_metadata(step_dir):
    os.remove(os.path.join(step_dir, "state", "_METADATA"))


@orbax_leftovers
@pytest.mark.parametrize("damage", [garble, truncate, bad_meta, no_array_metadata], ids=lambda f: f.__name__)
def test_a_corrupt_latest_checkpoint_is_reported_and_the_previous_one_used(tmp_path, small_state, damage):
    with Checkpointer(tmp_path, max_to_keep=3) as ckpt:
        save_steps(ckpt, small_state, [1, 2, 3])
        damage(str(tmp_path / "3"))
        with pytest.warns(CorruptCheckpointWarning, match=f"{tmp_path}/3 .*falling back"):
            restored = ckpt.restore_latest(small_state)
        assert restored.step == 2 and restored.data_position == 20
        expected = jax.tree.map(lambda p: p * 3.0, small_state.params)
        assert leaves_equal(restored.state.params, expected)
        assert ckpt.steps() == [1, 2]
        assert [n.split("-")[0] for n in os.listdir(tmp_path / "corrupt")] == ["3"]  # kept for inspection
        save_steps(ckpt, small_state, [3])  # the resumed run can save step 3 again
        assert ckpt.restore_latest(small_state).step == 3


@orbax_leftovers
def test_two_corrupt_steps_fall_back_twice(tmp_path, small_state):
    with Checkpointer(tmp_path, max_to_keep=3) as ckpt:
        save_steps(ckpt, small_state, [1, 2, 3])
        garble(str(tmp_path / "3"))
        truncate(str(tmp_path / "2"))
        with pytest.warns(CorruptCheckpointWarning) as caught:
            assert ckpt.restore_latest(small_state).step == 1
        assert len(caught) == 2


@orbax_leftovers
def test_nothing_restorable_raises_and_moves_nothing(tmp_path, small_state):
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore_latest(small_state) is None  # an empty directory: a fresh run
        save_steps(ckpt, small_state, [1, 2])
        garble(str(tmp_path / "1"))
        garble(str(tmp_path / "2"))
        with pytest.warns(CorruptCheckpointWarning), pytest.raises(CheckpointError, match="step 2.*\n.*step 1"):
            ckpt.restore_latest(small_state)
        assert ckpt.steps() == [1, 2] and not os.path.exists(tmp_path / "corrupt")


@orbax_leftovers
def test_a_changed_state_structure_is_an_error_not_a_silent_fresh_start(tmp_path, small_state, tiny_model,
                                                                       tiny_tx):
    ppo = init_state(TrainConfig.tiny(credit=PPOCredit()), tiny_model, jax.random.key(0), tiny_tx)
    with Checkpointer(tmp_path) as ckpt:
        save_steps(ckpt, small_state, [1])
        with pytest.warns(CorruptCheckpointWarning), pytest.raises(CheckpointError, match="config changed"):
            ckpt.restore_latest(ppo)  # a value head the checkpoint does not have
        assert ckpt.steps() == [1]


def test_an_interrupted_save_is_not_a_checkpoint(tmp_path, small_state):
    with Checkpointer(tmp_path) as ckpt:
        save_steps(ckpt, small_state, [1])
    partial = tmp_path / "2.orbax-checkpoint-tmp-1700000000"  # what a crash mid-save leaves
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "junk").write_bytes(b"\0" * 100)
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.steps() == [1]
        assert ckpt.restore_latest(small_state).step == 1


def test_fingerprint_sees_every_bit_and_position():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 5)), jnp.float32)
    tree = {"a": x, "b": jnp.arange(3, dtype=jnp.int32), "c": jnp.ones((2,), jnp.bfloat16), "d": jnp.array(True)}
    base = fingerprint(tree)
    assert base == fingerprint(jax.tree.map(jnp.copy, tree))
    flipped = jax.lax.bitcast_convert_type(x, jnp.uint32).at[2, 3].add(1)
    assert fingerprint(tree | {"a": jax.lax.bitcast_convert_type(flipped, jnp.float32)})["['a']"] != base["['a']"]
    assert fingerprint(tree | {"a": x.T.reshape(4, 5)})["['a']"] != base["['a']"]
    assert fingerprint(tree | {"b": jnp.array([0, 2, 1], jnp.int32)})["['b']"] != base["['b']"]
    assert fingerprint(tree | {"c": jnp.array([1, 2], jnp.bfloat16)})["['c']"] != base["['c']"]
    assert fingerprint(tree | {"d": jnp.array(False)})["['d']"] != base["['d']"]


def test_one_trainer_per_run_folder(tmp_path):
    """The run-folder lock: a second holder is refused with the first's pid, the lock is free after the with-block,
    and a process killed while holding it (SIGKILL: no clean-up runs) leaves it free."""
    import signal
    import subprocess
    import sys

    from agentjax.train.checkpoint import RunFolderBusy, being_trained, run_folder_lock

    out = str(tmp_path / "run")
    assert not being_trained(out)
    with run_folder_lock(out):
        assert being_trained(out)
        with pytest.raises(RunFolderBusy, match=rf"{out} is being trained by pid {os.getpid()} .*another out_dir"):
            with run_folder_lock(out):
                pass
    assert not being_trained(out)
    with run_folder_lock(out):  # and it can be taken again
        pass
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom agentjax.train.checkpoint import "
                              f"run_folder_lock\nwith run_folder_lock({out!r}):\n print('held', flush=True)\n"
                              " time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        assert being_trained(out)
        with pytest.raises(RunFolderBusy, match=f"pid {child.pid} "):
            with run_folder_lock(out):
                pass
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert not being_trained(out)

"""EnvPool: same results as stepping serially, group tasks, crash isolation, clean shutdown."""

from __future__ import annotations

import dataclasses
import functools
import logging
import multiprocessing as mp
import os
import signal
import time

import pytest

from envs.base import Task
from envs.pool import (
    EnvError,
    EnvPool,
    SerialPool,
    StepResult,
    WorkerCrashError,
    WorkerTimeoutError,
    group_tasks,
    timed_out,
)
from tests.envs.toy_env import ChainEnv

TASKS = ChainEnv.tasks("train")
SCRIPT = ("forward", "wait", "jump", "back", "forward", "forward", "back", "forward")  # "jump" is invalid


def _actions(t, running):
    """A fixed schedule that differs across slots (slot i plays the script shifted by i)."""
    return [SCRIPT[(t + i) % len(SCRIPT)] if run else None for i, run in enumerate(running)]


def _rollout(pool, tasks):
    """Steps every slot to the end of its episode; returns everything the pool said, in order."""
    trace = [pool.reset(tasks)]
    for t in range(20):
        if not any(pool.running):
            break
        trace.append(pool.step(_actions(t, pool.running)))
    busy = [slot for slot, obs in enumerate(trace[0]) if obs is not None]
    trace.append(pool.reset(tasks))
    trace.append(pool.oracle(busy))
    trace.append(pool.snapshot(busy))
    return trace


@pytest.fixture
def pool():
    with EnvPool(ChainEnv, num_slots=8, num_workers=2, timeout=10.0) as pool:
        yield pool


def _truncated_by_crash(result, obs, reason):
    assert isinstance(result, StepResult)
    assert result.obs == obs and result.reward == 0.0 and result.done
    assert result.info["won"] is False and result.info["truncated"] is True and result.info["valid"] is False
    assert reason in result.info["worker_crash"], result.info


def test_group_tasks_repeats_contiguously():
    tasks = TASKS[:3]
    grouped = group_tasks(tasks, 4)
    assert grouped == [tasks[0]] * 4 + [tasks[1]] * 4 + [tasks[2]] * 4
    assert group_tasks(tasks, 1) == list(tasks)
    with pytest.raises(ValueError):
        group_tasks(tasks, 0)


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_pool_matches_serial(start_method):
    tasks = group_tasks(TASKS[:3], 2) + [None, TASKS[5]]  # a group of 2 per task, one idle slot
    serial = _rollout(SerialPool(ChainEnv, num_slots=8), tasks)
    with EnvPool(ChainEnv, num_slots=8, num_workers=2, start_method=start_method) as pool:
        assert pool.bounds == [range(0, 4), range(4, 8)]
        assert [pool.worker_of(slot) for slot in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
        parallel = _rollout(pool, tasks)
    assert parallel == serial
    assert serial[0][6] is None and all(step[6] is None for step in serial[1:-3])  # the idle slot stays idle
    assert serial[0][0] == serial[0][1] and serial[0][2] == serial[0][3]  # group members start together
    results = [r for step in serial[1:-3] for r in step if r is not None]
    assert sum(r.done for r in results) == 7  # every episode ends, some won, some invalid actions on the way
    assert any(r.info["won"] for r in results) and any(not r.info["valid"] for r in results)


def test_blocks_are_contiguous_and_near_equal():
    with EnvPool(ChainEnv, num_slots=7, num_workers=3) as pool:
        assert pool.bounds == [range(0, 3), range(3, 5), range(5, 7)]
        assert len(set(pool.worker_pids())) == 3
    with EnvPool(ChainEnv, num_slots=2, num_workers=4) as pool:
        assert pool.num_workers == 2


def test_idle_slots_and_misuse(pool):
    obs = pool.reset([TASKS[0], None] * 4)
    assert [o is None for o in obs] == [False, True] * 4
    with pytest.raises(ValueError, match="no episode"):
        pool.step(["forward"] * 8)
    with pytest.raises(ValueError, match="idle"):
        pool.oracle([1])
    with pytest.raises(ValueError):
        pool.step(["forward"])  # wrong length
    results = pool.step(["forward", None] * 4)
    assert [r is None for r in results] == [False, True] * 4
    with pytest.raises(EnvError, match="is for env"):  # the env raised in reset: a bug, reported as such
        pool.reset([Task(env="other", task_id="x", split="train")] + [None] * 7)


def test_crash_action_truncates_the_workers_slots_only(pool):
    obs = pool.reset(group_tasks(TASKS[:4], 2))
    pids = pool.worker_pids()
    results = pool.step(["forward", "crash", "forward", None, "forward", "forward", "wait", "back"])
    for slot in (0, 1, 2):  # stepped on the dead worker
        _truncated_by_crash(results[slot], obs[slot], "exit code 1")
        assert "worker 0" in results[slot].info["worker_crash"]
    assert results[3] is None
    serial = SerialPool(ChainEnv, num_slots=8)
    serial.reset(group_tasks(TASKS[:4], 2))
    expected = serial.step([None] * 4 + ["forward", "forward", "wait", "back"])
    assert results[4:] == expected[4:]  # the other worker's slots are unaffected
    new_pids = pool.worker_pids()
    assert new_pids[0] != pids[0] and new_pids[1] == pids[1]
    assert pool.running == [False, False, False, True, True, True, True, True]
    # slot 3's episode was lost too: it is reported on its next step, without asking the new worker
    results = pool.step([None, None, None, "forward", "forward", None, None, None])
    _truncated_by_crash(results[3], obs[3], "exit code 1")
    assert results[4].info["valid"] and "worker_crash" not in results[4].info
    assert pool.running[:4] == [False] * 4
    # the next reset works on every slot
    obs = pool.reset(TASKS)
    assert all(o is not None for o in obs)
    assert all(r.info["valid"] for r in pool.step(["forward"] * 8))


def test_sigkilled_worker_is_survived(pool):
    obs = pool.reset(TASKS)
    pids = pool.worker_pids()
    os.kill(pids[1], signal.SIGKILL)
    results = pool.step(["forward"] * 8)
    for slot in range(4, 8):
        _truncated_by_crash(results[slot], obs[slot], "SIGKILL")
    assert all(r.info["valid"] and not r.info["truncated"] for r in results[:4])
    assert pool.worker_pids()[0] == pids[0] and pool.worker_pids()[1] != pids[1]
    with pytest.raises(ProcessLookupError):  # the dead worker was reaped, not left a zombie
        os.kill(pids[1], 0)
    # a worker killed between calls is restarted, and the reset retried on it
    os.kill(pool.worker_pids()[0], signal.SIGKILL)
    obs = pool.reset(TASKS)
    assert obs == SerialPool(ChainEnv, num_slots=8).reset(TASKS)
    assert all(r.info["valid"] for r in pool.step(["forward"] * 8))


def test_crash_on_every_reset_raises(pool):
    crashing = Task(env="toy", task_id="bad", split="train", meta={"crash": True})
    with pytest.raises(WorkerCrashError, match="exit code 3"):
        pool.reset([crashing] + TASKS[1:])
    assert pool.reset(TASKS)[0] is not None


def test_env_exception_is_reported_not_crashed(pool, caplog):
    obs = pool.reset(TASKS)
    pids = pool.worker_pids()
    with caplog.at_level(logging.WARNING, logger="envs.pool"):
        results = pool.step(["forward"] * 5 + ["raise"] + ["forward"] * 2)
    bad = results[5]
    assert bad.obs == obs[5] and bad.done and bad.reward == 0.0
    assert bad.info["truncated"] and not bad.info["won"] and not bad.info["valid"]
    assert "RuntimeError: toy env bug" in bad.info["error"] and "worker_crash" not in bad.info
    assert "toy env bug" in caplog.text
    assert all(r.info["valid"] and "error" not in r.info for i, r in enumerate(results) if i != 5)
    assert pool.worker_pids() == pids  # the worker is kept
    assert not pool.running[5] and all(pool.running[i] for i in range(8) if i != 5)


def test_timeout_kills_and_restarts_the_worker():
    with EnvPool(ChainEnv, num_slots=2, num_workers=2, timeout=0.5) as pool:
        obs = pool.reset(TASKS[:2])
        results = pool.step(["hang", "forward"])
        _truncated_by_crash(results[0], obs[0], "timed out")
        assert results[1].info["valid"]
        assert pool.reset(TASKS[:2]) == obs


def test_oracle_s_own_timeout():
    """``oracle(timeout=)`` bounds one call on a pool without a timeout: the hanging worker is killed (a
    :class:`WorkerTimeoutError`), the other answers; a later call waits as long as it needs."""
    hang = dataclasses.replace(TASKS[1], meta={"hang": True})
    with EnvPool(ChainEnv, num_slots=2, num_workers=2) as pool:
        pool.reset([TASKS[0], hang])
        pids = pool.worker_pids()
        t0 = time.monotonic()
        out = pool.oracle([0, 1], strict=False, timeout=0.5)
        assert out[0] == "forward" and isinstance(out[1], WorkerTimeoutError) and timed_out(str(out[1]))
        assert time.monotonic() - t0 < 10 and pool.worker_pids()[0] == pids[0] and pool.worker_pids()[1] != pids[1]
        pool.reset(TASKS[:2])
        assert pool.oracle([0, 1]) == ["forward"] * 2  # the pool's own bound (none) applies again
    serial = SerialPool(ChainEnv, 1)
    serial.reset(TASKS[:1])
    with pytest.raises(ValueError, match="EnvPool"):
        serial.oracle([0], timeout=1.0)


def test_a_timed_out_restore_is_not_retried(caplog):
    """A restore past the pool's timeout is a :class:`WorkerTimeoutError` after one try (a deterministic restore
    that ran out of time would again); a crashed one is still retried once (test_crash_on_every_reset_raises)."""
    hang = dataclasses.replace(TASKS[1], meta={"hang": True})
    with EnvPool(ChainEnv, num_slots=2, num_workers=2, timeout=0.5) as pool, caplog.at_level(logging.WARNING):
        pool.reset(TASKS[:2])
        snaps = pool.snapshot([0]) + [(hang, 0, 4, 0, False)]
        with pytest.raises(WorkerTimeoutError, match="timed out"):
            pool.restore([0, 1], snaps)
        out = pool.restore([0, 1], snaps, strict=False)
        assert out[0].anchor == "cell 0 of 3" and isinstance(out[1], WorkerTimeoutError)
    assert caplog.text.count("timed out") == 2 and "retrying" not in caplog.text


def test_snapshot_restore_oracle_through_the_pool(pool):
    pool.reset(TASKS)
    pool.step(["forward"] * 8)
    assert pool.oracle(range(8)) == ["forward"] * 8
    snaps = pool.snapshot([0, 1, 2])
    after = pool.step(["back", "wait", "forward"] + [None] * 5)
    # restore into other slots, on the other worker, and replay the same actions
    restored = pool.restore([4, 5, 6], snaps)
    assert [o.anchor for o in restored] == ["cell 1 of 3", "cell 1 of 4", "cell 1 of 5"]
    replay = pool.step([None] * 4 + ["back", "wait", "forward"] + [None])
    assert replay[4:7] == after[:3]
    assert pool.snapshot([4]) == pool.snapshot([0])
    # restore also brings back slots lost to a crash
    pool.step([None, None, None, "crash", None, None, None, None])
    restored = pool.restore([3], snaps[:1])
    assert restored[0].anchor == "cell 1 of 3" and pool.running[3]
    with pytest.raises(ValueError):
        pool.restore([0, 0], snaps[:2])


def test_query_on_a_lost_slot_raises(pool):
    pool.reset(TASKS)
    pool.step(["crash"] + [None] * 7)
    with pytest.raises(WorkerCrashError):
        pool.oracle([2])


def test_close_leaves_no_child_processes():
    pool = EnvPool(ChainEnv, num_slots=4, num_workers=2)
    pool.reset(TASKS[:4])
    os.kill(pool.worker_pids()[0], signal.SIGKILL)
    pool.step(["forward"] * 4)  # a restart on the way
    procs = [worker.proc for worker in pool._workers]
    pids = pool.worker_pids()
    pool.close()
    pool.close()  # idempotent
    for proc, pid in zip(procs, pids, strict=True):
        assert not proc.is_alive() and proc.exitcode == 0
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not set(pids) & {p.pid for p in mp.active_children()}
    with pytest.raises(RuntimeError, match="closed"):
        pool.reset(TASKS[:4])


def test_bad_make_env():
    with pytest.raises(TypeError, match="picklable"):
        EnvPool(lambda: ChainEnv(), num_slots=2, num_workers=1)
    with pytest.raises(RuntimeError, match="max_steps must be positive"):
        EnvPool(functools.partial(ChainEnv, max_steps=0), num_slots=2, num_workers=2)
    with pytest.raises(ValueError):
        EnvPool(ChainEnv, num_slots=2, num_workers=1, start_method="fork")

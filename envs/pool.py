"""Step many environments at once: one env per slot, several slots per worker process, crash isolation.

A pool holds ``num_slots`` environments built by ``make_env()``. :class:`EnvPool` spreads them over
``num_workers`` processes in contiguous blocks (worker ``w`` owns slots ``bounds[w][0] .. bounds[w][1] - 1``);
:class:`SerialPool` keeps them in this process, with the same API and the same results (for debugging, and as the
reference the pool is tested against). Every call takes one entry per slot and returns one per slot, in slot
order; a call sends all its requests first and then collects the answers, so the workers run in parallel::

    with EnvPool(functools.partial(SokobanEnv, max_steps=50), num_slots=64, num_workers=8) as pool:
        obs = pool.reset(group_tasks(tasks, group_size=8))   # slots 8i .. 8i+7 share task i
        results = pool.step(actions)                         # None for a slot that is idle or done

Crash semantics. A worker that dies (segfault, ``os._exit``, killed) or does not answer within ``timeout`` seconds
is restarted with fresh environments; its slots are idle until the next reset or restore (``oracle`` also takes a
``timeout`` of its own for one call: SERO's branches bound a planner's search; a worker killed by a timeout is
reported as :class:`WorkerTimeoutError`). The episodes it held are lost:
a slot stepped in the call that saw the crash, or on the next step that gives it an action, returns
``StepResult(last obs, 0.0, True, {won: False, truncated: True, valid: False, worker_crash: <reason>})``. The other
workers' slots are unaffected. ``reset`` and ``restore`` set a slot's state from scratch, so a crash during one is
retried once on the restarted worker (then :class:`WorkerCrashError`) unless it timed out (a deterministic
restore that ran out of time once would again); ``oracle`` and ``snapshot`` raise
:class:`WorkerCrashError`. An exception raised inside an environment is a bug in that environment, not a crash:
inside ``step`` the episode is reported truncated with the traceback in ``info["error"]`` (and logged); inside
the other calls it raises :class:`EnvError` once all slots have answered. The worker is kept either way.

Processes start with ``spawn`` or ``forkserver`` (default), never ``fork``: the parent runs JAX/XLA threads. As
with any ``multiprocessing`` program, a script that builds a pool must guard its entry point with
``if __name__ == "__main__":``. ``make_env`` must be picklable (a class, a module-level function or a
``functools.partial`` of one). Workers are daemonic, ignore SIGINT and exit when the parent's end of their pipe
closes; ``close()`` (also run by the context manager, at garbage collection and at interpreter exit) asks them to
exit, joins them with a timeout and terminates stragglers.

A backend for several hosts (Ray) would fit behind the same API: one actor per worker owning the same block of
slots and answering the same per-slot requests (``_serve`` below), ``_request`` fanning out ``actor.handle.remote``
calls and collecting them with ``ray.wait`` (a dead actor's ``RayActorError`` playing the role of the sentinel).
Only :meth:`EnvPool._request` and the worker start/restart would change; the slot bookkeeping is shared.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, NamedTuple

from envs.base import Env, Obs, Task, step_info

logger = logging.getLogger(__name__)

_IDLE, _RUNNING, _DONE, _LOST = "idle", "running", "done", "lost"  # a slot's state, kept in the parent


class StepResult(NamedTuple):
    """What ``Env.step`` returns, for one slot."""

    obs: Obs
    reward: float
    done: bool
    info: dict[str, Any]  # won, truncated, valid (+ env keys; + error / worker_crash when the pool truncated it)


class EnvError(RuntimeError):
    """An environment raised inside ``reset`` / ``restore`` / ``oracle`` / ``snapshot`` (its traceback is the text)."""


class WorkerCrashError(RuntimeError):
    """A worker died during a call that cannot report the loss per slot (or died again on the retry)."""


class WorkerTimeoutError(WorkerCrashError):
    """The worker was killed because it did not answer within the call's timeout."""


_TIMED_OUT = " timed out: no reply within "  # in the crash reason of a worker killed for its timeout


def timed_out(reason: str) -> bool:
    """Whether a crash reason (``WorkerCrashError`` text, ``info["worker_crash"]``) is a timeout's."""
    return _TIMED_OUT in reason


class _Outcome(NamedTuple):
    kind: str  # "ok", "error" (the env raised: value is the traceback) or "crash" (value is the reason)
    value: Any


def group_tasks(tasks: Sequence[Task], group_size: int) -> list[Task]:
    """Each task ``group_size`` times, contiguously: slots ``i*G .. i*G+G-1`` share task ``i`` (and its seed)."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return [task for task in tasks for _ in range(group_size)]


def _call(env: Env, cmd: str, arg: Any) -> Any:
    """One request on one environment; the same code runs in a worker and in :class:`SerialPool`."""
    if cmd == "reset":
        return env.reset(arg)
    if cmd == "step":
        obs, reward, done, info = env.step(arg)
        return obs, float(reward), bool(done), dict(info)
    if cmd == "restore":
        return env.restore(arg), bool(getattr(env, "done", False))
    if cmd == "oracle":
        return env.oracle()
    if cmd == "snapshot":
        return env.snapshot()
    raise ValueError(f"unknown pool command {cmd!r}")


def _serve(envs: list[Env], cmd: str, args: Mapping[int, Any]) -> dict[int, _Outcome]:
    outcomes = {}
    for slot, arg in args.items():
        try:
            outcomes[slot] = _Outcome("ok", _call(envs[slot], cmd, arg))
        except Exception:
            outcomes[slot] = _Outcome("error", traceback.format_exc())
    return outcomes


class _PoolBase:
    """Slot bookkeeping shared by both pools; subclasses implement ``_request`` (and ``_shutdown``)."""

    num_slots: int

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._state = [_IDLE] * num_slots
        self._last_obs: list[Obs | None] = [None] * num_slots
        self._lost: dict[int, str] = {}  # slot -> crash reason, for a lost episode not yet reported
        self._closed = False

    def _request(self, cmd: str, args: Mapping[int, Any], timeout: float | None = None) -> dict[int, _Outcome]:
        """Runs ``cmd`` on every slot of ``args``; ``timeout``: this call's bound (None: the pool's)."""
        raise NotImplementedError

    def _shutdown(self) -> None:
        raise NotImplementedError

    # -- the API -------------------------------------------------------------------------------------------------
    @property
    def running(self) -> list[bool]:
        """Per slot: whether an episode is in flight (``step`` wants an action for it)."""
        return [state in (_RUNNING, _LOST) for state in self._state]

    def reset(self, tasks: Sequence[Task | None]) -> list[Obs | None]:
        """Starts an episode of ``tasks[i]`` in slot ``i``; a ``None`` task leaves the slot idle."""
        self._check_open()
        self._check_len(tasks, "tasks")
        self._state, self._last_obs, self._lost = [_IDLE] * self.num_slots, [None] * self.num_slots, {}
        todo = {slot: task for slot, task in enumerate(tasks) if task is not None}
        outcomes = self._request_retrying("reset", todo)
        self._raise_errors("reset", outcomes)
        for slot, outcome in outcomes.items():
            self._state[slot], self._last_obs[slot] = _RUNNING, outcome.value
        return list(self._last_obs)

    def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        """Steps every slot with an action; ``None`` for a slot that is idle or whose episode is done (no-op)."""
        self._check_open()
        self._check_len(actions, "actions")
        for slot, action in enumerate(actions):
            if action is not None and self._state[slot] not in (_RUNNING, _LOST):
                raise ValueError(f"slot {slot} has no episode in flight ({self._state[slot]}); pass None")
        results: list[StepResult | None] = [None] * self.num_slots
        todo = {}
        for slot, action in enumerate(actions):
            if action is None:
                continue
            if self._state[slot] == _LOST:  # lost to a crash while not stepped: report it now
                results[slot] = self._truncated(slot, worker_crash=self._lost.pop(slot))
            else:
                todo[slot] = action
        for slot, outcome in self._request("step", todo).items():
            if outcome.kind == "ok":
                result = StepResult(*outcome.value)
                self._state[slot], self._last_obs[slot] = (_DONE if result.done else _RUNNING), result.obs
            elif outcome.kind == "error":
                logger.warning("env in slot %d raised in step(%r); episode truncated\n%s", slot, todo[slot],
                               outcome.value)
                result = self._truncated(slot, error=outcome.value)
            else:
                self._lost.pop(slot, None)
                result = self._truncated(slot, worker_crash=outcome.value)
            results[slot] = result
        return results

    def oracle(self, slots: Sequence[int], *, strict: bool = True,
               timeout: float | None = None) -> list[str | Exception]:
        """The expert's next action in each of ``slots``. ``strict=False``: a slot whose env raised or whose worker
        died gets the :class:`EnvError` / :class:`WorkerCrashError` in its place and the other slots their answer.
        ``timeout``: seconds this call may take (None: the pool's ``timeout``)."""
        return self._query("oracle", slots, strict=strict, timeout=timeout)

    def snapshot(self, slots: Sequence[int], *, strict: bool = True) -> list[Any]:
        """A snapshot of each of ``slots`` (picklable; restore it into any slot of a pool of the same env).
        ``strict=False``: per-slot errors in place of the snapshots, as :meth:`oracle`."""
        return self._query("snapshot", slots, strict=strict)

    def restore(self, slots: Sequence[int], snaps: Sequence[Any], *, strict: bool = True) -> list[Obs | Exception]:
        """Restores ``snaps[k]`` into ``slots[k]`` (any slot: idle, done or lost); returns their observations.
        ``strict=False``: a slot whose restore raised (or whose worker died twice, or timed out) gets the error in
        its place and stays idle; the other slots are restored."""
        self._check_open()
        if len(slots) != len(snaps):
            raise ValueError(f"{len(slots)} slots but {len(snaps)} snapshots")
        todo = dict(zip(self._check_slots(slots), snaps, strict=True))
        for slot in todo:
            self._state[slot], self._last_obs[slot] = _IDLE, None
            self._lost.pop(slot, None)
        if not strict:
            outcomes = self._request_retrying("restore", todo, strict=False)
            out: list[Obs | Exception] = []
            for slot in slots:
                outcome = outcomes[slot]
                if outcome.kind == "ok":
                    obs, done = outcome.value
                    self._state[slot], self._last_obs[slot] = (_DONE if done else _RUNNING), obs
                    out.append(obs)
                else:
                    out.append(self._error("restore", slot, outcome))
            return out
        outcomes = self._request_retrying("restore", todo)
        self._raise_errors("restore", outcomes)
        for slot, outcome in outcomes.items():
            obs, done = outcome.value
            self._state[slot], self._last_obs[slot] = (_DONE if done else _RUNNING), obs
        return [self._last_obs[slot] for slot in slots]

    def close(self) -> None:
        """Shuts the workers down (idempotent)."""
        if not self._closed:
            self._closed = True
            self._shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------------------------------------------
    @staticmethod
    def _error(cmd: str, slot: int, outcome: _Outcome) -> Exception:
        if outcome.kind == "crash":
            error = WorkerTimeoutError if timed_out(outcome.value) else WorkerCrashError
            return error(f"{cmd}: the worker died under slot {slot}: {outcome.value}")
        return EnvError(f"{cmd} raised in slot {slot}:\n{outcome.value}")

    def _query(self, cmd: str, slots: Sequence[int], *, strict: bool = True,
               timeout: float | None = None) -> list[Any]:
        self._check_open()
        slots = self._check_slots(slots)
        for slot in slots:
            if self._state[slot] == _LOST and strict:
                raise WorkerCrashError(f"slot {slot} lost its episode to a worker crash: {self._lost[slot]}")
            if self._state[slot] == _IDLE:
                raise ValueError(f"slot {slot} is idle: no episode to {cmd}")
        if not strict:
            lost = {slot: WorkerCrashError(f"slot {slot} lost its episode to a worker crash: {self._lost[slot]}")
                    for slot in slots if self._state[slot] == _LOST}
            outcomes = self._request(cmd, {slot: None for slot in slots if slot not in lost}, timeout)
            return [lost[slot] if slot in lost else outcomes[slot].value if outcomes[slot].kind == "ok"
                    else self._error(cmd, slot, outcomes[slot]) for slot in slots]
        outcomes = self._request(cmd, dict.fromkeys(slots), timeout)
        crashed = {slot: o.value for slot, o in outcomes.items() if o.kind == "crash"}
        if crashed:
            reasons = sorted(set(crashed.values()))
            error = WorkerTimeoutError if all(map(timed_out, reasons)) else WorkerCrashError
            raise error(f"{cmd}: workers died under slots {sorted(crashed)}: {reasons}")
        self._raise_errors(cmd, outcomes)
        return [outcomes[slot].value for slot in slots]

    def _request_retrying(self, cmd: str, todo: Mapping[int, Any], *, strict: bool = True) -> dict[int, _Outcome]:
        """``_request``, sending the slots of a worker that died once more to its replacement, except a timed-out
        worker's (``strict=False``: a second death or a timeout is left in the outcomes instead of raising)."""
        outcomes = self._request(cmd, todo)
        retry = {slot: todo[slot] for slot, o in outcomes.items() if o.kind == "crash" and not timed_out(o.value)}
        if retry:
            logger.warning("%s: retrying slots %s on the restarted workers", cmd, sorted(retry))
            outcomes.update(self._request(cmd, retry))
        crashed = {slot: o.value for slot, o in outcomes.items() if o.kind == "crash"}
        if crashed and strict:
            if all(map(timed_out, crashed.values())):
                raise WorkerTimeoutError(f"{cmd}: workers timed out under slots {sorted(crashed)}: "
                                         f"{sorted(set(crashed.values()))}")
            raise WorkerCrashError(f"{cmd}: workers died under slots {sorted(crashed)} (after a retry, or timed "
                                   f"out): {sorted(set(crashed.values()))}")
        return outcomes

    def _raise_errors(self, cmd: str, outcomes: Mapping[int, _Outcome]) -> None:
        errors = {slot: o.value for slot, o in outcomes.items() if o.kind == "error"}
        if errors:
            slot = min(errors)
            raise EnvError(f"{cmd} raised in slots {sorted(errors)}; slot {slot}:\n{errors[slot]}")

    def _lose(self, slots: range, reason: str) -> None:
        """A worker holding ``slots`` was replaced: running episodes are lost, the rest become idle."""
        for slot in slots:
            if self._state[slot] in (_RUNNING, _LOST):
                self._state[slot] = _LOST
                self._lost[slot] = reason
            else:
                self._state[slot] = _IDLE

    def _truncated(self, slot: int, **why: str) -> StepResult:
        self._state[slot] = _IDLE if "worker_crash" in why else _DONE
        info = step_info(won=False, truncated=True, valid=False, **why)
        return StepResult(self._last_obs[slot], 0.0, True, info)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the pool is closed")

    def _check_len(self, values: Sequence[Any], what: str) -> None:
        if len(values) != self.num_slots:
            raise ValueError(f"{len(values)} {what} for {self.num_slots} slots")

    def _check_slots(self, slots: Sequence[int]) -> list[int]:
        slots = [int(slot) for slot in slots]
        if len(set(slots)) != len(slots) or any(not 0 <= slot < self.num_slots for slot in slots):
            raise ValueError(f"slots must be distinct and in [0, {self.num_slots}), got {slots}")
        return slots


class SerialPool(_PoolBase):
    """The pool's API and results, stepping every environment in this process (no crash isolation)."""

    def __init__(self, make_env: Callable[[], Env], num_slots: int):
        super().__init__(num_slots)
        self.envs = [make_env() for _ in range(num_slots)]

    def _request(self, cmd: str, args: Mapping[int, Any], timeout: float | None = None) -> dict[int, _Outcome]:
        if timeout is not None:
            raise ValueError(f"SerialPool cannot bound a {cmd} call (timeout={timeout}): its envs run in this "
                             "process; use an EnvPool (RunConfig.workers > 0) for a timeout")
        return _serve(self.envs, cmd, args)

    def _shutdown(self) -> None:
        self.envs = []


# -- the worker processes ------------------------------------------------------------------------------------------
def _worker_main(conn: Connection, make_env: Callable[[], Env], num_slots: int) -> None:
    """A worker: builds its block of envs, then answers ``(cmd, {local slot: arg})`` until told to close."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the parent decides
    faulthandler.enable()  # a segfaulting env leaves its C traceback on stderr
    try:
        envs = [make_env() for _ in range(num_slots)]
    except BaseException:
        conn.send(("init_error", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            cmd, args = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if cmd == "close":
            return
        outcomes = _serve(envs, cmd, args)
        try:
            conn.send(outcomes)
        except (pickle.PicklingError, TypeError, AttributeError):  # pickling fails before anything is written
            tb = traceback.format_exc()
            conn.send({slot: _Outcome("error", tb) for slot in outcomes})


class _Worker(NamedTuple):
    proc: mp.process.BaseProcess
    conn: Connection


def _exit_reason(proc: mp.process.BaseProcess) -> str:
    proc.join(timeout=1.0)
    if proc.is_alive():
        proc.kill()
        proc.join()
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"died: killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"died: killed by signal {-code}"
    return f"died: exit code {code}"


def _shutdown_workers(workers: list[_Worker], join_timeout: float) -> None:
    """Asks every worker to exit, joins them within ``join_timeout``, terminates (then kills) stragglers."""
    for worker in workers:
        try:
            worker.conn.send(("close", None))
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + join_timeout
    for worker in workers:
        worker.proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.proc.is_alive():
            worker.proc.terminate()
            worker.proc.join(timeout=1.0)
        if worker.proc.is_alive():
            worker.proc.kill()
            worker.proc.join()
        worker.conn.close()
    workers.clear()


class EnvPool(_PoolBase):
    """``num_slots`` environments in ``num_workers`` worker processes (module docstring: API and crash semantics).

    Args:
      make_env: builds one environment; picklable (a class or a ``functools.partial``), called in the workers.
      num_slots: environments in the pool, one episode each at a time.
      num_workers: processes; slots go to workers in contiguous blocks of near-equal size (at most ``num_slots``).
      start_method: ``"forkserver"`` or ``"spawn"`` (``fork`` is refused: the parent runs JAX threads).
      timeout: seconds a worker may take to answer one request before it is killed and treated as crashed
        (``oracle``'s own ``timeout`` overrides it for that call).
      join_timeout: seconds ``close()`` waits for the workers to exit before terminating them.
    """

    def __init__(self, make_env: Callable[[], Env], num_slots: int, num_workers: int, *,
                 start_method: str = "forkserver", timeout: float | None = None, join_timeout: float = 5.0):
        super().__init__(num_slots)
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 (SerialPool steps in-process), got {num_workers}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive or None, got {timeout}")
        try:
            pickle.dumps(make_env)
        except Exception as e:
            raise TypeError(f"make_env must be picklable (a class or functools.partial), got {make_env!r}") from e
        self.num_workers = min(num_workers, num_slots)
        self.timeout = timeout
        self._make_env = make_env
        self._ctx = mp.get_context(start_method)
        sizes = [num_slots // self.num_workers + (w < num_slots % self.num_workers) for w in range(self.num_workers)]
        starts = [sum(sizes[:w]) for w in range(self.num_workers)]
        self.bounds = [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]
        self._worker_of = [w for w, block in enumerate(self.bounds) for _ in block]
        self._workers: list[_Worker] = []  # mutated in place (restarts), so the finalizer sees the live ones
        self._finalizer = weakref.finalize(self, _shutdown_workers, self._workers, join_timeout)
        try:
            self._workers.extend(self._start(range(self.num_workers)))
        except BaseException:
            self.close()
            raise

    def worker_pids(self) -> list[int]:
        """The process id of each worker (they change when a worker is restarted)."""
        return [worker.proc.pid for worker in self._workers]

    def worker_of(self, slot: int) -> int:
        return self._worker_of[slot]

    def _start(self, ws: Sequence[int]) -> list[_Worker]:
        """Starts workers ``ws`` together and waits until each has built its environments."""
        started = []
        for w in ws:
            parent_conn, child_conn = self._ctx.Pipe()
            proc = self._ctx.Process(target=_worker_main, args=(child_conn, self._make_env, len(self.bounds[w])),
                                     name=f"envpool-worker-{w}", daemon=True)
            proc.start()
            child_conn.close()  # only the worker holds its end, so its death is EOF here
            started.append(_Worker(proc, parent_conn))
        for w, worker in zip(ws, started, strict=True):
            try:
                kind, value = worker.conn.recv()
            except (EOFError, OSError):
                kind, value = "init_error", _exit_reason(worker.proc)
            if kind != "ready":
                _shutdown_workers(started, 1.0)
                raise RuntimeError(f"worker {w} could not build its environments:\n{value}")
        return started

    def _request(self, cmd: str, args: Mapping[int, Any], timeout: float | None = None) -> dict[int, _Outcome]:
        if timeout is not None and timeout <= 0:
            raise ValueError(f"{cmd}: timeout must be positive or None, got {timeout}")
        timeout = self.timeout if timeout is None else timeout
        by_worker: dict[int, dict[int, Any]] = {}
        for slot, arg in args.items():
            w = self._worker_of[slot]
            by_worker.setdefault(w, {})[slot - self.bounds[w].start] = arg
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: dict[int, dict[int, _Outcome]] = {}
        crashed: dict[int, str] = {}
        for w, local in by_worker.items():  # send everything, then collect
            try:
                self._workers[w].conn.send((cmd, local))
            except (OSError, EOFError):
                crashed[w] = _exit_reason(self._workers[w].proc)
        pending = {w for w in by_worker if w not in crashed}
        while pending:
            waitables = {}
            for w in pending:
                waitables[self._workers[w].conn] = w
                waitables[self._workers[w].proc.sentinel] = w
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(waitables), timeout=remaining)
            if not ready:
                for w in pending:
                    self._workers[w].proc.kill()
                    _exit_reason(self._workers[w].proc)
                    crashed[w] = f"{_TIMED_OUT.strip()} {timeout}s (killed)"
                break
            for w in {waitables[obj] for obj in ready}:
                conn = self._workers[w].conn
                try:
                    if not conn.poll():  # the sentinel fired and nothing is left in the pipe
                        raise EOFError
                    replies[w] = conn.recv()
                except (EOFError, OSError):
                    crashed[w] = _exit_reason(self._workers[w].proc)
                pending.discard(w)
        outcomes = {}
        for w, local_outcomes in replies.items():
            for local, outcome in local_outcomes.items():
                outcomes[self.bounds[w].start + local] = outcome
        for w, reason in crashed.items():
            reason = f"worker {w} (pid {self._workers[w].proc.pid}) {reason}"
            logger.warning("%s during %s; restarting it, its slots %s are idle", reason, cmd, list(self.bounds[w]))
            self._restart(w, reason)
            for local in by_worker[w]:
                outcomes[self.bounds[w].start + local] = _Outcome("crash", reason)
        return outcomes

    def _restart(self, w: int, reason: str) -> None:
        old = self._workers[w]
        old.proc.join(timeout=1.0)
        if old.proc.is_alive():
            old.proc.kill()
            old.proc.join()
        old.conn.close()
        (self._workers[w],) = self._start([w])
        self._lose(self.bounds[w], reason)

    def _shutdown(self) -> None:
        self._finalizer()

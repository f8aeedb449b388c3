"""One multi-process JAX job on this machine: N copies of a command joined through a local coordinator.

:class:`LocalJob` starts ``processes`` copies of ``argv`` with the variables
:func:`~agentjax.parallel.mesh.initialize_distributed` reads (``AGENTJAX_COORDINATOR=localhost:<free port>``,
``AGENTJAX_NUM_PROCESSES``, ``AGENTJAX_PROCESS_ID``), optionally on CPU with ``devices`` fake devices each
(``JAX_PLATFORMS=cpu``, ``XLA_FLAGS=--xla_force_host_platform_device_count``). This is what a cluster launcher does
across hosts (README, "Several hosts"); here it runs the multi-host code paths on one machine (tests, trials).

A multi-host job cannot continue without one of its processes: the others would wait in their next collective
(JAX's coordination service ends them once the lost process misses its heartbeats, ``AGENTJAX_HEARTBEAT_TIMEOUT``).
:meth:`LocalJob.wait` therefore stops the job at the first process that fails — it terminates the others — and raises
:class:`JobFailed` naming the process, how it ended and the end of its error output; a run that checkpoints
continues with ``--resume``. Each process's output goes to ``<log_dir>/process<i>.out`` / ``.err``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

from agentjax.parallel.mesh import ENV_COORDINATOR, ENV_HEARTBEAT_TIMEOUT, ENV_NUM_PROCESSES, ENV_PROCESS_ID

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
STOP_GRACE_SECONDS = 10.0  # after SIGTERM, the others get this long before SIGKILL


class JobFailed(RuntimeError):
    """A process of a :class:`LocalJob` failed (or the job ran out of time); the others were stopped."""

    def __init__(self, message: str, results: list[ProcessResult]):
        super().__init__(message)
        self.results = results


@dataclasses.dataclass(frozen=True)
class ProcessResult:
    """How one process of a job ended."""

    index: int  # its JAX process index
    returncode: int | None  # exit status; negative: killed by that signal; None: still running when stopped
    stdout: str
    stderr: str
    stopped: bool  # ended by the job (another process failed, or the time ran out)


def free_port() -> int:
    """A TCP port on localhost that is free now (the coordinator binds it shortly after)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _ended(code: int | None) -> str:
    if code is None:
        return "was still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def job_env(index: int, processes: int, port: int, *, devices: int | None = None,
            heartbeat_timeout: int | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of process ``index`` (module docstring); ``base`` defaults to this process's."""
    env = dict(os.environ if base is None else base)
    env |= {ENV_COORDINATOR: f"localhost:{port}", ENV_NUM_PROCESSES: str(processes), ENV_PROCESS_ID: str(index)}
    if heartbeat_timeout is not None:
        env[ENV_HEARTBEAT_TIMEOUT] = str(heartbeat_timeout)
    if devices is not None:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
        env["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_COUNT_FLAG}={devices}"])
        env["JAX_PLATFORMS"] = "cpu"
    return env


class LocalJob:
    """``processes`` copies of ``argv`` as one JAX job on this machine (module docstring).

    Args:
      argv: the command of every process (e.g. ``[sys.executable, "-m", "agentjax", "train", ...]``).
      processes: the number of processes.
      devices: fake CPU devices per process (None: the platform's own devices).
      env: extra environment variables for every process.
      log_dir: where the processes' output goes (default: a fresh temporary folder).
      heartbeat_timeout: seconds before JAX's coordination service gives up on a silent process.
    """

    def __init__(self, argv: Sequence[str], processes: int, *, devices: int | None = None,
                 env: Mapping[str, str] | None = None, log_dir: str | None = None,
                 heartbeat_timeout: int | None = None):
        if processes < 1:
            raise ValueError(f"LocalJob: processes must be >= 1, got {processes}")
        self.argv = list(argv)
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="agentjax-job-")
        os.makedirs(self.log_dir, exist_ok=True)
        port = free_port()
        base = dict(os.environ) | dict(env or {})
        self._files, self.procs = [], []
        for i in range(processes):
            out = open(os.path.join(self.log_dir, f"process{i}.out"), "w")  # noqa: SIM115 - closed in _finish
            err = open(os.path.join(self.log_dir, f"process{i}.err"), "w")  # noqa: SIM115
            self._files += [out, err]
            self.procs.append(subprocess.Popen(
                self.argv, stdout=out, stderr=err, start_new_session=True,
                env=job_env(i, processes, port, devices=devices, heartbeat_timeout=heartbeat_timeout, base=base)))
        self._stopped: set[int] = set()
        self._exits: list[int] = []  # process indices in the order they were seen to exit
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self, poll: float = 0.05) -> None:
        """Record the order in which the processes exit (the first failure is the one to report)."""
        while len(self._exits) < len(self.procs):
            for i, p in enumerate(self.procs):
                if i not in self._exits and p.poll() is not None:
                    self._exits.append(i)
            time.sleep(poll)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to process ``index`` (e.g. to test what a lost host does to the job)."""
        self.procs[index].send_signal(sig)

    def _stop_others(self) -> None:
        running = [i for i, p in enumerate(self.procs) if p.poll() is None]
        for i in running:
            self._stopped.add(i)
            self.procs[i].terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for i in running:
            try:
                self.procs[i].wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self.procs[i].kill()
                self.procs[i].wait()

    def _results(self) -> list[ProcessResult]:
        for f in self._files:
            f.close()
        out = []
        for i, p in enumerate(self.procs):
            with open(os.path.join(self.log_dir, f"process{i}.out")) as f_out, \
                    open(os.path.join(self.log_dir, f"process{i}.err")) as f_err:
                out.append(ProcessResult(index=i, returncode=p.returncode, stdout=f_out.read(), stderr=f_err.read(),
                                         stopped=i in self._stopped))
        return out

    def wait(self, timeout: int | float | None = None, poll: float = 0.2) -> list[ProcessResult]:
        """Wait for every process; returns their results when all exited with status 0.

        Raises :class:`JobFailed` at the first process that ends otherwise (the others are stopped first), or when
        ``timeout`` seconds pass (every process is stopped).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in self.procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                seen = [i for i in list(self._exits) if i in failed]
                first = seen[0] if seen else failed[0]
                self._stop_others()
                results = self._results()
                tail = "\n".join(results[first].stderr.strip().splitlines()[-15:])
                raise JobFailed(f"process {first} of {len(self.procs)} {_ended(codes[first])}; the other processes "
                                f"were stopped (a multi-host job cannot continue without one of its processes: start "
                                f"it again, with --resume to continue from the last checkpoint). Its output is in "
                                f"{self.log_dir}; the end of its error output:\n{tail}", results)
            if all(c == 0 for c in codes):
                return self._results()
            if deadline is not None and time.monotonic() > deadline:
                self._stop_others()
                raise JobFailed(f"the job ran past {timeout:.0f} s and was stopped; output in {self.log_dir}",
                                self._results())
            time.sleep(poll)

    def close(self) -> None:
        """Stop whatever still runs."""
        if any(p.poll() is None for p in self.procs):
            self._stop_others()
        for f in self._files:
            if not f.closed:
                f.close()

    def __enter__(self) -> LocalJob:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_local(argv: Sequence[str], processes: int, *, timeout: int | float | None = None,
              **kwargs) -> list[ProcessResult]:
    """Start a :class:`LocalJob` and wait for it (arguments there); raises :class:`JobFailed` if a process fails."""
    with LocalJob(argv, processes, **kwargs) as job:
        return job.wait(timeout)


__all__ = ["JobFailed", "LocalJob", "ProcessResult", "free_port", "job_env", "run_local"]

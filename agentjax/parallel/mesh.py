"""The device mesh ("fsdp", "tp") and multi-host start-up through JAX's own distributed runtime.

One mesh for training and sampling (DESIGN.md, ``agentjax.parallel``)::

    devices  ->  Mesh[fsdp, tp]        fsdp · tp = jax.device_count()  (all hosts together)

``fsdp`` is the data / ZeRO-3 axis (batch rows and parameter shards), ``tp`` the tensor-parallel axis (heads,
MLP width, vocabulary). Which array dimension goes on which axis is data: :mod:`agentjax.parallel.rules`.

Both axes are ``AxisType.Auto``: the partitioner (GSPMD / Shardy) propagates shardings through ordinary
``jnp.einsum`` code and inserts the collectives. ``jax.make_mesh`` defaults to ``Explicit`` axes, under which a
contraction over a sharded dimension is a type error unless annotated, so the types are passed explicitly.

On CPU, fake devices for tests: ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` set before JAX starts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh

FSDP = "fsdp"
TP = "tp"
AXES = (FSDP, TP)

ENV_COORDINATOR = "AGENTJAX_COORDINATOR"
ENV_NUM_PROCESSES = "AGENTJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "AGENTJAX_PROCESS_ID"
ENV_HEARTBEAT_TIMEOUT = "AGENTJAX_HEARTBEAT_TIMEOUT"  # seconds before the job gives up on a silent process

# Launchers whose variables JAX's cluster auto-detection reads (jax/_src/clusters): a call without arguments
# hands over to JAX when one of them is present.
_CLUSTER_MARKERS = (
    "OMPI_MCA_orte_hnp_uri",  # Open MPI (mpirun)
    "TPU_WORKER_HOSTNAMES",  # Cloud TPU on GKE
    "TPU_PROCESS_ADDRESSES",  # Cloud TPU on GKE
    "MEGASCALE_COORDINATOR_ADDRESS",  # multi-slice Cloud TPU
)


def make_mesh(fsdp: int, tp: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``(fsdp, tp)`` mesh with axis names ``("fsdp", "tp")``, both ``AxisType.Auto``.

    Args:
      fsdp: size of the data / FSDP axis.
      tp: size of the tensor-parallel axis. Put it on the fastest interconnect: ``jax.make_mesh`` orders the
        devices so that the last axis is the most local one.
      devices: the devices to lay out (default ``jax.devices()``, every device of every process); their count must
        be ``fsdp * tp``.

    Raises:
      ValueError: a size below 1, or ``fsdp * tp`` differs from the number of devices.
    """
    if fsdp < 1 or tp < 1:
        raise ValueError(f"mesh sizes must be >= 1, got fsdp={fsdp}, tp={tp}")
    devices = list(jax.devices() if devices is None else devices)
    if fsdp * tp != len(devices):
        platform = devices[0].platform if devices else "?"
        raise ValueError(
            f"mesh fsdp={fsdp} x tp={tp} needs {fsdp * tp} devices, but there are {len(devices)} ({platform}). "
            "Choose sizes whose product is the device count; on CPU, fake devices come from setting "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={fsdp * tp} before JAX is imported."
        )
    return jax.make_mesh((fsdp, tp), AXES, axis_types=(AxisType.Auto, AxisType.Auto), devices=devices)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
    *,
    auto_detect: bool = False,
) -> bool:
    """Joins this process to a multi-host JAX job (``jax.distributed.initialize``); a no-op for one process.

    Call it first thing, before any JAX computation (``jax.devices()`` included): afterwards ``jax.devices()`` lists
    every device of every host and :func:`make_mesh` spans them all.

    Argument resolution, each independently: the explicit argument, else the environment variable
    ``AGENTJAX_COORDINATOR`` (``"host:port"`` of process 0), ``AGENTJAX_NUM_PROCESSES``, ``AGENTJAX_PROCESS_ID``.
    Then:

    * the runtime is already up (a second call): nothing happens, returns True;
    * ``num_processes`` resolves to 1: single process, nothing happens, returns False;
    * nothing resolved: on a managed cluster JAX detects everything itself (SLURM with several tasks, Open MPI,
      Cloud TPU on GKE / multi-slice, recognised from their environment variables), so
      ``jax.distributed.initialize()`` is called without arguments; pass ``auto_detect=True`` where the launcher
      leaves no variable to recognise (Cloud TPU VMs read their topology from the metadata server). Elsewhere
      this is a plain single-process run: nothing happens, returns False;
    * otherwise ``jax.distributed.initialize`` gets the resolved values; JAX fills in any it can detect and raises
      if it cannot.

    ``AGENTJAX_HEARTBEAT_TIMEOUT`` (seconds, default JAX's 100) is how long the coordination service waits for a
    process that stopped answering (a crashed or killed host) before it ends every other process of the job with an
    error; a multi-host job cannot continue without one of its processes (README, "Several hosts").

    Args:
      coordinator_address: ``"host:port"`` of process 0's coordinator service (the same on every process).
      num_processes: the number of processes.
      process_id: this process's rank in ``[0, num_processes)``.
      local_device_ids: restrict this process to these local devices (e.g. one GPU per process).
      auto_detect: call ``jax.distributed.initialize()`` even when no argument, variable or launcher is found.

    Returns:
      True when the distributed runtime is running after the call, False for a single-process run.
    """
    if jax.distributed.is_initialized():
        return True
    if coordinator_address is None:
        coordinator_address = os.environ.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = _env_int(ENV_NUM_PROCESSES)
    if process_id is None:
        process_id = _env_int(ENV_PROCESS_ID)
    if num_processes == 1:
        return False
    if coordinator_address is None and num_processes is None and process_id is None and local_device_ids is None:
        if not (auto_detect or _managed_cluster()):
            return False
    heartbeat = _env_int(ENV_HEARTBEAT_TIMEOUT)
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids,
                               **({"heartbeat_timeout_seconds": heartbeat} if heartbeat is not None else {}))
    return True


def _managed_cluster() -> bool:
    """A multi-process launch by SLURM, Open MPI or Cloud TPU on GKE, judged from the launcher's variables."""
    slurm_tasks = _env_int("SLURM_NTASKS") or _env_int("SLURM_STEP_NUM_TASKS") or 1
    if "SLURM_JOB_ID" in os.environ and slurm_tasks > 1:
        return True
    return any(os.environ.get(name) for name in _CLUSTER_MARKERS)

"""SPMD training on several processes: 2 processes x 4 CPU devices train as 1 process x 8 devices.

``agentjax train`` runs the same tiny configs on an (fsdp 8, tp 1) mesh twice: as one process with 8 devices and as
a job of 2 processes with 4 devices each (:class:`agentjax.parallel.launch.LocalJob`; each process plays its share
of the groups and of the eval tasks, the batch is assembled on the mesh, process 0 writes the files). Compared:
every metrics line (steps and keys the same; counts, rollout and tree statistics, evaluation outcomes exactly; the
other floats within ``REL`` relative or ``ATOL`` absolute — the KL estimates are means of differences of
log-probs of order 1, so their rounding is absolute), the evaluation files, and the final checkpoint (the same
arrays; integers — step, data position, PRNG stream, schedule — exactly, floats within ``CKPT_REL`` of each
array's largest value). Not bit for bit: the sampler runs on each host's 4 devices instead of the mesh's 8 and the
cross-process all-reduce sums in another order, so log-probs and gradients differ in their last bits; AdamW divides
each gradient entry by ``sqrt(v) + eps``, which turns such a difference on an entry whose gradient is near 0 into
a difference of a small fraction of the learning rate in the parameters. A flat method (GRPO on Sokoban) and RAO
(TextCraft-Synth). Then a lost process: SIGKILL to process 1 after the first checkpoint stops the job with an
error naming it, and ``--resume`` finishes the run with the uninterrupted 2-process run's numbers, bit for bit.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from agentjax.parallel.launch import JobFailed, LocalJob, run_local

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = [sys.executable, "-c", "import sys; from agentjax.cli import main; sys.exit(main(sys.argv[1:]))", "train"]
COMMON = ["--preset", "tiny", "--no-warm-start", "--eval-seeds", "1", "--mesh", "8", "1", "--no-tensorboard",
          "--no-progress"]
# GRPO: 4 Sokoban groups x 4 rollouts x <= 5 turns, 3 updates, a checkpoint after each, evaluation after the last
FLAT = ["--method", "grpo", "--env", "sokoban", *COMMON, "--updates", "3", "--checkpoint-every", "1",
        "--eval-every", "3", "--eval-tasks", "4", "--num-groups", "4", "--group-size", "4", "--max-steps", "5"]
# RAO: 2 TextCraft-Synth root tasks x 4 trees (one task per process), 2 optimizer steps, evaluation on 2 tasks
RAO = ["--method", "rao", "--env", "textcraft_synth", *COMMON, "--updates", "2", "--eval-every", "2",
       "--eval-tasks", "2", "--num-groups", "2"]
REL, ATOL = 1e-6, 1e-7  # agreement of float metrics between the two layouts
CKPT_REL = 2e-4  # agreement of checkpointed floats, relative to each array's largest magnitude
TIMEOUT = 1500
ENV = {"PYTHONPATH": ROOT, "AGENTJAX_DATA": os.environ.get("AGENTJAX_DATA", os.path.join(ROOT, "..", "shared",
                                                                                          "data"))}


def one_process(args: list[str], out: str) -> None:
    env = dict(os.environ) | ENV | {"JAX_PLATFORMS": "cpu",
                                    "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    done = subprocess.run([*CLI, *args, "--out-dir", out], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]


def two_processes(args: list[str], out: str) -> None:
    run_local([*CLI, *args, "--out-dir", out], 2, devices=4, env=ENV, timeout=TIMEOUT,
              log_dir=out + "-logs")


def metrics(out: str) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


# collector bookkeeping that depends on how the batch was split, not on what was played
LAYOUT_KEYS = ("rollout/num_padded_rows",)


def compare_lines(a: list[dict], b: list[dict]) -> dict:
    """Same steps and keys; equal counts and statistics of the episodes; floats within REL (or ATOL). Returns the
    largest relative and absolute differences and their keys."""
    assert [x["step"] for x in a] == [x["step"] for x in b]
    worst, largest = (0.0, ""), (0.0, "")
    for x, y in zip(a, b, strict=True):
        keys = {k for k in x if not k.startswith("time")}  # "time" and "time/...": wall-clock values
        assert keys == {k for k in y if not k.startswith("time")}, x["step"]
        for k in sorted(keys):
            u, v = x[k], y[k]
            if k in LAYOUT_KEYS or u == v or (isinstance(u, float) and math.isnan(u) and math.isnan(v)):
                continue
            assert not k.startswith(("rollout/", "tree/", "eval/", "judge/", "schedule/")), (x["step"], k, u, v)
            assert abs(u - v) <= REL * max(abs(u), abs(v)) + ATOL, (x["step"], k, u, v)
            worst = max(worst, (abs(u - v) / max(abs(u), abs(v)), f"step {x['step']} {k}"))
            largest = max(largest, (abs(u - v), f"step {x['step']} {k}"))
    return {"max_rel": worst[0], "at": worst[1], "max_abs": largest[0], "abs_at": largest[1]}


def saved_arrays(out: str, step: int) -> dict[str, np.ndarray]:
    """The arrays of checkpoint ``step`` by key path, read as NumPy (no mesh needed)."""
    path = os.path.join(out, "checkpoints", str(step), "state")
    reader = ocp.PyTreeCheckpointer()
    tree = reader.metadata(path)
    tree = getattr(tree, "item_metadata", tree)
    tree = getattr(tree, "tree", tree)
    arrays = reader.restore(path, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                                            tree))
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(arrays)}


def compare_checkpoints(a: str, b: str) -> dict:
    steps_a = sorted(int(n) for n in os.listdir(os.path.join(a, "checkpoints")) if n.isdigit())
    steps_b = sorted(int(n) for n in os.listdir(os.path.join(b, "checkpoints")) if n.isdigit())
    assert steps_a == steps_b
    x, y = saved_arrays(a, steps_a[-1]), saved_arrays(b, steps_b[-1])
    assert x.keys() == y.keys()
    worst, bitwise = 0.0, True
    for k in x:
        assert x[k].shape == y[k].shape and x[k].dtype == y[k].dtype, k
        if not np.issubdtype(x[k].dtype, np.floating):
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)
            continue
        scale = max(float(np.abs(x[k]).max()), 1e-30)
        diff = float(np.abs(x[k].astype(np.float64) - y[k]).max()) / scale
        bitwise &= bool(np.array_equal(x[k], y[k]))
        assert diff <= CKPT_REL, (k, diff)
        worst = max(worst, diff)
    return {"step": steps_a[-1], "max_rel": worst, "bitwise": bitwise, "arrays": len(x)}


def compare_evals(a: str, b: str) -> None:
    names = sorted(os.listdir(os.path.join(a, "eval")))
    assert names == sorted(os.listdir(os.path.join(b, "eval"))) and names
    for name in names:
        if name.endswith(".json"):
            with open(os.path.join(a, "eval", name)) as f, open(os.path.join(b, "eval", name)) as g:
                assert json.load(f) == json.load(g), name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("multihost_train")


@pytest.mark.slow  # four short training runs, two of them as 2-process jobs: `make test-slow`
@pytest.mark.multiprocess
@pytest.mark.parametrize("name,args", [("grpo", FLAT), ("rao", RAO)])
def test_two_processes_train_as_one(runs, name, args):
    one, two = str(runs / f"{name}-1x8"), str(runs / f"{name}-2x4")
    one_process(args, one)
    two_processes(args, two)
    lines = compare_lines(metrics(one), metrics(two))
    arrays = compare_checkpoints(one, two)
    compare_evals(one, two)
    assert arrays["arrays"] > 10 and len(metrics(one)) >= 2
    print(f"{name}: metrics max rel diff {lines['max_rel']:.2e} ({lines['at']}), max abs {lines['max_abs']:.2e} "
          f"({lines['abs_at']}); checkpoint step {arrays['step']} max rel diff {arrays['max_rel']:.2e}, bitwise "
          f"{arrays['bitwise']}")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_killed_process_stops_the_job_and_resume_finishes_it(runs):
    """SIGKILL to process 1 once the first checkpoint is on disk: the job stops with an error naming it; the same
    command with --resume finishes the run with the numbers of the uninterrupted 2-process run."""
    out = str(runs / "grpo-killed")
    with LocalJob([*CLI, *FLAT, "--out-dir", out], 2, devices=4, env=ENV, log_dir=out + "-logs") as job:
        first = os.path.join(out, "checkpoints", "1")
        deadline = time.monotonic() + TIMEOUT
        while not os.path.isdir(first) and time.monotonic() < deadline:
            assert all(p.poll() is None for p in job.procs), "the job ended before its first checkpoint"
            time.sleep(0.5)
        job.kill(1)
        with pytest.raises(JobFailed, match="(?s)process 1 of 2 was killed by SIGKILL.*--resume"):
            job.wait(timeout=300)
    assert max(line["step"] for line in metrics(out)) < 3  # stopped before the end
    two_processes([*FLAT, "--resume"], out)
    uninterrupted = str(runs / "grpo-2x4")
    if not os.path.exists(uninterrupted):
        two_processes(FLAT, uninterrupted)
    a, b = metrics(uninterrupted), metrics(out)
    assert [x["step"] for x in b] == [x["step"] for x in a]
    for x, y in zip(a, b, strict=True):  # the same processes and programs: the same numbers
        assert {k: v for k, v in x.items() if not k.startswith("time")} == {
            k: v for k, v in y.items() if not k.startswith("time")}, x["step"]
    assert compare_checkpoints(uninterrupted, out)["bitwise"]

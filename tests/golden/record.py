"""Record the golden runs (tests/train/test_golden.py) on this machine: ``python -m tests.golden.record [NAME ...]``.

Each run is ``agentjax train <RUNS[name]> --out-dir <tmp>``, trained in this process under the test suite's settings
(``tests/conftest.py`` is imported before jax: 8 fake CPU devices, rank promotion "raise"; XLA's optimisations on,
as the test's ``optimised_xla`` fixture turns them on), and written to ``tests/golden/<name>.json`` with the commit
it ran. ``--check`` writes nothing: it trains each run again and reports whether it reproduces the file bit for bit
(metrics lines and parameter digest). Record from a clean checkout of the commit whose numbers the golden set keeps
(README.md here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import tests.conftest  # noqa: F401  (the suite's jax settings, before anything imports jax)
from tests.train.test_golden import GOLDEN, metric_differences, run_golden

# Shared by every run: the tiny preset from random init, 3 updates, one small evaluation at the start and one after
# the last update, no TensorBoard, no progress bar (the checkpoint after the last update is always written).
COMMON = ["--preset", "tiny", "--no-warm-start", "--updates", "3", "--eval-every", "3", "--eval-seeds", "1",
          "--no-tensorboard", "--no-progress"]
SOKOBAN = ["--env", "sokoban", *COMMON, "--eval-tasks", "4"]  # 16 groups x 8 rollouts x 15 turns, 1,920 rows
TREES = ["--env", "textcraft_synth", *COMMON, "--eval-tasks", "2"]  # 2 tasks x 4 trees, 8 turns a node
RUNS = {
    "grpo_sokoban": ["--method", "grpo", *SOKOBAN],
    "ppo_sokoban": ["--method", "ppo", *SOKOBAN],
    "crbc_sokoban": ["--method", "crbc", *SOKOBAN],
    "gigpo_sero_sokoban": ["--method", "gigpo", *SOKOBAN, "--sero"],
    "rao_textcraft_synth": ["--method", "rao", *TREES],
    "sera_textcraft_synth": ["--method", "sera", *TREES],
}


def _commit() -> dict[str, object]:
    """The checkout's commit and whether the library's files differ from it (a golden set records a commit)."""
    root = Path(__file__).resolve().parents[2]
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "agentjax", "envs", "pyproject.toml"],
                           capture_output=True, text=True).stdout.split("\n")
    return {"commit": head, "library_changes": [line for line in dirty if line.strip()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"runs to record (default: all of {', '.join(RUNS)})")
    parser.add_argument("--check", action="store_true", help="re-run and compare bit for bit; write nothing")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in RUNS]
    if unknown:
        parser.error(f"unknown run(s) {unknown}; choose from {list(RUNS)}")
    import jax

    # XLA's optimisations on, as the test turns them on (tests/conftest.py's `optimised_xla` fixture): these runs are
    # long enough that optimised code pays for its compilation (about 6 minutes for the set against 10 without).
    jax.config.update("jax_disable_most_optimizations", False)
    failed = 0
    for name in args.names or RUNS:
        with tempfile.TemporaryDirectory(prefix=f"golden-{name}-") as tmp:
            got = run_golden(RUNS[name], Path(tmp) / "run")
        path = GOLDEN / f"{name}.json"
        if not args.check:
            got = {"recorded_from": _commit()} | got
            path.write_text(json.dumps(got, indent=1) + "\n")
            print(f"{name}: {got['seconds']:.0f} s, params {got['params']['sha256'][:16]} -> {path}", flush=True)
            continue
        want = json.loads(path.read_text())
        same = json.dumps([got["metrics"], got["params"]]) == json.dumps([want["metrics"], want["params"]])  # NaN too
        close = metric_differences(got["metrics"], want["metrics"])
        print(f"{name}: {got['seconds']:.0f} s, {'bit-identical' if same else 'DIFFERENT'} "
              f"(params {got['params']['sha256'][:16]} vs {want['params']['sha256'][:16]}; "
              f"{len(close)} metric values beyond tolerance)", flush=True)
        for line in close[:20]:
            print("   ", line)
        failed += not same
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

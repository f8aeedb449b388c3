"""experiments/bench/faults.py ``--quick``: malformed replies through the collector on Sokoban and the MDPs and
through the tree / rubric / verdict parsers, env workers killed mid-episode and between batches, an HTTP judge that
is down, slow or answers garbage, and the CLI's checks before work — every injected fault survived, written to the
JSON that the README's "Reliability" table reads (the trainer parts run in the full benchmark only)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "bench" / "faults.py"


def test_quick_faults_are_all_survived(tmp_path):
    out = tmp_path / "faults.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    data = json.loads(out.read_text()) if out.exists() else None
    assert data is not None, (proc.stdout + proc.stderr)[-4000:]
    rows = {r["fault"].split(" (")[0].split(",")[0]: r for r in data["results"]}
    assert set(rows) == {"malformed reply", "env worker SIGKILL", "HTTP judge down / slow / garbage",
                         "missing data / checkpoint"}, list(rows)
    lost = [(r["fault"], c) for r in data["results"] for c in r["cases"] if not c["ok"]]
    assert proc.returncode == 0 and not lost, lost[:5]
    for row in data["results"]:
        assert row["injected"] == row["survived"] == len(row["cases"]) > 0 and row["lost"] == 0 and not row["not_run"]
    flat = next(r for r in data["results"] if r["fault"].startswith("malformed reply, flat"))
    assert {c["env"] for c in flat["cases"]} == {"sokoban", "mdp"}
    assert {c["category"] for c in flat["cases"]} >= {"random bytes", "unclosed tag", "nested tags",
                                                      "10,000 characters", "wrong case / near miss",
                                                      "talks to the parser", "runs if executed"}
    workers = rows["env worker SIGKILL"]["cases"]
    assert sum(c["episodes_lost"] > 0 for c in workers) == 2 and any(c["turn"] is None for c in workers)
    judge = {c["mode"]: c for c in rows["HTTP judge down / slow / garbage"]["cases"]}
    assert judge["down"]["attempts"] == judge["slow"]["attempts"] == 3 and judge["garbage"]["attempts"] == 1
    assert data["meta"]["quick"] and data["meta"]["parts"] == ["malformed", "env_workers", "judge", "preflight"]

"""The committed tables rebuild from their compact JSON alone (run folders are not in git), and the report API's
records: read from a run's folder, else from the results JSON, written and read back unchanged."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np
import pytest

from agentjax.train.metrics import MetricsWriter
from experiments.crbc import report as report_module
from experiments.crbc.presets import METHODS, SEEDS, pool_run, smoke_run

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRBC, SERO = ROOT / "experiments" / "crbc" / "results", ROOT / "experiments" / "sero" / "results"


def test_the_crbc_pool_table_rebuilds_from_its_json(tmp_path):
    """`python experiments/crbc/run.py --pool --report-only` on a fresh clone: no run folders, so every record comes
    from the committed pool_results.json, and the table is the committed one to the character."""
    from experiments.crbc.run import report

    shutil.copy(CRBC / "pool_results.json", tmp_path)
    runs = {(m, s): pool_run(m, s, results=str(tmp_path)) for s in SEEDS for m in METHODS}
    assert not any(os.path.exists(r.out_dir) for r in runs.values())
    report(runs, str(tmp_path), "pool")
    assert (tmp_path / "pool_results.md").read_text() == (CRBC / "pool_results.md").read_text()
    assert json.loads((tmp_path / "pool_results.json").read_text()) == json.loads(
        (CRBC / "pool_results.json").read_text())


def test_the_sero_pool_tables_rebuild_from_their_json(tmp_path):
    """`python experiments/sero/run.py --pool --report-only`: the comparison and the branch table (from the
    records' sero/ metric series) from the committed pool_results.json."""
    from experiments.sero import run as sero
    from experiments.sero.presets import METHODS as SERO_METHODS

    shutil.copy(SERO / "pool_results.json", tmp_path)
    runs = sero.comparison(SERO_METHODS, SEEDS, results=str(tmp_path), name="pool")
    sero.report(runs, str(tmp_path), "pool", "SERO tiny experiment", "python experiments/sero/run.py --pool")
    for table in ("pool_results.md", "pool_branches.md"):
        assert (tmp_path / table).read_text() == (SERO / table).read_text(), table


def _write_run(out_dir: str, outcomes: dict[int, list], success: float) -> None:
    os.makedirs(os.path.join(out_dir, "eval", "held_out"), exist_ok=True)
    for step, o in outcomes.items():
        for folder in ("eval", os.path.join("eval", "held_out")):
            with open(os.path.join(out_dir, folder, f"{step}.json"), "w") as f:
                json.dump({"step": step, "outcomes": o}, f)
    with MetricsWriter(out_dir, tensorboard=False) as w:
        for step in (1, 2):
            w.write(step, {"rollout/success_rate": success, "sero/roots_attempted": 3.0 * step, "time/total": 2.0})


def test_gather_reads_run_folders_and_falls_back_to_the_results_json(tmp_path):
    """A run with evaluations is read from its folder; one without, from the JSON that the last report wrote; the
    JSON round trip keeps every outcome, series and metric asked for."""
    runs = {(m, 0): smoke_run(m, 0, results=str(tmp_path)) for m in ("grpo", "crbc")}
    _write_run(runs[("grpo", 0)].out_dir, {0: [[1, 0], [0, 0]], 2: [[1, 1], [1, 0]]}, 0.25)
    _write_run(runs[("crbc", 0)].out_dir, {0: [[1, 0], [0, 0]], 2: [[1, 1], [1, 1]]}, 0.5)
    path = report_module.results_path(str(tmp_path), "t")
    records = report_module.gather(runs, path, metric_keys=("sero/",))
    grpo = records[("grpo", 0)]
    assert grpo.train_success == {1: 0.25, 2: 0.25} and grpo.steps == 2 and grpo.source == runs[("grpo", 0)].out_dir
    assert grpo.metrics == {"sero/roots_attempted": {1: 3.0, 2: 6.0}}  # time/total not asked for
    np.testing.assert_array_equal(grpo.eval[2], [[1, 1], [1, 0]])
    report_module.write_report(records, str(tmp_path), "t", "# t\n\n", config={"out_dir": str(tmp_path)})
    first = (tmp_path / "t_results.md").read_text()
    shutil.rmtree(runs[("crbc", 0)].out_dir)  # a fresh clone of this table: crbc's record from the JSON
    again = report_module.gather(runs, path, metric_keys=("sero/",))
    assert again[("crbc", 0)].source == path and again[("grpo", 0)].source != path
    for key, record in records.items():
        for field in ("train_success", "initial_policy", "metrics", "steps"):
            assert getattr(again[key], field) == getattr(record, field), (key, field)
        for series in ("eval", "held_out"):
            a, b = getattr(again[key], series), getattr(record, series)
            assert list(a) == list(b) and all(np.array_equal(a[u], b[u]) for u in a)
    report_module.write_report(again, str(tmp_path), "t", "# t\n\n")
    assert (tmp_path / "t_results.md").read_text() == first
    shutil.rmtree(runs[("grpo", 0)].out_dir)  # nothing left but the JSON
    assert set(report_module.gather(runs, path)) == set(runs)


def test_a_table_without_records_renders_its_stored_statistics(tmp_path):
    """A table made before records were kept (its JSON has "results" and no "runs") is rendered again from what it
    stores; with neither runs nor a stored table the report says so."""
    runs = {("grpo", 0): smoke_run("grpo", 0, results=str(tmp_path))}
    _write_run(runs[("grpo", 0)].out_dir, {0: [[1, 0]], 2: [[1, 1]]}, 0.5)
    table = report_module.write_report(runs, str(tmp_path), "t", "# t\n\n")
    first = (tmp_path / "t_results.md").read_text()
    data = json.loads((tmp_path / "t_results.json").read_text())
    del data["runs"]
    (tmp_path / "t_results.json").write_text(json.dumps(data))
    shutil.rmtree(runs[("grpo", 0)].out_dir)
    again = report_module.write_report(runs, str(tmp_path), "t", "# t\n\n")
    assert again["grpo"]["final"]["mean"] == table["grpo"]["final"]["mean"]
    assert (tmp_path / "t_results.md").read_text() == first
    with pytest.raises(FileNotFoundError, match="stores no table"):
        report_module.write_report(runs, str(tmp_path / "empty"), "t", "# t\n\n")

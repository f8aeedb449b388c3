"""notebooks/sera_rubrics.ipynb, executed headless (nbclient, a python3 ipykernel) with the small CI settings.

The notebook reads ``AGENTJAX_NOTEBOOK_SMALL=1`` (it trains :func:`experiments.sera.calibration.small_run` — three
SERA steps, one per stage — into a temporary folder) and writes its numbers to the JSON named by ``SERA_NB_OUT`` and
a PNG beside it. Checked: the committed notebook has no outputs; every cell runs; the per-batch table equals an
independent recomputation from the run's saved tree files (explicit loops over every (success, failure) pair);
the rubric stage's batch is reported; values are in range and the figure is a real image.
"""

from __future__ import annotations

import json
import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "sera_rubrics.ipynb"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sera_notebook") / "sera.json"
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SERA_NB_RUN", raising=False)
        mp.setenv("AGENTJAX_NOTEBOOK_SMALL", "1")
        mp.setenv("SERA_NB_OUT", str(out))
        mp.setenv("JAX_PLATFORMS", "cpu")
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return nb, json.loads(out.read_text())


def test_committed_notebook_is_valid_and_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def _by_hand(run_dir: str) -> dict[int, dict]:
    """Per saved training batch: (score, flag, label) of each graded child, and the pairwise accuracy by loops."""
    out = {}
    for name in os.listdir(os.path.join(run_dir, "trees")):
        if not name[0].isdigit():
            continue
        saved = json.load(open(os.path.join(run_dir, "trees", name)))
        kids = [(n["grade"]["final_score"], n["grade"]["success"], n["label"]) for t in saved["trees"]
                for n in t["nodes"][1:] if n.get("grade") and n.get("label") is not None]
        if not kids:
            continue
        wins, pairs = 0.0, 0
        for s_pos, _, y_pos in kids:
            for s_neg, _, y_neg in kids:
                if y_pos == 1.0 and y_neg == 0.0:
                    pairs += 1
                    wins += 1.0 if s_pos > s_neg else 0.5 if s_pos == s_neg else 0.0
        out[saved["step"]] = {"n": len(kids), "pairwise_accuracy": wins / pairs if pairs else None,
                              "agreement": sum(f == (y == 1.0) for _, f, y in kids) / len(kids)}
    return out


def test_runs_and_matches_the_saved_trees(run):
    nb, res = run
    assert not any(o.output_type == "error" for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert res["config"]["small"] and res["children"] == sum(r["n"] for r in res["by_step"])
    hand = _by_hand(res["config"]["run"])
    assert sorted(hand) == [r["step"] for r in res["by_step"]]
    for row in res["by_step"]:
        want = hand[row["step"]]
        assert row["n"] == want["n"] and row["agreement"] == pytest.approx(want["agreement"])
        if want["pairwise_accuracy"] is None:
            assert row["pairwise_accuracy"] is None
        else:
            assert row["pairwise_accuracy"] == pytest.approx(want["pairwise_accuracy"])
        for key in ("score_success", "score_failure"):
            assert row[key] is None or 0.0 <= row[key] <= 1.0
    assert [s["step"] for s in res["rubric_steps"]] and all(s["optimizer_step"] is not None
                                                            for s in res["rubric_steps"])
    (figure,) = map(pathlib.Path, res["figures"])
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size > 10_000

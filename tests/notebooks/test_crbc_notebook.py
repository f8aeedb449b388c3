"""notebooks/crbc_credit_analysis.ipynb, executed headless (nbclient, a python3 ipykernel) with the small CI settings.

The notebook reads ``AGENTJAX_NOTEBOOK_SMALL=1`` (2 ε × 6 rooms × 8 rollouts, depths 0, 2, ∞) and writes its
numbers to the JSON named by ``CRBC_NB_OUT`` (a temporary folder here) and three PNGs beside it. Checked: the
committed notebook has no outputs; every cell runs without error; the JSON's rollout summary equals an
independent run of the helper with the same settings in this process (the notebook is deterministic in its
seed) and the Monte Carlo success rate agrees with the exact one; coverage grows with depth and never shrinks
per visit; Proposition 1 holds and the closure gap never grows with K; the GRPO and RLOO correlations equal a
recomputation here; every correlation is a number in [-1, 1] with its bootstrap interval around it; CRBC's
credit correlates positively with the true advantage; the PNGs are real images and the tables are shown.
"""

from __future__ import annotations

import json
import pathlib

import nbformat  # test dependency: nbformat, nbclient, ipykernel, matplotlib (pyproject's test extra)
import numpy as np
import pytest
from nbclient import NotebookClient

from agentjax.credit import batched_grpo, batched_rloo
from experiments.crbc import credit_analysis as ca

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "crbc_credit_analysis.ipynb"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(executed notebook, results JSON, JSON path, the config the notebook used)."""
    out = tmp_path_factory.mktemp("crbc_notebook") / "crbc.json"
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as mp:
        for var in ca.ENV_VARS:
            mp.delenv(var, raising=False)
        mp.setenv("AGENTJAX_NOTEBOOK_SMALL", "1")
        mp.setenv("CRBC_NB_OUT", str(out))
        mp.setenv("JAX_PLATFORMS", "cpu")
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    config = ca.AnalysisConfig.small()
    return nb, json.loads(out.read_text()), out, config


@pytest.fixture(scope="module")
def independent(run):
    """The same small config's rollouts, collected again in this process."""
    return ca.collect_groups(run[3])


def eligible_rows(rollouts) -> np.ndarray:
    """[N] the row's anchor has >= 2 distinct actions in its group (CRBC's eligibility, by hand)."""
    b = rollouts.batch
    key_n = list(zip(np.asarray(b.group).tolist(), np.asarray(b.anchor).tolist(), strict=True))
    actions = {}
    for k, a in zip(key_n, np.asarray(b.action).tolist(), strict=True):
        actions.setdefault(k, set()).add(a)
    return np.asarray([len(actions[k]) >= 2 for k in key_n])


def test_committed_notebook_is_valid_and_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_runs_and_writes_results(run):
    nb, res, out, config = run
    assert res["config"]["epsilons"] == list(config.epsilons) and res["config"]["out"] == str(out)
    assert set(res) >= {"summary", "coverage", "values", "accuracy", "accuracy_by_truth", "ranking", "figures"}
    assert len(res["figures"]) == 3
    for path in map(pathlib.Path, res["figures"]):  # absolute here (outside the repository), else relative to it
        assert path.parent == out.parent and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 10_000
    shown = "".join(o.get("data", {}).get("text/markdown", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.outputs)
    assert "| CRBC |" in shown and "| GraphGPO |" in shown
    assert not any(o.output_type == "error" for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_summary_matches_an_independent_run(run, independent):
    _, res, out, config = run
    rollouts = independent
    expected = ca.summary(rollouts, config.horizon)
    for eps, s in expected.items():
        got = res["summary"][eps]
        assert got == pytest.approx(s)
        assert abs(got["success"] - got["exact_success"]) <= 4 * got["mc_stderr"] + 0.02
    assert res["summary"]["all"]["visits"] == len(rollouts.state_n)


def test_coverage_and_convergence(run):
    _, res, _, config = run
    cov = res["coverage"]
    labels = [*map(str, config.depths), "inf"]
    assert list(cov["by_depth"]) == labels
    for key in ("share_all", "share_multi", "mean"):
        seq = [cov["by_depth"][k][key] for k in labels]
        assert seq == sorted(seq), key
    for k in labels:
        assert sum(cov["by_depth"][k]["hist"]) == pytest.approx(1.0)
        assert cov["by_depth"][k]["hist"][0] == 0.0  # a visit always draws on its own rollout
    paired = np.asarray(cov["paired_k0_inf"])
    assert paired.sum() == pytest.approx(1.0) and np.allclose(np.tril(paired, -1), 0.0)
    assert 0.0 < cov["eligible_share"] <= 1.0 and 0.0 <= cov["share_increased"] <= 1.0
    val = res["values"]
    assert val["bound_holds"] and val["depths"] == list(range(config.value_depth + 1))
    assert np.all(np.diff(val["gap_mean"]) <= 1e-6) and np.all(np.diff(val["gap_max"]) <= 1e-6)
    assert np.all(np.asarray(val["gap_mean"]) <= np.asarray(val["bound_mean"]) + 1e-6)
    assert all(0.0 <= e < 1.0 for e in [*val["truth_error"], val["truth_error_inf"]])


def test_credit_accuracy(run, independent):
    _, res, _, config = run
    rows = res["accuracy"]
    methods = {r["method"] for r in rows}
    assert set(ca.METHODS) | {"CRBC step term", "GiGPO step term"} | {f"CRBC K={k}" for k in config.depths} <= methods
    assert len(rows) == len(methods) * 2 * (len(config.epsilons) + 1)
    for r in rows:
        for m in ("pearson", "spearman"):
            assert -1.0 <= r[m] <= 1.0, r
            assert r[f"{m}_lo"] <= r[m] + 0.05 and r[m] - 0.05 <= r[f"{m}_hi"], r  # the bootstrap brackets it
    pick = {(r["method"], r["visits"], str(r["epsilon"])): r for r in rows}
    assert pick[("CRBC", "all", "all")]["pearson"] > 0.1 and pick[("CRBC", "eligible", "all")]["spearman"] > 0.1
    # GRPO / RLOO recomputed here on an independent run (cheap kernels; eligibility by hand) give the same numbers
    rollouts = independent
    adv_n = ca.true_values(rollouts, horizon=config.horizon, discount=config.truth_discounts[0]).adv_n
    eligible_n = eligible_rows(rollouts)
    assert eligible_n.mean() == pytest.approx(res["summary"]["all"]["eligible_share"])
    for name, fn in (("GRPO", batched_grpo), ("RLOO", batched_rloo)):
        c_n = ca.to_rows(np.asarray(fn(rollouts.view)), rollouts)
        for visits, sel in (("all", slice(None)), ("eligible", eligible_n)):
            p, s = ca.correlation(c_n[sel], adv_n[sel])
            assert pick[(name, visits, "all")]["pearson"] == pytest.approx(p, abs=1e-9)
            assert pick[(name, visits, "all")]["spearman"] == pytest.approx(s, abs=1e-9)
    for key, order in res["ranking"].items():
        values = [v for _, v in order]
        assert values == sorted(values, reverse=True) and {m for m, _ in order} == set(ca.METHODS), key
    truths = {(r["objective"], r["discount"]) for r in res["accuracy_by_truth"]}
    assert truths == {("success", d) for d in config.truth_discounts}

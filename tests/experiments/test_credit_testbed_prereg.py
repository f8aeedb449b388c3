"""experiments/credit_testbed: the rollout groups on the MDPs, the pre-registration's quick run, and the committed
pre-registration's numbers reproduced by their command (exact computation)."""

import dataclasses
import json
import os

import numpy as np
import pytest

from envs.mdp import MDPConfig, mdp_of, random_success
from experiments.credit_testbed import preregister
from experiments.credit_testbed.rollouts import (
    DIAGNOSTICS,
    METHODS,
    REFERENCE,
    batch_accuracy,
    collect,
    evaluations,
    exact_values,
    task_of,
)

COMMITTED = os.path.join(os.path.dirname(preregister.__file__), "results", "preregistration.json")
SMALL = MDPConfig(depth=3, width=2, noise=0.2, dead_ends=0.2)


def test_rollout_rows_follow_the_collector_conventions():
    ro = collect(SMALL, [3, 4], 4, sample_seed=1, max_steps=SMALL.step_cap + 2)
    n = len(ro.group_n)
    view = {k: np.asarray(getattr(ro.view, k)) for k in ("mask", "anchor", "next_anchor", "success", "length",
                                                        "terminated", "truncated", "reward")}
    assert view["mask"].shape == (2, 4, SMALL.step_cap + 2) and view["mask"].sum() == n
    np.testing.assert_array_equal(view["success"], ro.success_gr)
    assert np.all(view["terminated"] ^ view["truncated"])  # every episode ends one way
    np.testing.assert_array_equal(view["reward"].sum(-1), ro.success_gr)  # reward 1 on the winning step
    anchor_n = view["anchor"][ro.group_n, ro.rollout_n, ro.step_n]
    for g in range(2):  # within a group: same anchor iff same state
        rows = ro.group_n == g
        pairs = set(zip(anchor_n[rows].tolist(), ro.state_n[rows].tolist(), strict=True))
        assert len({a for a, _ in pairs}) == len({s for _, s in pairs}) == len(pairs)
    # the next anchor of a non-final step is the anchor of the next step
    nxt = view["next_anchor"][:, :, :-1][view["mask"][:, :, 1:]]
    np.testing.assert_array_equal(nxt, view["anchor"][:, :, 1:][view["mask"][:, :, 1:]])
    assert np.all(ro.steps_left_n == SMALL.step_cap - ro.step_n) and ro.decision_n.all()
    again = collect(SMALL, [3, 4], 4, sample_seed=1, max_steps=SMALL.step_cap + 2)
    np.testing.assert_array_equal(again.state_n, ro.state_n)  # seeded: the same groups


def test_exact_values_and_accuracy_on_a_batch():
    ro = collect(SMALL, [0, 1, 2], 6)
    evals = evaluations(ro)
    exact = exact_values(ro, evals)
    model = mdp_of(task_of(1, 0), SMALL)
    row = int(np.flatnonzero(ro.group_n == 1)[0])  # the start state of group 1, all steps left
    assert ro.state_n[row] == model.start and ro.steps_left_n[row] == model.max_steps
    assert exact.v_n[row] == pytest.approx(evals[1].start_value)
    acc = batch_accuracy(ro)
    assert set(acc) == {*METHODS, REFERENCE, *DIAGNOSTICS}
    for name, metrics in acc.items():
        assert set(metrics) == {"pearson", "sign_agreement"}
        assert -1.0 <= metrics["pearson"] <= 1.0 and 0.0 <= metrics["sign_agreement"] <= 1.0, name


def check_structure(result: dict, *, credit_methods: bool = True) -> None:
    assert set(result["settings"]) == {"S1", "S2", "S3"}
    fields = {f.name for f in dataclasses.fields(MDPConfig)}
    for setting, st in result["settings"].items():
        assert {"purpose", "rule", "selected", "runners_up", "candidates"} <= set(st)
        assert len(st["candidates"]) == len(preregister.CANDIDATES[setting])
        assert [r["id"] for r in preregister.rank(setting, [dict(r) for r in st["candidates"]])] == \
            [r["id"] for r in st["candidates"]]  # stored in the rule's order
        for row in st["candidates"]:
            assert set(row["config"]) == fields
            assert len(row["random_success_per_seed"]) == len(result["success_seeds"])
        if st["selected"] is not None:
            assert st["selected"]["eligible"] and st["selected"]["id"] == st["candidates"][0]["id"]
            MDPConfig(**st["selected"]["config"])  # a valid setting
    for row in result["settings"]["S2"]["candidates"]:
        if row["eligible"] and credit_methods:
            assert set(row["accuracy"]) == {*METHODS, REFERENCE, *DIAGNOSTICS}
            for metrics in row["accuracy"].values():
                assert {"pearson", "pearson_se", "sign_agreement", "sign_agreement_se"} <= set(metrics)
            means = [row["accuracy"][m]["pearson"] for m in METHODS]
            assert row["spread"] == pytest.approx(max(means) - min(means))


def test_quick_preregistration_runs(tmp_path):
    preregister.main(["--quick", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "preregistration.json").read_text())
    assert result["command"].endswith("--quick") and len(result["success_seeds"]) == 8
    check_structure(result)
    text = (tmp_path / "preregistration.md").read_text()
    assert "## Selected" in text and all(f"## {s}:" in text for s in ("S1", "S2", "S3"))


def test_committed_preregistration_is_reproduced_by_its_command():
    with open(COMMITTED) as f:
        result = json.load(f)
    assert result["command"] == preregister.COMMAND
    assert result["success_seeds"] == list(range(preregister.Prereg().success_seeds))
    check_structure(result)
    for setting, st in result["settings"].items():
        selected = st["selected"]
        assert selected is not None, f"{setting}: no candidate satisfies the rule"
        # the grid in the script is the committed grid
        assert selected["config"] == dataclasses.asdict(preregister.CANDIDATES[setting][int(selected["id"][3:]) - 1])
        for row in (selected, *st["runners_up"]):
            per_seed = random_success(MDPConfig(**row["config"]), result["success_seeds"])
            np.testing.assert_allclose(per_seed, row["random_success_per_seed"], rtol=0, atol=1e-12)
            assert float(np.median(per_seed)) == pytest.approx(row["random_success_median"], abs=1e-12)
    s1, s3 = result["settings"]["S1"]["selected"], result["settings"]["S3"]["selected"]
    assert preregister.S1_BAND[0] <= s1["random_success_median"] <= preregister.S1_BAND[1]
    assert s3["random_success_median"] <= preregister.S3_MAX

"""notebooks/sero_reachability.ipynb, executed headless (nbclient, a python3 ipykernel) with the small CI settings.

The notebook reads ``AGENTJAX_NOTEBOOK_SMALL=1`` (the quick policy pair: a random-init 1-layer d = 32 policy and the
same after a 10-step warm start; 2 batches of 2 groups × 4 rollouts × 6 steps; 16 samples per oracle step) and
writes its numbers to the JSON named by ``SERO_NB_OUT`` (a temporary folder here) and two PNGs beside it. Checked:
the committed notebook has no outputs; every cell runs without error; every number in the JSON is finite and in its
range (weights and compatibilities in [0, 1], ρ and its interval in [-1, 1]); the weights by depth equal an
independent recomputation in this process (the module's policies and primary rollouts, then the trainer's own
``SeroBranch.branch`` and the weights by hand, w_0 = 1, w_j = Π_{i<j} c_i, in NumPy); the Spearman helper matches a
hand-computed case with ties; the PNGs are real images and the tables are shown.

Both runs compile the same programs, so they share a persistent compilation cache in a temporary folder (the
notebook's kernel writes it, this process reads it): the recomputation then costs seconds instead of a minute.
"""

from __future__ import annotations

import json
import math
import pathlib

import jax
import nbformat  # test dependency: nbformat, nbclient, ipykernel, matplotlib (pyproject's test extra)
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache
from nbclient import NotebookClient

from agentjax.models import Sampler
from agentjax.train.flat import make_pool
from agentjax.train.sero import SeroBranch
from experiments.sero import reachability as ra

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "sero_reachability.ipynb"
CACHE_OPTIONS = {"jax_compilation_cache_dir": None, "jax_persistent_cache_min_compile_time_secs": 0.0}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sero_notebook_jax_cache")


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache_dir):
    """(executed notebook, results JSON, JSON path)."""
    out = tmp_path_factory.mktemp("sero_notebook") / "sero.json"
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as mp:
        for var in ra.ENV_VARS:
            mp.delenv(var, raising=False)
        mp.setenv("AGENTJAX_NOTEBOOK_SMALL", "1")
        mp.setenv("SERO_NB_OUT", str(out))
        mp.setenv("JAX_PLATFORMS", "cpu")
        mp.setenv("JAX_COMPILATION_CACHE_DIR", str(cache_dir))
        mp.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return nb, json.loads(out.read_text()), out


def hand_weights(log_c_bj: np.ndarray, step_mask_bj: np.ndarray) -> np.ndarray:
    """[Br, J] w_0 = 1, w_j = Π_{i<j} c_i over each branch's real steps (a prefix of the depths), 0 elsewhere."""
    w = np.zeros(log_c_bj.shape)
    for b in range(log_c_bj.shape[0]):
        prefix = 1.0
        for j in range(log_c_bj.shape[1]):
            if step_mask_bj[b, j]:
                w[b, j] = prefix
                prefix *= math.exp(float(log_c_bj[b, j]))
    return w


@pytest.fixture(scope="module")
def independent(run, cache_dir):
    """Per policy ``(log c [Br, J], step mask [Br, J], weights by hand [Br, J])``, recomputed in this process with
    the trainer's ``SeroBranch.branch`` on the module's primary rollouts (after the notebook: its compile cache)."""
    saved = {k: getattr(jax.config, k) for k in CACHE_OPTIONS}
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.reset_cache()
    try:
        config = ra.ReachabilityConfig.small()
        setup = ra.load_policies(config)
        run_config = setup.run
        pool = make_pool(run_config)
        try:
            sampler = Sampler(setup.model, setup.tokenizer)
            branch = SeroBranch(run_config.train, run_config.train_collect, setup.model, setup.tokenizer, pool,
                                run_config.branch_slots)
            out = {}
            for policy in setup.policies:
                ra.set_weights(setup, sampler, policy)
                log_c, mask = [], []
                for i in range(config.batches):
                    rollouts = ra.primary_rollouts(setup, pool, sampler, config, i)
                    _, _, oracle, log_c_bj = branch.branch(policy.params, rollouts, ra.batch_key(config, i))
                    n = int(np.asarray(oracle.attempted).sum())
                    steps = oracle.steps
                    m = np.zeros(log_c_bj.shape, bool)
                    real = np.asarray(steps.row_mask)
                    m[np.asarray(steps.group)[real], np.asarray(steps.step)[real]] = True
                    log_c.append(np.asarray(log_c_bj)[:n])
                    mask.append(m[:n])
                log_c, mask = np.concatenate(log_c), np.concatenate(mask)
                out[policy.name] = (log_c, mask, hand_weights(log_c, mask))
        finally:
            pool.close()
    finally:
        for k, v in saved.items():
            jax.config.update(k, v)
        compilation_cache.reset_cache()
    return setup.source, out


def test_committed_notebook_is_valid_and_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_spearman_with_ties_by_hand():
    assert np.array_equal(ra.rankdata(np.array([3.0, 1.0, 2.0, 2.0])), [4.0, 1.0, 2.5, 2.5])
    assert np.array_equal(ra.rankdata(np.array([5.0, 5.0, 5.0])), [2.0, 2.0, 2.0])
    # ranks x = (1, 2.5, 2.5, 4), y = (1, 3, 2, 4): Σ dx·dy = 4.5, Σ dx² = 4.5, Σ dy² = 5, ρ = 4.5/√22.5 = 3/√10
    assert ra.spearman(np.array([1.0, 2.0, 2.0, 3.0]), np.array([10.0, 30.0, 20.0, 40.0])) == pytest.approx(
        3 / math.sqrt(10), abs=1e-12)
    assert ra.spearman(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    assert ra.spearman(np.array([0.1, 0.5, 0.9]), np.array([1.0, 8.0, 27.0])) == pytest.approx(1.0)  # monotone
    assert math.isnan(ra.spearman(np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.5, 0.5])))  # constant: undefined


def test_runs_and_writes_results(run):
    nb, res, out = run
    assert not any(o.output_type == "error" for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert res["config"]["out"] == str(out) and res["config"]["policies"] == "quick"
    assert res["policies"]["source"] == "quick" and "quick pair" in res["policies"]["description"]
    assert set(res) >= {"policies", "branches", "weights", "paired", "mass", "match", "prefix_bins", "figures"}
    assert len(res["figures"]) == 2
    for path in map(pathlib.Path, res["figures"]):  # absolute here (outside the repository)
        assert path.parent == out.parent and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 10_000
    shown = "".join(o.get("data", {}).get("text/markdown", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.outputs)
    assert "Policy pair: quick" in shown and "| early |" in shown and "| later |" in shown and "Spearman" in shown


def test_values_are_finite_and_in_range(run):
    _, res, _ = run
    for name in ("early", "later"):
        stats = res["branches"][name]
        assert stats["roots_attempted"] >= 2 and stats["oracle_steps"] >= stats["roots_valid"] >= 1
        assert 0.0 <= stats["success_rate"] <= 1.0
        for table in (res["weights"][name], res["paired"][name]):
            assert table[0]["depth"] == 0 and table[0]["weight"] == pytest.approx(1.0)  # w_0 = 1
            for row in table:
                assert 0.0 <= row["weight"] <= 1.0 + 1e-6 and 0.0 < row["compat"] <= 1.0 and row["n"] >= 1, row
                assert row["weight_se"] >= 0.0
        for kind in ("own", "paired"):
            m = res["mass"][name][kind]
            assert 1.0 <= m["mass"] <= m["steps"] + 1e-6 and 0.0 < m["mass_share"] <= 1.0
        for row in res["prefix_bins"][name]:
            assert row["lo"] < row["weight"] <= row["hi"] and 0.0 <= row["prefix_freq"] <= 1.0
    for name in ("early", "later", "pooled"):
        c = res["match"][name]
        assert c["n_steps"] >= 2 and c["samples"] == ra.ReachabilityConfig.small().samples
        for key in ("rho", "rho_lo", "rho_hi", "pearson"):
            assert c[key] is not None and -1.0 <= c[key] <= 1.0, (name, key, c)
        assert c["rho_lo"] <= c["rho_hi"]
        assert 0.0 < c["mean_compat"] <= 1.0 and 0.0 <= c["mean_freq"] <= 1.0
    assert res["match"]["pooled"]["n_steps"] == res["match"]["early"]["n_steps"] + res["match"]["later"]["n_steps"]


def test_weights_by_depth_match_an_independent_recomputation(run, independent):
    _, res, _ = run
    source, out = independent
    assert source == res["policies"]["source"]
    for name, (log_c, mask, w) in out.items():
        assert len(log_c) == res["branches"][name]["roots_attempted"]
        assert int(mask.sum()) == res["branches"][name]["oracle_steps"]
        table = res["weights"][name]
        assert [row["depth"] for row in table] == [j for j in range(mask.shape[1]) if mask[:, j].any()]
        for row in table:
            j = row["depth"]
            assert row["n"] == int(mask[:, j].sum())
            assert row["weight"] == pytest.approx(w[mask[:, j], j].mean(), rel=1e-5)
            assert row["compat"] == pytest.approx(np.exp(log_c[mask[:, j], j]).mean(), rel=1e-5)
        assert np.all(np.diff(w, axis=1)[mask[:, 1:]] <= 1e-7)  # each branch's weights never grow with depth
        mass_b = (w * mask).sum(1)
        assert res["mass"][name]["own"]["mass"] == pytest.approx(mass_b.mean(), rel=1e-5)

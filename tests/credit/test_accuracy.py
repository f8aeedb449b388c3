"""Credit accuracy: a direct NumPy reference on random inputs, hand cases, the edge cases (constant inputs, no
weight, no signed row), invariances and jit/vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.credit.accuracy import credit_accuracy


def reference(x, y, w, atol=0.0):
    """Explicit weighted formulas in float64."""
    x, y, w = (np.asarray(a, np.float64) for a in (x, y, w))
    mx, my = np.sum(w * x) / np.sum(w), np.sum(w * y) / np.sum(w)
    cov = np.sum(w * (x - mx) * (y - my))
    pearson = cov / np.sqrt(np.sum(w * (x - mx) ** 2) * np.sum(w * (y - my) ** 2))
    keep = np.abs(y) > atol
    agree = (np.sign(x) == np.sign(y)) & (x != 0)
    return pearson, np.sum(w[keep] * agree[keep]) / np.sum(w[keep])


def as_floats(out):
    return {k: float(v) for k, v in out.items()}


@pytest.mark.parametrize("seed", range(4))
def test_matches_numpy_reference(seed):
    rng = np.random.default_rng(seed)
    n = 200
    y = rng.normal(size=n) * (rng.random(n) < 0.8)  # some exact zeros
    x = 0.7 * y + rng.normal(size=n) * 0.5
    x[rng.random(n) < 0.1] = 0.0  # some rows without credit
    w = (rng.random(n) < 0.7) * rng.integers(1, 4, n)
    out = as_floats(credit_accuracy(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32),
                                    jnp.asarray(w, jnp.float32)))
    p, s = reference(x, y, w)
    np.testing.assert_allclose(out["pearson"], p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["sign_agreement"], s, rtol=1e-6)


def test_hand_case():
    # perfectly correlated but one row without credit: pearson < 1, sign 2 of 3 (the zero exact row is skipped)
    x = jnp.array([1.0, -2.0, 0.0, 5.0])
    y = jnp.array([0.5, -1.0, 2.0, 0.0])
    out = as_floats(credit_accuracy(x, y, jnp.ones(4)))
    assert out["sign_agreement"] == pytest.approx(2 / 3)
    # weights 0 drop rows: rows 0, 1 alone are exactly linear
    out = as_floats(credit_accuracy(x, y, jnp.array([1.0, 1.0, 0.0, 0.0])))
    assert out["pearson"] == pytest.approx(1.0, abs=1e-6) and out["sign_agreement"] == 1.0
    # anti-correlated
    out = as_floats(credit_accuracy(-y, y, jnp.ones(4)))
    assert out["pearson"] == pytest.approx(-1.0, abs=1e-6) and out["sign_agreement"] == 0.0


def test_integer_weights_are_repeated_rows():
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=6), rng.normal(size=6)
    w = np.array([1, 3, 0, 2, 1, 1])
    out = as_floats(credit_accuracy(jnp.asarray(x), jnp.asarray(y), jnp.asarray(w, jnp.float32)))
    rep = as_floats(credit_accuracy(jnp.asarray(np.repeat(x, w)), jnp.asarray(np.repeat(y, w)),
                                    jnp.ones(int(w.sum()))))
    for k in out:
        assert out[k] == pytest.approx(rep[k], rel=1e-5)


def test_bool_weight_and_atol():
    y = jnp.array([1e-9, 1.0, -1.0])
    x = jnp.array([-1.0, 1.0, -1.0])
    assert float(credit_accuracy(x, y, jnp.ones(3, bool))["sign_agreement"]) == pytest.approx(2 / 3)
    assert float(credit_accuracy(x, y, jnp.ones(3, bool), 1e-6)["sign_agreement"]) == 1.0


@pytest.mark.parametrize("constant", ["advantage", "exact"])
def test_constant_input_gives_nan_pearson(constant):
    rng = np.random.default_rng(1)
    v = jnp.asarray(rng.normal(size=10), jnp.float32)
    c = jnp.full(10, 0.1234567, jnp.float32)  # a constant whose float32 mean is not exact
    x, y = (c, v) if constant == "advantage" else (v, c)
    out = as_floats(credit_accuracy(x, y, jnp.ones(10)))
    assert np.isnan(out["pearson"])
    # all-zero advantage (e.g. GRPO on a group with no success): sign agreement 0, not NaN
    out = as_floats(credit_accuracy(jnp.zeros(10), v, jnp.ones(10)))
    assert np.isnan(out["pearson"]) and out["sign_agreement"] == 0.0


def test_no_weight_or_no_signed_row_gives_nan():
    x, y = jnp.arange(4.0), jnp.arange(4.0) - 1.5
    out = as_floats(credit_accuracy(x, y, jnp.zeros(4)))
    assert np.isnan(out["pearson"]) and np.isnan(out["sign_agreement"])
    out = as_floats(credit_accuracy(x, jnp.zeros(4), jnp.ones(4)))
    assert np.isnan(out["pearson"]) and np.isnan(out["sign_agreement"])


def test_invariances():
    rng = np.random.default_rng(3)
    x, y, w = rng.normal(size=30), rng.normal(size=30), rng.random(30)
    base = as_floats(credit_accuracy(jnp.asarray(x), jnp.asarray(y), jnp.asarray(w)))
    perm = rng.permutation(30)
    permuted = as_floats(credit_accuracy(jnp.asarray(x[perm]), jnp.asarray(y[perm]), jnp.asarray(w[perm])))
    scaled = as_floats(credit_accuracy(jnp.asarray(3.0 * x), jnp.asarray(y), jnp.asarray(5.0 * w)))
    for other in (permuted, scaled):
        for k in base:
            assert other[k] == pytest.approx(base[k], rel=1e-5)
    shifted = as_floats(credit_accuracy(jnp.asarray(x + 2.0), jnp.asarray(y), jnp.asarray(w)))
    assert shifted["pearson"] == pytest.approx(base["pearson"], rel=1e-5)


def test_vmap_matches_loop():
    rng = np.random.default_rng(5)
    x, y, w = (jnp.asarray(rng.normal(size=(3, 12)), jnp.float32) for _ in range(3))
    w = jnp.abs(w)
    batched = jax.vmap(credit_accuracy)(x, y, w)
    for i in range(3):
        one = credit_accuracy(x[i], y[i], w[i])
        for k in one:
            np.testing.assert_allclose(batched[k][i], one[k], rtol=1e-6)

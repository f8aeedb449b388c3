"""Segment primitives against brute force."""

import jax.numpy as jnp
import numpy as np
import pytest

from agentjax.credit.segments import first_occurrence, nested_first_occurrence, segment_mean_std


@pytest.mark.parametrize("seed", range(5))
def test_nested_first_occurrence_is_the_smallest_index_with_equal_keys(seed):
    rng = np.random.default_rng(seed)
    for trial in range(20):
        m = int(rng.choice([1, 2, 7, 31, 49]))  # few shapes: each new length compiles the eager ops again
        k0, k1, mask = rng.integers(-3, 4, m), rng.integers(0, 3, m), rng.random(m) < 0.8
        if trial % 5 == 0:
            k0[:] = 2**31 - 1  # int32 max is a legal key
        a, b = map(np.asarray, nested_first_occurrence((jnp.asarray(k0, jnp.int32), jnp.asarray(k1, jnp.int32)),
                                                       jnp.asarray(mask)))  # host arrays: the loop below is Python
        np.testing.assert_array_equal(a, first_occurrence(jnp.asarray(k0, jnp.int32), jnp.asarray(mask)))
        for i in range(m):
            if not mask[i]:
                assert a[i] == m and b[i] == m
                continue
            assert a[i] == min(j for j in range(m) if mask[j] and k0[j] == k0[i])
            assert b[i] == min(j for j in range(m) if mask[j] and k0[j] == k0[i] and k1[j] == k1[i])


def test_segment_mean_std_by_hand():
    x = jnp.array([1.0, 2.0, 3.0, 10.0, 5.0])
    seg = first_occurrence(jnp.array([7, 8, 7, 7, 9]), jnp.array([True, True, True, False, True]))
    mean, std, count = segment_mean_std(x, seg, jnp.array([True, True, True, False, True]), ddof=1)
    np.testing.assert_allclose(mean, [2.0, 2.0, 2.0, 0.0, 5.0])
    np.testing.assert_allclose(std, [np.sqrt(2.0), 0.0, np.sqrt(2.0), 0.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(count, [2, 1, 2, 0, 1])

"""tests/conftest.py frees JAX's compiled programs after every test module (``free_executables``): XLA:CPU maps each
executable's code into memory regions of its own, and one process running the whole slow suite otherwise neared the
kernel's limit on memory maps (vm.max_map_count) and died in native code (a segfault or abort in the persistent
compilation cache). Checked: the fixture is applied, and freeing gives the maps of a batch of programs back."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

from tests.conftest import free_executables

MAPS = "/proc/self/maps"


def map_count() -> int:
    with open(MAPS) as f:
        return sum(1 for _ in f)


def test_every_module_frees_its_executables(request):
    assert "_free_executables_after_module" in request.fixturenames


@pytest.mark.skipif(not os.path.exists(MAPS), reason="needs Linux's /proc/self/maps")
def test_freeing_gives_the_programs_memory_maps_back():
    def many_kernels(v):
        for _ in range(10):
            v = jnp.sort(v) + jnp.cumsum(v) * jnp.max(v)
        return v

    fn = jax.jit(many_kernels)
    free_executables()
    before = map_count()
    for n in range(8, 24):  # 16 shapes: 16 executables
        fn(jnp.ones((n,), jnp.float32)).block_until_ready()
    grown = map_count() - before
    assert grown >= 16, f"16 executables added only {grown} memory maps: the premise of free_executables changed"
    free_executables()
    left = map_count() - before
    assert left <= grown // 4, f"free_executables left {left} of the {grown} memory maps its programs took"

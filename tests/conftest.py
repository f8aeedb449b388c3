"""Test-wide numerics: strict rank promotion, our own warnings are errors.

jaxtyping's runtime checks are switched on for the whole ``agentjax`` package by the pytest option
``--jaxtyping-packages=agentjax,beartype.beartype`` in ``pyproject.toml`` (it has to act before the package
is imported, so it cannot live here).
"""

import gc
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# 8 fake CPU devices for the sharding tests (tests/parallel); unsharded code still runs on jax.devices()[0].
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
# JAX's persistent compilation cache, shared by the pytest-xdist workers, the processes some tests start (the CLI,
# experiment scripts, notebooks: they inherit these variables) and later runs; it is keyed by the program, the flags
# and the versions, so a changed program compiles anew. AGENTJAX_TEST_JAX_CACHE="" turns it off.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAX_CACHE = os.environ.get("AGENTJAX_TEST_JAX_CACHE", os.path.join(ROOT, ".pytest_cache", "jax-compile"))
if JAX_CACHE:
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", JAX_CACHE)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")

# XLA's backend optimisations mostly off (LLVM at -O0, no expensive passes; the HLO passes still run): the tests'
# programs are tiny, so compiling them is most of their time. The whole `make test` on a cold compilation cache took
# 937 s of pytest with it against 1,404 s without, back to back on this 2-core machine. A few float32 results move by
# an ulp or two against their references (the tolerances say so). JAX_DISABLE_MOST_OPTIMIZATIONS=0 runs the suite with
# every optimisation; tests that run many updates turn them back on (the `optimised_xla` fixture).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_x64", False)


def pytest_report_header(config):
    return (f"jax {jax.__version__}, devices: {jax.devices()}, rank promotion: raise, XLA_FLAGS: "
            f"{os.environ['XLA_FLAGS']}, compilation cache: {JAX_CACHE or 'off'}, most XLA optimisations "
            f"{'off' if jax.config.values['jax_disable_most_optimizations'] else 'on'}")


@pytest.fixture(scope="module")
def optimised_xla():
    """XLA's optimisations back on for a module whose tests run long enough to pay for them (many updates), then
    the suite's setting again (see the top of this file)."""
    before = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", before)


def free_executables() -> None:
    """Drop every compiled program JAX holds in memory (its jit caches) and collect them.

    XLA:CPU maps each loaded executable's machine code into anonymous memory regions of its own (about 26 for a
    program of some 60 small kernels), and JAX keeps every executable a process compiled or loaded in its in-memory
    caches. One pytest process running the slow suite piled them up to Linux's per-process limit on memory maps
    (vm.max_map_count, 65,530 by default): `pytest -m slow tests/train tests/models tests/notebooks/...` reached
    56,000 maps in 7 minutes, ~5,000 a minute; the whole suite runs more before tests/train. Then an mmap inside
    XLA fails and the interpreter dies in native code wherever it next loads or writes an executable: a segfault
    in the persistent cache's write (`put_executable_and_time`) or read (`get_executable_and_time`, also an
    abort), late in `make test-slow` (tests/train/test_tree_presets.py, test_update_cispo.py), never in a test run
    alone. ``jax.clear_caches()`` releases the maps (40 programs: 1,548 maps -> 513); a later module that needs a
    program again reads it from the persistent compilation cache."""
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="module", autouse=True)
def _free_executables_after_module():
    """After each test module (its module fixtures torn down first): :func:`free_executables`."""
    yield
    free_executables()

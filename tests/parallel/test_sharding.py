"""Sharded == unsharded on 8 fake CPU devices: logits, gradients, KV-cache decoding, init; the rules' specs; errors.

The 8 devices come from ``XLA_FLAGS=--xla_force_host_platform_device_count=8``, set in ``tests/conftest.py``
before JAX starts (optax ``sharding_test.py`` does the same).
"""

import os
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from agentjax.models.config import QwenConfig
from agentjax.models.qwen import KVCache, Qwen, positions_from_segments
from agentjax.parallel import (
    ModelSharding,
    batch_sharding,
    create_sharded,
    fit_spec,
    fsdp_tp,
    initialize_distributed,
    make_mesh,
    param_shardings,
    sampling,
    shard_cache,
    shard_model,
)

if jax.device_count() < 8:  # pragma: no cover - conftest sets the flag unless XLA_FLAGS already fixes a count
    pytest.skip(f"needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8), have {jax.device_count()}",
                allow_module_level=True)

CONFIGS = {"qwen2": QwenConfig.tiny_qwen2(), "qwen3": QwenConfig.tiny_qwen3()}
MESHES = {"fsdp2xtp4": (2, 4), "fsdp8": (8, 1)}
RULES = {"train": fsdp_tp, "sample": sampling}
SEED = 0
B, L = 8, 12


def padded_batch(vocab: int) -> tuple[jax.Array, jax.Array]:
    """Tokens [B, L] and segments: rows left- or right-padded by 0..5 slots, one row packed with two sequences."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (B, L)).astype(np.int32)
    segment = np.ones((B, L), np.int32)
    for b in range(B):
        pad = b % 6
        if b % 2:
            segment[b, :pad] = 0
        else:
            segment[b, L - pad:] = 0
    segment[B - 1, L // 2:] = 2
    return jnp.asarray(tokens), jnp.asarray(segment)


def mean_target_logprob(state, graphdef, tokens_bl, segment_bl):
    """Mean log-probability of each next token within its segment (a stand-in for the policy-gradient loss); the
    logits ride along as the auxiliary output, so one compiled function checks the forward and the backward pass."""
    logits_blv = nnx.merge(graphdef, state)(tokens_bl, segment_bl)
    logp_blv = jax.nn.log_softmax(logits_blv[:, :-1], axis=-1)
    logp_bl = jnp.take_along_axis(logp_blv, tokens_bl[:, 1:, None], axis=-1)[:, :, 0]
    mask_bl = (segment_bl[:, 1:] == segment_bl[:, :-1]) & (segment_bl[:, 1:] != 0)
    return jnp.sum(jnp.where(mask_bl, logp_bl, 0.0)) / jnp.sum(mask_bl), logits_blv


_logits_and_grad = jax.jit(jax.grad(mean_target_logprob, has_aux=True), static_argnums=1)


@pytest.fixture(scope="module", params=[n if n == min(CONFIGS) else pytest.param(n, marks=pytest.mark.slow)
                                        for n in sorted(CONFIGS)])  # Qwen3's: make test-slow, for CI time
def reference(request):
    """The unsharded model on one device, its logits and gradient on the padded batch."""
    config = CONFIGS[request.param]
    graphdef, state = nnx.split(Qwen(config, rngs=nnx.Rngs(SEED)))
    tokens, segment = padded_batch(config.vocab_size)
    grads, logits = jax.tree.map(np.asarray, _logits_and_grad(state, graphdef, tokens, segment))
    return config, tokens, segment, logits, grads


def assert_trees_close(actual, expected, rtol=1e-5):
    """Leafwise ``|a - e| <= rtol (|e| + max|e|)``: relative per entry, with a floor set by the leaf's scale."""
    paths_a = jax.tree_util.tree_leaves_with_path(actual)
    paths_e = jax.tree_util.tree_leaves_with_path(expected)
    assert [p for p, _ in paths_a] == [p for p, _ in paths_e]
    for (path, a), (_, e) in zip(paths_a, paths_e, strict=True):
        a, e = np.asarray(a), np.asarray(e)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * float(np.abs(e).max()),
                                   err_msg=jax.tree_util.keystr(path))


# -- sharded == unsharded --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rules_name", sorted(RULES))
@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_sharded_logits_and_grads_match_unsharded(reference, mesh_name, rules_name):
    config, tokens, segment, logits_ref, grads_ref = reference
    mesh, rules = make_mesh(*MESHES[mesh_name]), RULES[rules_name]()
    model = shard_model(Qwen(config, rngs=nnx.Rngs(SEED)), rules, mesh)
    graphdef, state = nnx.split(model)
    tokens_s, segment_s = jax.device_put((tokens, segment), batch_sharding(rules, mesh))

    # XLA's propagation alone leaves some gradients replicated: a training step pins them to the parameters' layout
    step = jax.jit(jax.grad(mean_target_logprob, has_aux=True), static_argnums=1,
                   out_shardings=(param_shardings(state, rules, mesh), NamedSharding(mesh, rules.logits_blv)))
    grads, logits = step(state, graphdef, tokens_s, segment_s)
    np.testing.assert_allclose(np.asarray(logits), logits_ref, rtol=1e-5, atol=1e-5)
    assert_trees_close(grads, grads_ref)
    assert grads["blocks"][0]["mlp"]["down_fd"][...].sharding.spec == fit_spec(rules.down_fd, (128, 64), mesh)
    assert np.abs(np.asarray(grads["embed_vd"][...])).max() > 0  # the check is not vacuous


def test_sharded_kv_cache_decoding_matches_unsharded():
    """Prefill of left-padded prompts + one decode step, sampling rules with the cache split over fsdp and tp."""
    config = CONFIGS["qwen3"].replace(num_kv_heads=4)  # 4 kv heads: the cache's K really splits over tp = 4
    mesh, rules = make_mesh(2, 4), sampling()
    tokens, segment = padded_batch(config.vocab_size)
    prompt_bl, prompt_seg_bl = tokens[:, :6], (jnp.arange(6)[None, :] >= (jnp.arange(B) % 3)[:, None]).astype(int)
    step_bl = tokens[:, 6:7]
    prompt_pos_bl = positions_from_segments(prompt_seg_bl)
    step_pos_bl = prompt_pos_bl[:, -1:] + 1

    def prefill_and_step(state, graphdef, cache):
        model = nnx.merge(graphdef, state)
        first = model.decode(prompt_bl, prompt_seg_bl, prompt_pos_bl, cache)
        second = model.decode(step_bl, jnp.ones_like(step_bl), step_pos_bl, first.cache)
        return first.hidden_bld, second.hidden_bld, second.cache

    run = jax.jit(prefill_and_step, static_argnums=1)
    cache = KVCache.init(config, B, 8)
    graphdef, state = nnx.split(Qwen(config, rngs=nnx.Rngs(SEED)))
    expected = run(state, graphdef, cache)

    graphdef_s, state_s = nnx.split(shard_model(Qwen(config, rngs=nnx.Rngs(SEED)), rules, mesh))
    cache_s = shard_cache(cache, rules, mesh)
    assert cache_s.k_lbskh.sharding.spec == P(None, "fsdp", None, "tp", None)
    assert cache_s.valid_bs.sharding.spec == P("fsdp", None)
    actual = run(state_s, graphdef_s, cache_s)
    assert_trees_close(actual[:2], expected[:2])
    np.testing.assert_allclose(np.asarray(actual[2].k_lbskh), np.asarray(expected[2].k_lbskh), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config_name", [n if n == min(CONFIGS) else pytest.param(n, marks=pytest.mark.slow)
                                         for n in sorted(CONFIGS)])  # one in make test, for CI time
def test_create_sharded_matches_unsharded_init(config_name):
    """Jitted sharded init is bitwise the jitted unsharded init; eager init differs only by float rounding."""
    config = CONFIGS[config_name]
    mesh, rules = make_mesh(2, 4), fsdp_tp()
    model = create_sharded(config, rules, mesh, seed=SEED)
    state = nnx.state(model)
    jitted = jax.jit(lambda: nnx.split(Qwen(config, rngs=nnx.Rngs(SEED)))[1])()
    eager = nnx.state(Qwen(config, rngs=nnx.Rngs(SEED)))
    assert jax.tree.structure(state) == jax.tree.structure(eager)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), state, jitted)
    assert_trees_close(state, eager, rtol=1e-6)
    expected = param_shardings(state, rules, mesh)
    jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim) or pytest.fail(f"{x.sharding} != {s}"),
                 state, expected)
    assert model.act_sharding.residual_bld == NamedSharding(mesh, rules.residual_bld)
    if config_name == "qwen2":  # the seed reaches the jitted initialiser
        different = nnx.state(create_sharded(config, rules, mesh, seed=SEED + 1))
        assert not np.array_equal(np.asarray(different["embed_vd"][...]), np.asarray(state["embed_vd"][...]))


# -- the specs ---------------------------------------------------------------------------------------------------------
def test_training_specs_and_divisibility_fallback():
    """fsdp_tp on FSDP 2 x TP 4 for tiny Qwen2 (N = 4, K = 2, D = 64, F = 128, V = 512)."""
    mesh = make_mesh(2, 4)
    model = shard_model(Qwen(CONFIGS["qwen2"], rngs=nnx.Rngs(SEED)), fsdp_tp(), mesh)
    attn, mlp = model.blocks[1].attn, model.blocks[1].mlp
    specs = {
        "embed_vd": (model.embed_vd, P("tp", "fsdp"), (128, 32)),
        "q_dnh": (attn.q_dnh, P("fsdp", "tp", None), (32, 1, 16)),
        "k_dkh": (attn.k_dkh, P("fsdp", None, None), (32, 2, 16)),  # 2 kv heads on tp = 4: replicated over tp
        "v_dkh": (attn.v_dkh, P("fsdp", None, None), (32, 2, 16)),
        "o_nhd": (attn.o_nhd, P("tp", None, "fsdp"), (1, 16, 32)),
        "q_bias_nh": (attn.q_bias_nh, P("tp", None), (1, 16)),
        "k_bias_kh": (attn.k_bias_kh, P(None, None), (2, 16)),
        "gate_df": (mlp.gate_df, P("fsdp", "tp"), (32, 32)),
        "up_df": (mlp.up_df, P("fsdp", "tp"), (32, 32)),
        "down_fd": (mlp.down_fd, P("tp", "fsdp"), (32, 32)),
        "attn_norm_d": (model.blocks[0].attn_norm_d, P(None), (64,)),
        "final_norm_d": (model.final_norm_d, P(None), (64,)),
    }
    for name, (param, spec, shard_shape) in specs.items():
        array = param[...]
        assert array.sharding.spec == spec, name
        assert array.addressable_shards[0].data.shape == shard_shape, name
    # K = 4 divides tp = 4: the kv heads split
    qwen3_wide = Qwen(CONFIGS["qwen3"].replace(num_kv_heads=4), rngs=nnx.Rngs(SEED))
    shard_model(qwen3_wide, fsdp_tp(), mesh)
    assert qwen3_wide.blocks[0].attn.k_dkh[...].sharding.spec == P("fsdp", "tp", None)
    assert qwen3_wide.blocks[0].attn.q_norm_h[...].sharding.spec == P(None)
    assert qwen3_wide.unembed_vd[...].sharding.spec == P("tp", "fsdp")


def test_sampling_specs_replicate_over_fsdp():
    mesh = make_mesh(2, 4)
    model = shard_model(Qwen(CONFIGS["qwen3"], rngs=nnx.Rngs(SEED)), sampling(), mesh)
    q = model.blocks[0].attn.q_dnh[...]
    assert q.sharding.spec == P(None, "tp", None)
    assert q.addressable_shards[0].data.shape == (64, 1, 32)
    assert model.blocks[0].mlp.down_fd[...].sharding.spec == P("tp", None)
    assert model.unembed_vd[...].sharding.spec == P("tp", None)
    # every fsdp row of the mesh holds the same shard: device (0, t) and (1, t) have equal data
    by_device = {s.device: np.asarray(s.data) for s in q.addressable_shards}
    for t in range(4):
        np.testing.assert_array_equal(by_device[mesh.devices[0, t]], by_device[mesh.devices[1, t]])
    for rules in (fsdp_tp(), sampling()):
        assert rules.residual_bld == P("fsdp", None, None) and rules.logits_blv == P("fsdp", None, "tp")


def test_fit_spec_rule():
    mesh = make_mesh(2, 4)
    assert fit_spec(P("fsdp", "tp"), (6, 8), mesh) == P("fsdp", "tp")
    assert fit_spec(P("fsdp", "tp"), (5, 6), mesh) == P(None, None)
    assert fit_spec(P(("fsdp", "tp")), (16, 3), mesh) == P(("fsdp", "tp"), None)  # a tuple needs 2 * 4 | 16
    assert fit_spec(P(("fsdp", "tp")), (4,), mesh) == P(None)
    assert fit_spec(P(), (3, 3), mesh) == P(None, None)
    with pytest.raises(ValueError, match="2 entries for an array of shape"):
        fit_spec(P("fsdp", "tp"), (8,), mesh)
    with pytest.raises(ValueError, match="names mesh axes \\['data'\\]"):
        fit_spec(P("data"), (8,), mesh)


def test_custom_axis_names():
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    rules = fsdp_tp(fsdp="data", tp="model")
    state = nnx.state(Qwen(CONFIGS["qwen2"], rngs=nnx.Rngs(SEED)))
    shardings = param_shardings(state, rules, mesh)
    assert shardings["blocks"][0]["mlp"]["gate_df"].get_value().spec == P("data", "model")


def test_unknown_parameter_name_is_named():
    mesh = make_mesh(2, 4)
    with pytest.raises(KeyError, match="mystery_xy.*\\['blocks'\\]\\[0\\]"):
        param_shardings({"blocks": {0: {"mystery_xy": jnp.zeros((2, 2))}}}, fsdp_tp(), mesh)
    with pytest.raises(KeyError, match="mystery_xy"):
        ModelSharding().param_spec("mystery_xy")


# -- mesh and start-up -------------------------------------------------------------------------------------------------
def test_make_mesh():
    mesh = make_mesh(2, 4)
    assert mesh.axis_names == ("fsdp", "tp") and dict(mesh.shape) == {"fsdp": 2, "tp": 4}
    assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)
    assert make_mesh(2, 2, devices=jax.devices()[:4]).devices.size == 4
    with pytest.raises(ValueError, match="needs 6 devices, but there are 8.*xla_force_host_platform_device_count"):
        make_mesh(3, 2)
    with pytest.raises(ValueError, match=">= 1"):
        make_mesh(0, 8)


_CLUSTER_ENV = ("AGENTJAX_COORDINATOR", "AGENTJAX_NUM_PROCESSES", "AGENTJAX_PROCESS_ID", "SLURM_JOB_ID",
                "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "OMPI_MCA_orte_hnp_uri", "TPU_WORKER_HOSTNAMES",
                "TPU_PROCESS_ADDRESSES", "MEGASCALE_COORDINATOR_ADDRESS")


def test_initialize_distributed_single_process_is_a_no_op(monkeypatch):
    for name in _CLUSTER_ENV:
        monkeypatch.delenv(name, raising=False)
    assert initialize_distributed() is False
    assert initialize_distributed(num_processes=1) is False
    monkeypatch.setenv("AGENTJAX_NUM_PROCESSES", "1")
    monkeypatch.setenv("AGENTJAX_COORDINATOR", "localhost:1")
    assert initialize_distributed() is False
    monkeypatch.setenv("AGENTJAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="AGENTJAX_NUM_PROCESSES='two'"):
        initialize_distributed()
    assert not jax.distributed.is_initialized()


_WORKER = textwrap.dedent("""
    from agentjax.parallel import initialize_distributed, make_mesh
    assert initialize_distributed() is True
    assert initialize_distributed() is True  # idempotent
    import jax
    mesh = make_mesh(2, 2)
    print("OK", jax.process_index(), jax.process_count(), jax.device_count(), jax.local_device_count(), flush=True)
    jax.distributed.shutdown()
""")


@pytest.mark.slow  # end to end: `make test-slow` (README, "Tests")
def test_initialize_distributed_two_processes_from_env():
    """Two CPU processes with 2 devices each join through AGENTJAX_* variables; the mesh spans all 4 devices."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in _CLUSTER_ENV}
    env |= {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
            "AGENTJAX_COORDINATOR": f"localhost:{port}", "AGENTJAX_NUM_PROCESSES": "2"}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER], env=env | {"AGENTJAX_PROCESS_ID": str(i)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for i, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, err[-3000:]
        assert f"OK {i} 2 4 2" in out, (out, err[-3000:])

"""On an FSDP × TP mesh of 8 fake CPU devices: the update equals the single-device update and keeps every
sharding; the abstract state has init_state's shardings; a checkpoint restores sharded."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from agentjax.models import Qwen
from agentjax.parallel import fsdp_tp, make_mesh, shard_model
from agentjax.train import Checkpointer, UpdateBatch, abstract_state, compute_advantages, init_state, make_update
from tests.train.conftest import leaves_equal


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_sharded_update_equals_unsharded_and_keeps_shardings(tmp_path, tiny_config, tiny_model, tiny_tx,
                                                             tiny_batch):
    assert len(jax.devices()) >= 8, "tests/conftest.py provides 8 fake CPU devices"
    sharded = shard_model(Qwen(tiny_config.model.arch, rngs=nnx.Rngs(0)), fsdp_tp(), make_mesh(4, 2))
    adv = compute_advantages(tiny_config.credit, tiny_batch, tiny_config.rollout)
    results = []
    for model in (tiny_model, sharded):  # the same initial values (Rngs(0)), placed differently
        state = init_state(tiny_config, model, jax.random.key(0), tiny_tx)
        shardings = jax.tree.map(lambda x: x.sharding, (state.params, state.opt_state))
        state, metrics = make_update(tiny_config, model, tiny_tx)(state, UpdateBatch.of(tiny_batch, adv),
                                                                  jax.random.key(1))
        results.append((state, metrics, shardings))
    (plain, m_plain, _), (split, m_split, before) = results
    assert any(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(split.params))
    after = jax.tree.map(lambda x: x.sharding, (split.params, split.opt_state))
    for b, a, x in zip(jax.tree.leaves(before), jax.tree.leaves(after), jax.tree.leaves((split.params,
                                                                                        split.opt_state)),
                       strict=True):
        assert a.is_equivalent_to(b, x.ndim)
    np.testing.assert_allclose(m_plain["loss"], m_split["loss"], rtol=1e-5)
    np.testing.assert_allclose(m_plain["grad_norm"], m_split["grad_norm"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(split.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=5e-5)  # Adam's first step: ±lr = 1e-3 per parameter

    # the abstract state (restore target) has the shapes, dtypes and shardings of init_state's
    abstract = abstract_state(tiny_config, sharded, tiny_tx)
    fresh = init_state(tiny_config, sharded, jax.random.key(0), tiny_tx)
    for a, x in zip(jax.tree.leaves(abstract), jax.tree.leaves(fresh), strict=True):
        assert (a.shape, a.dtype) == (x.shape, x.dtype) and a.sharding.is_equivalent_to(x.sharding, x.ndim)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(split)
        restored = ckpt.restore_latest(abstract).state
    assert leaves_equal(restored, split)
    for r, x in zip(jax.tree.leaves(restored), jax.tree.leaves(split), strict=True):
        assert r.sharding.is_equivalent_to(x.sharding, x.ndim)

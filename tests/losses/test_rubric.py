"""The rubric-generation objective: CISPO on the rubric-role tokens only, with each row's group advantage."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.losses import role_token_mask, rubric_loss
from tests.losses.test_cispo import random_inputs, ref_cispo


def test_rubric_loss_trains_rubric_tokens_only():
    logp, old, _, response = random_inputs(4)
    rubric = np.zeros_like(response)
    rubric[0, 1:4] = True  # row 0 is a rubric completion; row 1 holds no rubric token
    rubric[2, :] = True
    adv_b = jnp.array([0.5, 9.0, -0.25, 7.0])
    args = (jnp.asarray(logp), jnp.asarray(old), adv_b, jnp.asarray(response), jnp.asarray(rubric))
    loss, metrics = rubric_loss(*args)
    mask = response & rubric
    want = ref_cispo(logp, old, np.broadcast_to(np.asarray(adv_b)[:, None], logp.shape), mask, 0.0, 5.0)
    np.testing.assert_allclose(loss, want.sum() / mask.sum(), rtol=1e-5)
    assert float(metrics["rubric_tokens"]) == mask.sum()
    grad = jax.grad(lambda lp: rubric_loss(lp, *args[1:])[0])(args[0])
    np.testing.assert_array_equal(np.asarray(grad)[~mask], 0.0)  # execution / delegation / grading tokens: none
    np.testing.assert_array_equal(role_token_mask(jnp.asarray(response), jnp.asarray(rubric)), mask)

"""SERO in the trainer on Sokoban with a tiny policy: branches run and are logged, and the base method is untouched.

Checked: with SERO on, the first update's base loss, advantages statistics and rollouts equal the run without it
(oracle data never enters the base method, and the branch's key does not shift the primary stream); the branch
metrics are logged with roots attempted and valid.
"""

from __future__ import annotations

import pytest

from agentjax.train import trainer
from agentjax.train.config import SeroConfig
from agentjax.train.metrics import read_metrics
from tests.train.test_trainer_flat import small_run


def _run(out, sero):
    run = small_run(out, "graphgpo", updates=1, eval_every=0)
    run = run.with_sizes(num_groups=2, group_size=2, max_steps=6, micro_batch_size=4)
    return run.replace(train=run.train.replace(sero=sero))


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_sero_leaves_the_base_method_unchanged(tmp_path):
    trainer.train(_run(tmp_path / "base", None))
    trainer.train(_run(tmp_path / "sero", SeroConfig(micro_batch_size=4)))
    base, sero = read_metrics(tmp_path / "base")[-1], read_metrics(tmp_path / "sero")[-1]
    for k, v in base.items():
        if k.startswith(("rollout/", "credit/")) or k in ("train/loss", "train/pg_loss", "train/tokens"):
            assert sero[k] == v, k
    assert sero["sero/roots_attempted"] >= 1 and sero["sero/roots_valid"] == sero["sero/roots_attempted"]
    assert sero["sero/ended_mismatch"] == 0 and sero["sero/oracle_steps"] >= 1
    assert "train/oracle_loss" in sero and not any(k.startswith("sero/") for k in base)

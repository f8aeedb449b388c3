"""No oracle at evaluation (METHODS.md "SERO" 6): with every env class's ``oracle`` raising (and counting its calls),
the trainer's evaluations (Sokoban, built by ``trainer.setup`` and called as the trainer calls them) and
``evaluate`` on TextCraft as the tiny preset plays it run to the end without one oracle call, while the SERO branch
of the same trainer does call it (its branches all end ``oracle_error``, nothing trained).
"""

from __future__ import annotations

import collections
import functools

import jax
import numpy as np
import pytest

from agentjax.models import SamplingParams, load_tokenizer
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from agentjax.rollout.collect import CollectConfig
from agentjax.train.config import SeroConfig
from envs.pool import SerialPool
from envs.sokoban.env import SokobanEnv
from envs.textcraft.env import TextCraftEnv

KEY = jax.random.key(0)


def _sampling(width: int, bucket: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_new_tokens=width, stop_token_ids=(IM_END_ID, ENDOFTEXT_ID),
                          prompt_bucket=bucket)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def no_oracle(monkeypatch) -> collections.Counter:
    """Every env class's ``oracle`` raises (and counts its calls)."""
    from envs.alfworld.env import AlfWorldEnv
    from envs.textcraft.env import TextCraftSynthEnv
    from envs.textworld.env import TextWorldCookingEnv
    from envs.textworld_sync.env import TextWorldSyncEnv
    from envs.webshop.env import WebShopEnv

    calls = collections.Counter()
    for cls in (SokobanEnv, TextCraftEnv, TextCraftSynthEnv, WebShopEnv, AlfWorldEnv, TextWorldCookingEnv,
                TextWorldSyncEnv):
        def oracle(self, _name=cls.__name__):
            calls[_name] += 1
            raise RuntimeError(f"{_name}.oracle called")

        monkeypatch.setattr(cls, "oracle", oracle)
    return calls


def test_evaluation_never_calls_the_oracle_but_the_sero_branch_does(no_oracle, tmp_path):
    """The trainer's pieces as ``trainer.train`` uses them (``trainer.setup`` of a tiny Sokoban SERO run; ``evaluate``
    with the flat algorithm's arguments; the update's SERO branch on a training batch), without compiling an update:
    both evaluations (before and after the branch used the pool's branch slots) run without one oracle call and agree
    episode by episode; the branch asks the oracle once per root, and every branch then ends ``oracle_error`` with
    no row trained."""
    from agentjax.rollout.collect import run_episodes
    from agentjax.train import trainer
    from agentjax.train.eval import eval_key, evaluate
    from agentjax.train.state import sync_model
    from tests.train.test_trainer_flat import small_run

    with pytest.raises(RuntimeError, match="SokobanEnv.oracle called"):
        SokobanEnv().oracle()
    no_oracle.clear()
    run = small_run(tmp_path, "graphgpo", eval_tasks=2, eval_seeds=2)
    run = run.with_sizes(num_groups=2, group_size=2, max_steps=6, micro_batch_size=4)
    run = run.replace(train=run.train.replace(sero=SeroConfig(micro_batch_size=4)))
    t = trainer.setup(run)
    flat = t.algorithm
    try:
        sync_model(t.model, t.state, copy=False)
        t.sampler.update_weights(t.model)

        def evaluation():
            return evaluate(flat.pool, t.eval_tasks, t.sampler, run.eval_collect, eval_key(run.train.seed),
                            task_indices=range(len(t.eval_tasks)))

        before = evaluation()
        assert before["episodes"] == 4 and sum(no_oracle.values()) == 0
        idx = [0, 1]
        rollouts = run_episodes(flat.pool, [t.train_tasks[i] for i in idx], t.sampler, run.train_collect, KEY,
                                task_indices=idx)
        rows, metrics, oracle, _ = flat.sero.branch(t.state.params, rollouts, KEY)
        after = evaluation()
    finally:
        t.close()
    assert metrics["roots_attempted"] >= 1 and dict(no_oracle) == {"SokobanEnv": metrics["roots_attempted"]}
    assert metrics["ended_oracle_error"] == metrics["roots_attempted"] == metrics["roots_valid"]
    assert metrics["oracle_steps"] == 0 and metrics["roots_gated"] == 0 and not np.asarray(rows.coef).any()
    assert after["outcomes"] == before["outcomes"] and after["return_mean"] == before["return_mean"]


def test_textcraft_evaluation_needs_no_oracle(no_oracle, tokenizer):
    """TextCraft as the tiny preset plays it (``admissible=True``: the listing holds the planner's next command, which
    the env computes with its planner, never through ``oracle``)."""
    from flax import nnx

    from agentjax.models import Qwen, QwenConfig, Sampler
    from agentjax.train.eval import eval_key, evaluate

    model = Qwen(QwenConfig.tiny_qwen2(vocab_size=151_936, d_model=32, mlp_dim=64, num_layers=1, head_dim=8),
                 rngs=nnx.Rngs(0))
    config = CollectConfig(group_size=2, max_steps=2, max_prompt_tokens=2048, sampling=_sampling(16, 512),
                           row_keys=True)
    tasks = TextCraftEnv.tasks("val")[:1]
    pool = SerialPool(functools.partial(TextCraftEnv, admissible=True), 2)
    out = evaluate(pool, tasks, Sampler(model, tokenizer), config, eval_key(0),
                   task_indices=[0])
    assert out["episodes"] == 2 and out["episode_length_mean"] == 2 and out["success_rate"] == 0.0
    assert sum(no_oracle.values()) == 0

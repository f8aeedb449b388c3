"""One process of the multi-host tests (tests/parallel/test_multihost.py): ``python -m tests.parallel.multihost_worker
SCENARIO OUT_DIR``, started by :class:`agentjax.parallel.launch.LocalJob` (2 processes x 4 CPU devices).

Every scenario checks its claims with ``assert`` in every process (a failure ends the process, and the job's error
shows the traceback) and process 0 writes ``OUT_DIR/<scenario>.json`` with what the test asserts on besides.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec as P

from agentjax.agents import ALFWORLD, project_action
from agentjax.models import Qwen, QwenConfig, Sampler, SamplingParams, load_tokenizer
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from agentjax.parallel import fsdp_tp, initialize_distributed, make_mesh
from agentjax.parallel.global_batch import (
    global_rows,
    global_step_batch,
    global_tree_batch,
    host_local_model,
    process_devices,
)
from agentjax.parallel.multihost import (
    barrier,
    gather_ints,
    gather_objects,
    is_main,
    merge_rollouts,
    portable,
    share,
    shares,
)
from agentjax.parallel.rules import create_sharded
from agentjax.rollout import StepBatch
from agentjax.rollout.collect import CollectConfig, run_episodes, to_step_batch
from agentjax.rollout.stats import summarize
from agentjax.rollout.tree_collect import TreeRollouts, to_tree_batch
from agentjax.train.advantages import compute_advantages
from agentjax.train.checkpoint import Checkpointer
from agentjax.train.config import GRPOCredit, RAOCredit, RolloutConfig, SeroConfig, TrainConfig
from agentjax.train.eval import evaluate
from agentjax.train.presets import preset
from agentjax.train.shares import check_processes, flat_batch, play_share
from agentjax.train.state import init_state
from agentjax.train.tree_credit import row_credit
from envs.pool import SerialPool
from envs.sokoban.env import SokobanEnv
from tests.envs.toy_env import ChainEnv
from tests.train.tree_batches import CONFIG as TREE_CONFIG
from tests.train.tree_batches import hand_trees

jax.config.update("jax_numpy_rank_promotion", "raise")
PROCESSES = 2
MESHES = {"fsdp8": (8, 1), "fsdp2xtp4": (2, 4)}
TINY = QwenConfig.tiny_qwen2(vocab_size=151_936, d_model=32, mlp_dim=64, num_layers=1, head_dim=8)
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=10, stop_token_ids=(IM_END_ID, ENDOFTEXT_ID),
                          prompt_bucket=640)
TOY = dataclasses.replace(ALFWORLD, name="toy")


def full(x) -> np.ndarray:
    """A global array's value on the host (every process gets all of it)."""
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def write(out_dir: str, scenario: str, facts: dict) -> None:
    if is_main():
        with open(os.path.join(out_dir, f"{scenario}.json"), "w") as f:
            json.dump(facts, f, indent=1)


# -- pieces -----------------------------------------------------------------------------------------------------------
def synthetic_rows(groups: range, rng_seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of the given (global) groups: group g has 1 + g % 3 rollouts of 1 + (g + r) % 2 steps, token values a
    function of (g, r, t) so that any misplaced row shows."""
    rows = []
    for g in groups:
        for r in range(1 + g % 3):
            for t in range(1 + (g + r) % 2):
                rows.append((g, r, t))
    n = len(rows)
    logp = [np.random.default_rng([rng_seed, g, r, t]).normal(size=4) for g, r, t in rows]
    col = lambda f: np.array([f(g, r, t) for g, r, t in rows], np.int32)  # noqa: E731
    return dict(prompt_tokens=col(lambda g, r, t: [1000 * g + 10 * r + t] * 3).reshape(n, 3),
                response_tokens=col(lambda g, r, t: [g, r, t, 7]).reshape(n, 4),
                response_mask=np.ones((n, 4), bool), behaviour_logp=np.array(logp, np.float32).reshape(n, 4),
                reward=col(lambda g, r, t: 10 * (t == (g + r) % 2)).astype(np.float32),
                done=col(lambda g, r, t: t == (g + r) % 2).astype(bool), group=col(lambda g, r, t: g),
                rollout=col(lambda g, r, t: r), step=col(lambda g, r, t: t), task=col(lambda g, r, t: 100 + g))


def check_rows(mesh, groups_total: int, capacity: int) -> dict:
    mine = share(groups_total)
    local = synthetic_rows(mine.indices())
    local["group"] = local["group"] - mine.start  # a collector numbers its groups from 0
    piece = StepBatch.from_rows(capacity, 6, 4, **local)
    got = global_step_batch(piece, mine, mesh, fsdp_tp())
    want = StepBatch.from_rows(capacity, 6, 4, **synthetic_rows(range(groups_total)))
    for field in dataclasses.fields(want):
        if getattr(want, field.name) is None:
            continue
        np.testing.assert_array_equal(full(getattr(got, field.name)), np.asarray(getattr(want, field.name)),
                                      err_msg=field.name)
    assert got.reward.sharding.spec == P("fsdp"), got.reward.sharding
    assert got.prompt_tokens.sharding.spec == P("fsdp", None), got.prompt_tokens.sharding
    # credit runs on the assembled batch as on the whole one
    ro = RolloutConfig(num_groups=groups_total, group_size=3, max_steps=2, prompt_len=6, response_len=4,
                       capacity=capacity)
    adv = compute_advantages(GRPOCredit(), got, ro, check=False)
    ref = compute_advantages(GRPOCredit(), want, ro)
    np.testing.assert_array_equal(full(adv.advantage), np.asarray(ref.advantage))
    return {"real_rows": int(np.asarray(want.row_mask).sum()), "capacity": capacity}


def check_trees(mesh) -> dict:
    trees = hand_trees()  # 2 root tasks x 3 trees: process p grows task p
    mine = share(2)
    local = [dataclasses.replace(t, group=t.group - mine.start) for t in trees if t.group in mine.indices()]
    whole = to_tree_batch(_tree_rollouts(trees, 2), TREE_CONFIG)
    piece = to_tree_batch(_tree_rollouts(local, mine.size), TREE_CONFIG.replace(capacity=whole.steps.capacity))
    got = global_tree_batch(piece, mine, mesh, fsdp_tp())
    fields = lambda x, y: [(f.name, getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(y)]  # noqa: E731
    pairs = fields(got.steps, whole.steps) + [("role", got.role, whole.role)] + fields(got.trees, whole.trees)
    for name, a, b in pairs:
        if b is not None:
            np.testing.assert_array_equal(full(a), np.asarray(b), err_msg=name)
    for stage in ("execution", "decomposition"):
        a, b = row_credit(got, RAOCredit(), stage), row_credit(whole, RAOCredit(), stage)
        np.testing.assert_array_equal(full(a.advantage), np.asarray(b.advantage), err_msg=stage)
        np.testing.assert_array_equal(full(a.token_mask), np.asarray(b.token_mask), err_msg=stage)
    return {"trees": int(whole.num_trees), "rows": int(np.asarray(whole.steps.row_mask).sum())}


def _tree_rollouts(trees, groups: int) -> TreeRollouts:
    return TreeRollouts(trees=tuple(trees), forks=(), searches=(), searches_not_run=0, num_groups=groups,
                        trees_per_task=3, live_per_call=(), padded_per_call=(), judge_metrics={}, rubric_metrics={},
                        prompt_seconds=0.0, generate_seconds=0.0, env_seconds=0.0, judge_seconds=0.0,
                        rubric_seconds=0.0, total_seconds=0.0)


def check_sampler(mesh, tokenizer) -> tuple[Sampler, dict]:
    """The per-process sampling copy holds the model's exact parameters on this process's devices and samples as
    an unsharded copy does."""
    model = create_sharded(TINY, fsdp_tp(), mesh, seed=0)
    local = host_local_model(model, mesh)
    want = jax.jit(lambda: nnx.split(Qwen(TINY, rngs=nnx.Rngs(0)))[1])()  # bitwise create_sharded's values
    state = nnx.state(local)
    mesh_devices = set(mesh.local_mesh.devices.flat)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(want), strict=True):
        assert a.is_fully_addressable and set(a.sharding.device_set) <= mesh_devices, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))
    prompts = [tokenizer.encode(f"prompt {jax.process_index()} {i}") for i in range(4)]
    key = jax.random.key(7)
    got = Sampler(local, tokenizer).generate(prompts, SAMPLING, key)
    ref = Sampler(Qwen(TINY, rngs=nnx.Rngs(0)), tokenizer).generate(prompts, SAMPLING, key)
    np.testing.assert_array_equal(got.tokens_bt, ref.tokens_bt)
    diff = float(np.abs(got.logp_bt - ref.logp_bt).max())
    assert diff < 1e-4, diff
    return Sampler(local, tokenizer), {"sampler_logp_max_abs_diff": diff}


def check_collection(sampler) -> dict:
    """Groups played in shares (slot offsets) are the groups one process plays: same actions and tokens, and the
    assembled batch is the whole batch."""
    config = CollectConfig(group_size=2, max_steps=3, max_prompt_tokens=640, sampling=SAMPLING, constrained=True,
                           row_keys=True, capacity=32)
    tasks = ChainEnv.tasks("train")[:5]
    key = jax.random.key(11)
    play = functools.partial(run_episodes, template=TOY, projector=project_action)
    played = play_share(lambda t, i, first: play(SerialPool(ChainEnv, 10), t, sampler, config, key, task_indices=i,
                                                 slot_offset=first),
                        tasks, range(len(tasks)), slots_per_task=config.group_size, merge=merge_rollouts,
                        portable_form=portable, allow_empty=False)
    mine, merged = played.share, played.merged
    assert [mine.start, mine.stop] == [[0, 2], [2, 5]][jax.process_index()]
    whole = play(SerialPool(ChainEnv, 10), tasks, sampler, config, key, task_indices=range(len(tasks)))
    assert [ep.actions for ep in merged.episodes] == [ep.actions for ep in whole.episodes]
    assert [(ep.group, ep.rollout, ep.task_index) for ep in merged.episodes] == [
        (ep.group, ep.rollout, ep.task_index) for ep in whole.episodes]
    logp_diff = max(float(np.abs(a.logp - b.logp).max()) for x, y in zip(merged.episodes, whole.episodes, strict=True)
                    for a, b in zip(x.turns, y.turns, strict=True))
    for x, y in zip(merged.episodes, whole.episodes, strict=True):
        for a, b in zip(x.turns, y.turns, strict=True):
            np.testing.assert_array_equal(a.response_ids, b.response_ids)
    stats_a, stats_b = summarize(merged).as_dict(), summarize(whole).as_dict()
    differ = sorted(k for k in stats_b if stats_a.get(k) != stats_b[k] and not k.endswith("_seconds"))
    assert differ in ([], ["rollout/num_padded_rows"]), differ
    mesh = make_mesh(8, 1)
    ro = RolloutConfig(num_groups=5, group_size=2, max_steps=3, prompt_len=640, response_len=10, capacity=32)
    got = flat_batch(played, config, ro, mesh)
    want = to_step_batch(whole, config)
    assert got.reward.sharding.spec == P("fsdp")
    for field in dataclasses.fields(want):
        if getattr(want, field.name) is not None:
            np.testing.assert_allclose(full(getattr(got, field.name)), np.asarray(getattr(want, field.name)),
                                       rtol=0, atol=1e-5, err_msg=field.name)
    # evaluation (Sokoban, 3 tasks x 2 seeds): each process plays its share of the tasks and gets the whole result
    soko = CollectConfig.sokoban(group_size=2, max_steps=3, max_prompt_tokens=640, sampling=SAMPLING, reward="env",
                                 constrained=True, row_keys=True)
    soko_tasks = SokobanEnv.tasks("train")[:3]
    evaluated = evaluate(SerialPool(SokobanEnv, 6), soko_tasks, sampler, soko, key)
    alone = run_episodes(SerialPool(SokobanEnv, 6), soko_tasks, sampler, soko, key, task_indices=range(3))
    assert evaluated["outcomes"] == [[int(alone.episodes[2 * t + s].won) for s in range(2)] for t in range(3)]
    stats = summarize(alone)
    assert (evaluated["return_mean"], evaluated["invalid_rate"], evaluated["episode_length_mean"]) == (
        stats.mean_return, stats.invalid_rate, stats.mean_episode_length)
    return {"episodes": len(merged.episodes), "turns": int(stats_b["rollout/num_turns"]),
            "eval_episode_length": evaluated["episode_length_mean"],
            "collection_logp_max_abs_diff": logp_diff, "stats_that_differ": differ,
            "actions": sorted({a for ep in whole.episodes for a in ep.actions})}


def pieces(out_dir: str) -> None:
    p, count = jax.process_index(), jax.process_count()
    assert count == PROCESSES and jax.device_count() == 8 and jax.local_device_count() == 4
    facts: dict = {"shares": [[s.start, s.stop] for s in shares(5)]}
    assert gather_objects({"p": p, "share": share(5).start}) == [{"p": 0, "share": 0}, {"p": 1, "share": 2}]
    np.testing.assert_array_equal(gather_ints([p, 10 * p]), [[0, 0], [1, 10]])
    for name, shape in MESHES.items():
        mesh = make_mesh(*shape)
        assert process_devices(mesh).shape == (2, 4)
        facts[f"rows_{name}"] = check_rows(mesh, groups_total=5, capacity=32)
        facts[f"trees_{name}"] = check_trees(mesh)
    # a piece whose length the local devices do not divide (staged whole on each process's devices)
    odd = global_rows(np.arange(6) + 100 * p, 3 + p, 8, make_mesh(8, 1), P("fsdp"))
    np.testing.assert_array_equal(full(odd), [0, 1, 2, 100, 101, 102, 103, 3])
    tokenizer = load_tokenizer()
    sampler, facts["sampler"] = check_sampler(make_mesh(2, 4), tokenizer)
    facts["collection"] = check_collection(sampler)
    write(out_dir, "pieces", facts)


# -- checkpoints ----------------------------------------------------------------------------------------------------
def checkpoint(out_dir: str) -> None:
    """Every process saves and restores the sharded state through orbax's multi-process path; a corrupt newest step
    falls back to the previous one on every process."""
    mesh = make_mesh(8, 1)
    config = TrainConfig()
    model = create_sharded(TINY.replace(vocab_size=512), fsdp_tp(), mesh, seed=3)
    state = init_state(config, model, jax.random.key(3))
    directory = os.path.join(out_dir, "checkpoints")
    bump = jax.jit(lambda s: s.replace(step=s.step + 1, params=jax.tree.map(lambda x: x + 1, s.params)),
                   donate_argnums=())
    with Checkpointer(directory, max_to_keep=2) as ckpt:
        ckpt.save(state)
        later = bump(state)
        ckpt.save(later, metadata={"note": "second"})
        ckpt.wait()
        assert ckpt.steps() == [0, 1]
        restored = ckpt.restore_latest(state)
    assert restored.step == 1 and restored.metadata == {"note": "second"}
    for a, b, like in zip(jax.tree.leaves(restored.state), jax.tree.leaves(later), jax.tree.leaves(state),
                          strict=True):
        assert a.sharding == like.sharding, (a.sharding, like.sharding)
        np.testing.assert_array_equal(full(a), full(b))
    # damage step 1 (process 0, shared folder), then every process falls back to step 0 and moves step 1 aside
    if is_main():
        damaged = 0
        for root, _, files in os.walk(os.path.join(directory, "1", "state")):
            for name in files:
                if name != "_METADATA" and os.path.getsize(os.path.join(root, name)) > 64:
                    with open(os.path.join(root, name), "r+b") as f:
                        f.seek(32)
                        f.write(b"\xff" * 32)
                    damaged += 1
        assert damaged
    barrier("damaged")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Checkpointer(directory) as ckpt:
            fallback = ckpt.restore_latest(state)
            steps_after = ckpt.steps()
    assert fallback.step == 0, fallback.step
    assert any("falling back" in str(w.message) for w in caught)
    for a, b in zip(jax.tree.leaves(fallback.state), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(full(a), full(b))
    moved = sorted(os.listdir(os.path.join(directory, "corrupt")))
    assert steps_after == [0] and len(moved) == 1 and moved[0].startswith("1-"), (steps_after, moved)
    # a last save for the single-process reader of the test
    with Checkpointer(directory) as ckpt:
        ckpt.save(bump(bump(state)))
    write(out_dir, "checkpoint", {"steps": [0, 2], "directory": directory, "corrupt": moved,
                                  "refusals": refusals()})


def refusals() -> dict[str, str]:
    """What a 2-process job refuses to train, with the messages (check_processes)."""
    run = preset("tiny", "grpo", "sokoban").replace(mesh=(8, 1))
    check_processes(run)  # trains
    cases = {"no mesh": run.replace(mesh=None), "tp across hosts": run.replace(mesh=(1, 8)),
             "one group": run.with_sizes(num_groups=1, capacity=160), "sero": preset("tiny", "grpo", "sokoban").replace(
                 mesh=(8, 1), train=run.train.replace(sero=SeroConfig())),
             "mdp": preset("tiny", "grpo", "mdp").replace(mesh=(8, 1))}
    out = {}
    for name, case in cases.items():
        try:
            check_processes(case)
        except ValueError as e:
            out[name] = str(e)
    assert set(out) == set(cases), out
    return out


# -- a job that waits ------------------------------------------------------------------------------------------------
def wait(out_dir: str) -> None:
    """Gathers once a second for two minutes (the test kills a process meanwhile)."""
    gather_ints([jax.process_index()])
    print("ready", flush=True)
    for _ in range(120):
        gather_ints([jax.process_index()])
        time.sleep(1.0)


SCENARIOS = {"pieces": pieces, "checkpoint": checkpoint, "wait": wait}

if __name__ == "__main__":
    assert initialize_distributed() is True  # before any computation
    scenario, out = sys.argv[1], sys.argv[2]
    SCENARIOS[scenario](out)
    jax.distributed.shutdown()

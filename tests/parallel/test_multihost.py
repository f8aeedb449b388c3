"""Multi-host pieces: shares, the gather index, global rows, merged records, slot offsets, the local launcher; and, with
2 real processes x 4 CPU devices (tests/parallel/multihost_worker.py): global batches equal to the whole batch,
credit on them, per-process sampling copies, collection in shares, orbax checkpoints, a lost process.

The jobs run under :class:`agentjax.parallel.launch.LocalJob` (a local coordinator, ``AGENTJAX_*`` variables).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from agentjax.agents import project_action
from agentjax.models import Qwen, Sampler, load_tokenizer
from agentjax.parallel import fsdp_tp, make_mesh
from agentjax.parallel.global_batch import gather_index, global_rows, global_step_batch
from agentjax.parallel.launch import JobFailed, LocalJob, job_env, run_local
from agentjax.parallel.multihost import (
    gather_objects,
    merge_rollouts,
    merge_tree_rollouts,
    on_main,
    portable,
    share,
    shares,
)
from agentjax.parallel.rules import create_sharded
from agentjax.rollout import StepBatch
from agentjax.rollout.collect import CollectConfig, run_episodes, to_step_batch
from agentjax.rollout.stats import summarize
from agentjax.rollout.tree_collect import TreeRollouts
from agentjax.train.checkpoint import Checkpointer
from agentjax.train.config import TrainConfig
from agentjax.train.metrics import MetricsWriter
from agentjax.train.state import init_state
from envs.pool import SerialPool
from tests.envs.toy_env import ChainEnv
from tests.parallel.multihost_worker import SAMPLING, TINY, TOY, synthetic_rows
from tests.train.tree_batches import hand_trees

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = [sys.executable, "-m", "tests.parallel.multihost_worker"]


# -- shares ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("total,count", [(5, 2), (8, 2), (16, 3), (1, 2), (0, 2), (7, 1)])
def test_shares_are_contiguous_balanced_and_cover_everything(total, count):
    parts = shares(total, count)
    assert [s.start for s in parts] == [0] + [s.stop for s in parts[:-1]] and parts[-1].stop == total
    sizes = [s.size for s in parts]
    assert max(sizes) - min(sizes) <= 1
    assert share(total, index=count - 1, count=count) == parts[-1]
    items = [f"task{i}" for i in range(total)]
    assert sum((s.take(items) for s in parts), []) == items


def test_share_errors_and_this_process():
    assert share(6) == share(6, index=0, count=1) and share(6).indices() == range(6)
    with pytest.raises(ValueError, match="process index 2 of 2"):
        share(4, index=2, count=2)
    with pytest.raises(ValueError, match="3 items for a share of 4"):
        share(4).take([1, 2, 3])
    assert gather_objects({"a": 1}) == [{"a": 1}] and on_main(lambda x: x + 1, 1) == 2


# -- the gather index and global rows on one process -------------------------------------------------------------------
def test_gather_index_lays_out_real_rows_in_process_order_then_padding():
    # pieces of length 4: process 0 has 2 real rows, process 1 has 3, process 2 none
    np.testing.assert_array_equal(gather_index([2, 3, 0], 4, 8), [0, 1, 4, 5, 6, 2, 2, 2])
    np.testing.assert_array_equal(gather_index([4, 1], 4, 6), [0, 1, 2, 3, 4, 5])  # padding from process 1
    np.testing.assert_array_equal(gather_index([4, 4], 4, 8), np.arange(8))  # full, no padding needed
    with pytest.raises(ValueError, match="do not fit the global capacity 6"):
        gather_index([4, 3], 4, 6)
    with pytest.raises(ValueError, match="every piece is full"):
        gather_index([4, 4], 4, 9)
    with pytest.raises(ValueError, match=r"outside \[0, 4\]"):
        gather_index([5, 0], 4, 8)


def test_global_rows_on_one_process_places_the_batch_on_the_mesh():
    mesh = make_mesh(8, 1)
    batch = StepBatch.from_rows(16, 6, 4, **synthetic_rows(range(4)))
    got = global_step_batch(batch, share(4), mesh, fsdp_tp())
    for field in dataclasses.fields(batch):
        if getattr(batch, field.name) is not None:
            np.testing.assert_array_equal(np.asarray(getattr(got, field.name)), np.asarray(getattr(batch, field.name)))
    assert got.reward.sharding.spec == P("fsdp") and got.prompt_tokens.sharding.spec == P("fsdp", None)
    odd = global_rows(np.arange(5), 3, 6, mesh, P("fsdp"))  # 6 rows do not split over 8 devices: replicated
    np.testing.assert_array_equal(np.asarray(odd), [0, 1, 2, 3, 3, 3])
    assert odd.sharding.spec == P(None)
    with pytest.raises(ValueError, match="different row counts"):
        global_rows({"a": np.zeros(3), "b": np.zeros(4)}, 1, 4, mesh)


# -- collection in shares (one process plays both shares) -------------------------------------------------------------
@pytest.fixture(scope="module")
def sampler():
    return Sampler(Qwen(TINY, rngs=nnx.Rngs(0)), load_tokenizer())


def test_groups_played_in_shares_with_slot_offsets_are_the_groups_played_at_once(sampler):
    """Row keys and sample seeds follow the batch slot: two calls on shares 3 + 2 of 5 groups (the slot offset of
    the second: 3 groups x G) play the episodes of one call on all 5, token for token; the merged records give the
    same statistics (but the padding, which depends on each call's live rows)."""
    config = CollectConfig(group_size=2, max_steps=3, max_prompt_tokens=640, sampling=SAMPLING, constrained=True,
                           row_keys=True, capacity=48)
    tasks, key = ChainEnv.tasks("train")[:5], jax.random.key(4)
    play = lambda part, offset: run_episodes(  # noqa: E731
        SerialPool(ChainEnv, 10), part, sampler, config, key, template=TOY, projector=project_action,
        slot_offset=offset)
    whole = play(tasks, 0)
    parts = [play(s.take(tasks), s.start * config.group_size) for s in shares(5, 2)]
    merged = merge_rollouts([portable(p) for p in parts])
    assert [ep.actions for ep in merged.episodes] == [ep.actions for ep in whole.episodes]
    assert [(ep.group, ep.rollout) for ep in merged.episodes] == [(ep.group, ep.rollout) for ep in whole.episodes]
    assert len({ep.actions for ep in whole.episodes}) > 1  # the sampling streams differ between slots
    a, b = summarize(merged).as_dict(), summarize(whole).as_dict()
    assert {k for k in b if a[k] != b[k] and not k.endswith("_seconds")} <= {"rollout/num_padded_rows"}
    assert a["rollout/num_generate_calls"] == b["rollout/num_generate_calls"]
    # without the offset the second share replays the first share's streams
    shifted = play(shares(5, 2)[1].take(tasks), 0)
    assert [ep.actions for ep in shifted.episodes] != [ep.actions for ep in whole.episodes[4:]]
    # a piece numbers its groups from 0; placed as the second share, its groups move to 2, 3, 4
    piece = to_step_batch(parts[1], config)
    placed = global_step_batch(piece, shares(5, 2)[1], make_mesh(8, 1), fsdp_tp())
    mask = np.asarray(piece.row_mask)
    np.testing.assert_array_equal(np.asarray(placed.group)[mask], np.asarray(piece.group)[mask] + 2)
    assert sorted(set(np.asarray(placed.group)[mask].tolist())) == [2, 3, 4]


def test_merge_tree_rollouts_renumbers_groups_and_sums_the_judges():
    trees = hand_trees()

    def part(group, judge):
        mine = [dataclasses.replace(t, group=0) for t in trees if t.group == group]
        return TreeRollouts(trees=tuple(mine), forks=(), searches=(), searches_not_run=0, num_groups=1,
                            trees_per_task=3, live_per_call=(3, 1), padded_per_call=(8, 8), judge_metrics=judge,
                            rubric_metrics={}, prompt_seconds=1.0, generate_seconds=2.0, env_seconds=0.5,
                            judge_seconds=0.1, rubric_seconds=0.0, total_seconds=4.0 + group)

    merged = merge_tree_rollouts([part(0, {"judge/calls": 2.0}), part(1, {"judge/calls": 1.0})])
    assert [t.group for t in merged.trees] == [t.group for t in trees]
    assert merged.num_groups == 2 and merged.live_per_call == (6, 2) and merged.judge_metrics == {"judge/calls": 3.0}
    assert merged.total_seconds == 5.0
    with pytest.raises(ValueError, match="rubric counters"):
        merge_tree_rollouts([dataclasses.replace(part(0, {}), rubric_metrics={"grade/agreement": 0.5})])


def test_a_writer_without_files_computes_the_line_and_writes_nothing(tmp_path):
    """What the processes other than 0 hold in a multi-host run (MetricsWriter's default there)."""
    writer = MetricsWriter(tmp_path / "run", tensorboard=True, resume_step=3, files=False)
    assert writer.write(4, {"train/loss": np.float32(0.5), "n": 2}) == {"train/loss": 0.5, "n": 2.0}
    writer.flush()
    writer.close()
    assert not (tmp_path / "run").exists()


# -- the launcher ------------------------------------------------------------------------------------------------------
def test_job_env_sets_the_variables_and_the_device_count():
    env = job_env(1, 2, 1234, devices=4, heartbeat_timeout=7,
                  base={"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_cpu_foo=1", "PATH": "/bin"})
    assert env["AGENTJAX_COORDINATOR"] == "localhost:1234" and env["AGENTJAX_PROCESS_ID"] == "1"
    assert env["AGENTJAX_NUM_PROCESSES"] == "2" and env["AGENTJAX_HEARTBEAT_TIMEOUT"] == "7"
    assert env["XLA_FLAGS"] == "--xla_cpu_foo=1 --xla_force_host_platform_device_count=4"
    assert env["JAX_PLATFORMS"] == "cpu" and env["PATH"] == "/bin"


def test_a_failing_process_stops_the_job_with_its_error(tmp_path):
    code = ("import os, sys, time\n"
            "if os.environ['AGENTJAX_PROCESS_ID'] == '1':\n"
            "    sys.exit('process one gives up')\n"
            "time.sleep(60)\n")
    t0 = time.monotonic()
    expected = "(?s)process 1 of 2 exited with status 1.*--resume.*process one gives up"
    with pytest.raises(JobFailed, match=expected) as err:
        run_local([sys.executable, "-c", code], 2, timeout=50, log_dir=str(tmp_path))
    assert time.monotonic() - t0 < 30  # the sleeping process was stopped, not waited for
    assert err.value.results[0].stopped and err.value.results[0].returncode is not None
    results = run_local([sys.executable, "-c", "import os; print('hi', os.environ['AGENTJAX_PROCESS_ID'])"], 2,
                        timeout=60)
    assert [r.stdout.strip() for r in results] == ["hi 0", "hi 1"]


# -- two processes x four devices --------------------------------------------------------------------------------------
def _job(scenario: str, out: str, timeout: float) -> dict:
    run_local([*WORKER, scenario, out], 2, devices=4, timeout=timeout, log_dir=os.path.join(out, "logs"),
              env={"PYTHONPATH": ROOT})
    with open(os.path.join(out, f"{scenario}.json")) as f:
        return json.load(f)


@pytest.mark.slow  # two JAX processes compile the collector and the sampler: `make test-slow`
def test_two_processes_assemble_the_whole_batch_and_play_their_shares(tmp_path):
    """2 processes x 4 devices: StepBatch / TreeBatch pieces on (fsdp 8) and (fsdp 2, tp 4) meshes equal the whole
    batch field by field, GRPO and RAO credit on them equal the whole batch's; each process's sampling copy holds the
    exact parameters on its own devices and samples as an unsharded model does; 5 groups played in shares 2 + 3
    are the 5 groups played by one process, and their batch assembles into the whole batch."""
    facts = _job("pieces", str(tmp_path), timeout=420)
    assert facts["shares"] == [[0, 2], [2, 5]]
    assert facts["rows_fsdp8"]["real_rows"] == facts["rows_fsdp2xtp4"]["real_rows"] > 0
    assert facts["trees_fsdp8"]["trees"] == 6
    assert facts["collection"]["episodes"] == 10 and facts["collection"]["turns"] > 10
    assert len(facts["collection"]["actions"]) > 1
    assert facts["sampler"]["sampler_logp_max_abs_diff"] < 1e-4


@pytest.mark.slow
def test_two_processes_checkpoint_through_orbax_and_one_process_restores_it(tmp_path):
    """Orbax's multi-process save and restore of a state sharded over both processes (async, keep-N, fingerprints),
    the fallback past a damaged newest step on every process; the job's checkpoint restores on 1 process x 8
    devices with the same values. Also what a 2-process job refuses to train (check_processes)."""
    facts = _job("checkpoint", str(tmp_path), timeout=300)
    mesh = make_mesh(8, 1)
    model = create_sharded(TINY.replace(vocab_size=512), fsdp_tp(), mesh, seed=3)
    state = init_state(TrainConfig(), model, jax.random.key(3))
    with Checkpointer(facts["directory"], read_only=True) as ckpt:
        assert ckpt.steps() == facts["steps"]
        restored = ckpt.restore(2, state)
    for a, b in zip(jax.tree.leaves(restored.state.params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), (np.asarray(b) + 1) + 1)  # the job's two jitted increments
    assert int(restored.state.step) == 2
    refused = facts["refusals"]  # check_processes on 2 processes: each message names the fix
    assert "--mesh FSDP TP" in refused["no mesh"] and "within a host" in refused["tp across hosts"]
    assert "--num-groups" in refused["one group"] and "SERO" in refused["sero"] and "one process" in refused["mdp"]


@pytest.mark.slow
def test_a_killed_process_ends_the_job_with_a_clear_error(tmp_path):
    """SIGKILL to process 1: process 0 ends by itself once JAX's coordination service misses process 1's heartbeats
    (5 s here), and the launcher reports which process was lost and that the job can resume."""
    with LocalJob([*WORKER, "wait", str(tmp_path)], 2, devices=4, log_dir=str(tmp_path),
                  env={"PYTHONPATH": ROOT}, heartbeat_timeout=5) as job:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            outs = [open(os.path.join(tmp_path, f"process{i}.out")).read() for i in range(2)]
            if all("ready" in o for o in outs):
                break
            time.sleep(0.5)
        assert all("ready" in o for o in outs), outs
        job.kill(1)
        t0 = time.monotonic()
        code = job.procs[0].wait(timeout=90)
        survivor_seconds = time.monotonic() - t0
        with pytest.raises(JobFailed, match="process 1 of 2 was killed by SIGKILL.*--resume") as err:
            job.wait(timeout=30)
    assert code != 0 and survivor_seconds < 60
    assert "another task died" in err.value.results[0].stderr or "heartbeat" in err.value.results[0].stderr

"""The rollout collector on Sokoban and toy envs with a tiny random Qwen2 (full Qwen vocabulary) and the real tokenizer.

Checked: the StepBatch against the host records field by field (shapes, left/right padding, masks, log-probs,
ids exact within groups, next_anchor chaining, done/terminated/truncated/won); groups share the reset state;
constrained decoding only emits admissible actions; rewards equal an independent replay of the actions in a fresh
env minus the penalty; a scripted policy pins rewards, penalties and invalid reasons by hand in both reward modes
and the history window of the prompts; finished rows leave the batch; same key -> same batch (also across
SerialPool / EnvPool); the batch feeds to_groups, GiGPO and CRBC; prompt budget, env exceptions and bad input.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
from typing import Any, ClassVar

import jax
import numpy as np
import pytest
from flax import nnx
from jaxtyping import TypeCheckError

from agentjax.agents import ALFWORLD, SOKOBAN, build_messages, encode_prompt, project_action
from agentjax.credit import batched_crbc, batched_gigpo
from agentjax.models import Finish, Qwen, QwenConfig, SampleOutput, Sampler, SamplingParams, load_tokenizer
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID, IM_START_ID
from agentjax.rollout import NO_ID, check_unique_positions, to_groups
from agentjax.rollout.collect import CollectConfig, collect, run_episodes, sample_seeds, to_step_batch
from agentjax.rollout.stats import summarize
from envs.base import Env, Obs, Task, step_info
from envs.mdp import MDPEnv
from envs.pool import EnvPool, SerialPool
from envs.sokoban.env import SokobanEnv
from tests.envs.toy_env import ChainEnv

STOPS = (IM_END_ID, ENDOFTEXT_ID)
# One sampling setting (and one prompt bucket) for every sampler run: the programs compile once per constraint mode.
# 10 new tokens hold every constrained reply here ("<action>climb</action>" is 8 tokens) and its stop token.
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=10, stop_token_ids=STOPS, prompt_bucket=640)
SCRIPTED = dataclasses.replace(SAMPLING, max_new_tokens=32)  # scripted policies compile nothing
SOKOBAN_CONFIG = CollectConfig.sokoban(group_size=4, max_steps=4, max_prompt_tokens=640, sampling=SAMPLING,
                                       reward="env")
SOKOBAN_TASKS = SokobanEnv.tasks("train")[:2]
TOY = dataclasses.replace(ALFWORLD, name="toy")
# The player (P) stands below the box (X), the target (O) is above it: "up" from the start square wins.
PUSH_ROOM = "######\n#____#\n#_O__#\n#_X__#\n#_P__#\n######"


class LadderEnv(Env):
    """Episodes of exactly ``1 + seed`` steps whatever the actions; won when every action was "climb"."""

    name: ClassVar[str] = "ladder"

    def __init__(self, max_steps: int = 10):
        super().__init__(max_steps)
        self.rung, self.length = 0, 0

    def _obs(self) -> Obs:
        anchor = f"rung {self.rung}"
        return Obs(text=f"You are on {anchor}.", anchor=anchor, admissible=("climb", "rest"),
                   instruction="Climb the ladder.")

    def _reset(self, task: Task) -> Obs:
        self.rung, self.length = 0, 1 + task.seed
        return self._obs()

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        self.rung += action == "climb"
        done = self.steps + 1 >= self.length
        won = done and self.rung == self.length
        return self._obs(), float(won), done, step_info(won=won, truncated=False, valid=action in ("climb", "rest"))

    def snapshot(self) -> Any:
        return self.task, self.rung, self.length, self.steps, self.done

    def restore(self, snapshot: Any) -> Obs:
        self.task, self.rung, self.length, self.steps, self.done = snapshot
        return self._obs()

    def oracle(self) -> str:
        return "climb"

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        return [Task(env=cls.name, task_id=f"ladder-{i}", split=split, seed=i,
                     meta={"task_type": "short" if i < 2 else "long"}) for i in range(4)]


LADDER = dataclasses.replace(ALFWORLD, name="ladder")


class Recording:
    """A policy that forwards to a sampler and records each call's batch size and per-row limits."""

    def __init__(self, sampler: Sampler):
        self.sampler, self.tokenizer, self.config = sampler, sampler.tokenizer, sampler.config
        self.calls: list[tuple[int, list[int]]] = []

    def generate(self, prompts, params, key, **kw) -> SampleOutput:
        self.calls.append((len(prompts), list(np.asarray(kw["max_new_tokens"]))))
        return self.sampler.generate(prompts, params, key, **kw)


class Scripted:
    """A policy replying ``replies[t]`` at turn ``t`` in every row (tokens: the encoded reply and <|im_end|>)."""

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer, self.replies, self.turn = tokenizer, replies, 0

    def generate(self, prompts, params, key, **kw) -> SampleOutput:
        text = self.replies[self.turn]
        self.turn += 1
        ids = (self.tokenizer.encode(text, add_special_tokens=False) + [IM_END_ID])[: params.max_new_tokens]
        b, t = len(prompts), params.max_new_tokens
        tokens = np.zeros((b, t), np.int32)
        tokens[:, : len(ids)] = ids
        logp = np.where(np.arange(t) < len(ids), -0.5, 0.0).astype(np.float32)
        return SampleOutput(tokens_bt=tokens, logp_bt=np.tile(logp, (b, 1)), logp_unmasked_bt=np.tile(2 * logp, (b, 1)),
                            length_b=np.full(b, len(ids), np.int32), finish_b=np.full(b, Finish.STOP_TOKEN, np.int32),
                            texts=[text] * b)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def sampler(tokenizer):
    config = QwenConfig.tiny_qwen2(vocab_size=151_936, d_model=32, mlp_dim=64, num_layers=1, head_dim=8)
    return Sampler(Qwen(config, rngs=nnx.Rngs(0)), tokenizer)


@pytest.fixture(scope="module")
def soko_free(sampler):
    """Unconstrained: the random policy's replies are invalid; every episode runs to the collector's cap."""
    config = SOKOBAN_CONFIG
    rollouts = run_episodes(SerialPool(SokobanEnv, 8), SOKOBAN_TASKS, sampler, config, jax.random.key(0))
    return config, rollouts, to_step_batch(rollouts, config)


@pytest.fixture(scope="module")
def soko_constrained(sampler):
    config = SOKOBAN_CONFIG.replace(constrained=True)
    rollouts = run_episodes(SerialPool(SokobanEnv, 8), SOKOBAN_TASKS, sampler, config, jax.random.key(3))
    return config, rollouts, to_step_batch(rollouts, config)


def _np(batch) -> types.SimpleNamespace:
    """The batch's fields as NumPy arrays (a StepBatch only holds jax arrays)."""
    return types.SimpleNamespace(**{f.name: np.asarray(getattr(batch, f.name)) for f in dataclasses.fields(batch)},
                                 capacity=batch.capacity)


@pytest.mark.parametrize("run", ["soko_free", "soko_constrained"])
def test_batch_matches_the_host_records(run, request, tokenizer):
    config, rollouts, batch = request.getfixturevalue(run)
    b = _np(batch)
    rows = [(ep, turn) for ep in rollouts.episodes for turn in ep.turns]
    n = len(rows)
    lr = config.max_response_tokens
    assert b.prompt_tokens.shape == (batch.capacity, 640) and b.response_tokens.shape == (batch.capacity, lr)
    assert batch.capacity % config.row_bucket == 0 and batch.capacity >= n
    np.testing.assert_array_equal(b.row_mask, np.arange(batch.capacity) < n)
    assert not b.prompt_mask[n:].any() and not b.response_mask[n:].any() and (b.behaviour_logp[n:] == 0).all()
    generation_prompt = tokenizer.encode("<|im_start|>assistant\n")
    for i, (ep, turn) in enumerate(rows):
        k, m = len(turn.prompt_ids), len(turn.response_ids)
        np.testing.assert_array_equal(b.prompt_mask[i], np.arange(640) >= 640 - k)  # left padding
        np.testing.assert_array_equal(b.prompt_tokens[i, 640 - k:], turn.prompt_ids)
        assert b.prompt_tokens[i, 640 - k] == IM_START_ID
        assert turn.prompt_ids[-len(generation_prompt):].tolist() == generation_prompt
        np.testing.assert_array_equal(b.response_mask[i], np.arange(lr) < m)  # right padding, stop token included
        np.testing.assert_array_equal(b.response_tokens[i, :m], turn.response_ids)
        np.testing.assert_array_equal(b.behaviour_logp[i, :m], turn.logp)
        assert (b.behaviour_logp[i, m:] == 0).all() and (b.behaviour_logp[i, :m] <= 0).all()
        assert np.isfinite(b.behaviour_logp[i]).all()
        if turn.finish == Finish.STOP_TOKEN:
            assert turn.response_ids[-1] in STOPS and turn.reply == tokenizer.decode(turn.response_ids[:-1])
        else:
            assert turn.finish == Finish.LENGTH and m == lr
        last = turn is ep.turns[-1]
        assert (b.group[i], b.task[i], b.rollout[i], b.step[i]) == (ep.group, ep.group, ep.rollout, turn.step)
        assert b.done[i] == last and b.done[i] == (b.terminated[i] | b.truncated[i])
        assert not (b.terminated[i] and b.truncated[i]) and (b.won[i] <= (last and b.terminated[i]))
        assert b.reward[i] == np.float32(turn.reward) and b.valid[i] == turn.valid
    assert (b.node[:n] == NO_ID).all() and (b.parent[:n] == NO_ID).all() and (b.depth == 0).all()
    check_unique_positions(batch)
    for ep in rollouts.episodes:  # steps 0..T-1 of each rollout, the last one done
        assert [t.step for t in ep.turns] == list(range(ep.length)) and ep.turns[-1].done
        assert all(not t.done for t in ep.turns[:-1])
    # ids: exact within a group (equal id <=> equal text), next_anchor chains into the next row's anchor
    for g in range(len(SOKOBAN_TASKS)):
        idx = [i for i, (ep, _) in enumerate(rows) if ep.group == g]
        anchors = [rows[i][1].obs.anchor for i in idx] + [rows[i][1].next_obs.anchor for i in idx]
        ids = np.concatenate([b.anchor[idx], b.next_anchor[idx]])
        assert (ids >= 0).all()
        assert len(set(zip(anchors, ids.tolist(), strict=True))) == len(set(anchors)) == len(set(ids.tolist()))
        actions = [rows[i][1].projected.action for i in idx]
        assert len(set(zip(actions, b.action[idx].tolist(), strict=True))) == len(set(actions)) == len(
            set(b.action[idx].tolist()))
    for i in range(n - 1):
        if not b.done[i]:
            assert b.next_anchor[i] == b.anchor[i + 1]


def test_groups_share_the_reset_state(soko_free):
    _, rollouts, batch = soko_free
    b = _np(batch)
    first = {}
    for ep in rollouts.episodes:
        first.setdefault(ep.group, set()).add((ep.turns[0].obs.text, ep.turns[0].obs.anchor))
        assert ep.task == SOKOBAN_TASKS[ep.group]
    assert all(len(v) == 1 for v in first.values())
    assert first[0] != first[1]  # different tasks, different rooms
    assert (b.anchor[(b.step == 0) & b.row_mask] == 0).all()  # the first anchor of every group is its id 0


def test_unconstrained_random_replies_are_invalid_and_charged(soko_free):
    config, rollouts, batch = soko_free
    stats = summarize(rollouts)
    b = _np(batch)
    m = b.row_mask
    assert stats.invalid_rate == 1.0 and not b.valid[m].any()
    np.testing.assert_allclose(b.reward[m], -config.invalid_penalty)  # Sokoban gives 0 for an invalid action
    assert stats.num_turns == m.sum() == len(SOKOBAN_TASKS) * 4 * config.max_steps  # all cut by the cap
    assert b.truncated[b.done].all() and stats.truncation_rate == 1.0 and stats.success_rate == 0.0
    assert stats.num_response_tokens == b.response_mask.sum() and stats.num_prompt_tokens == b.prompt_mask.sum()
    assert sum(stats.invalid_reasons.values()) == stats.num_turns


def test_constrained_decoding_only_plays_admissible_actions(soko_constrained):
    config, rollouts, batch = soko_constrained
    stats = summarize(rollouts)
    assert stats.invalid_rate == 0.0 and bool(np.asarray(batch.valid)[np.asarray(batch.row_mask)].all())
    for ep in rollouts.episodes:
        for turn in ep.turns:
            assert turn.reply in {f"<action>{a}</action>" for a in turn.obs.admissible}
            assert turn.projected.valid and turn.projected.action in ("up", "down", "left", "right")
            assert turn.finish == Finish.STOP_TOKEN
            # the sampling distribution is the masked one: never less likely than under the full vocabulary
            assert (turn.logp_masked >= turn.logp - 1e-5).all() and (turn.logp_masked <= 1e-6).all()
    masked = _np(to_step_batch(rollouts, config.replace(masked_logp=True)))
    rows = [t for ep in rollouts.episodes for t in ep.turns]
    for i, turn in enumerate(rows):
        np.testing.assert_array_equal(masked.behaviour_logp[i, : len(turn.logp_masked)], turn.logp_masked)


def test_masked_logp_records_the_decoders_choices_and_the_trainer_reproduces_its_logp(sampler):
    """With ``masked_logp`` every response position carries the tokens the trie allowed there (the response token
    among them; 1 where the reply is forced, 4 where the action is chosen), and the trainer's log-probs renormalised
    over them equal the sampler's constrained log-probs: the importance ratio starts at 1."""
    from agentjax.train import ModelConfig, TrainConfig, make_logprob_fn

    config = SOKOBAN_CONFIG.replace(constrained=True, masked_logp=True)
    rollouts = run_episodes(SerialPool(SokobanEnv, 8), SOKOBAN_TASKS, sampler, config, jax.random.key(5))
    batch = to_step_batch(rollouts, config)
    b = _np(batch)
    assert b.allowed_tokens.shape == (b.row_mask.shape[0], config.max_response_tokens, config.max_allowed)
    widths = set()
    for i, turn in enumerate(t for ep in rollouts.episodes for t in ep.turns):
        replies = {tuple(sampler.tokenizer.encode(f"<action>{a}</action>", add_special_tokens=False))
                   for a in turn.obs.admissible}
        for j, token in enumerate(turn.response_ids):
            choices = [a for a in b.allowed_tokens[i, j] if a != NO_ID]
            assert token in choices and len(choices) == len(turn.allowed_ids[j])
            prefix = tuple(turn.response_ids[:j])
            expected = {r[j] for r in replies if r[:j] == prefix and len(r) > j}
            if prefix in replies:
                expected |= set(config.sampling.stop_token_ids)
            assert set(choices) == expected
            widths.add(len(choices))
        assert (b.allowed_tokens[i, len(turn.response_ids):] == NO_ID).all()
    assert 1 in widths and 4 in widths
    model = Qwen(sampler.config, rngs=nnx.Rngs(0))  # the sampler's model (same init)
    train = TrainConfig(model=ModelConfig(sampler.config), micro_batch_size=64)
    logp = np.asarray(make_logprob_fn(train, model)(nnx.state(model, nnx.Param), batch))
    m = b.response_mask & b.row_mask[:, None]
    np.testing.assert_allclose(logp[m], b.behaviour_logp[m], atol=2e-4)
    forced = (b.allowed_tokens[..., 1] == NO_ID) & m
    assert forced.any() and np.allclose(logp[forced], 0.0, atol=1e-6)  # a forced token is certain


def test_sparse_decoding_with_dense_draws_collects_the_dense_episodes(sampler):
    """``dense_draws``: the collector's sparse decoding draws the dense path's random numbers, so the episodes (every
    response token, every behaviour log-prob up to float rounding) are the dense collector's."""
    config = SOKOBAN_CONFIG.replace(constrained=True, masked_logp=True)
    runs = [run_episodes(SerialPool(SokobanEnv, 8), SOKOBAN_TASKS, sampler, c, jax.random.key(5))
            for c in (config, config.replace(sparse_logits=True, dense_draws=True))]
    dense, sparse = ([t for ep in r.episodes for t in ep.turns] for r in runs)
    assert len(dense) == len(sparse) and len(dense) > 8
    assert [list(map(int, t.response_ids)) for t in dense] == [list(map(int, t.response_ids)) for t in sparse]
    b_dense, b_sparse = (_np(to_step_batch(r, config)) for r in runs)
    np.testing.assert_allclose(b_sparse.behaviour_logp, b_dense.behaviour_logp, atol=2e-5)
    with pytest.raises(ValueError, match="dense_draws .* needs sparse_logits=True"):
        config.replace(dense_draws=True)


def test_constrained_choices_follow_the_trie():
    from agentjax.rollout.policy import constrained_choices

    replies = [[5, 6], [5, 6, 7], [5, 8]]  # [5, 6] is a prefix of another reply: stop or 7 after it
    assert constrained_choices(replies, (0, 1), [5, 6, 7, 0]) == ((5,), (6, 8), (0, 1, 7), (0, 1))
    assert constrained_choices(replies, (0,), [5, 6, 0]) == ((5,), (6, 8), (0, 7))
    with pytest.raises(ValueError, match="none of the allowed"):
        constrained_choices(replies, (0,), [5, 9])
    with pytest.raises(ValueError, match="needs constrained=True"):
        SOKOBAN_CONFIG.replace(masked_logp=True)


@pytest.mark.parametrize("run", ["soko_free", "soko_constrained"])
def test_rewards_equal_a_replay_in_a_fresh_env_minus_the_penalty(run, request):
    config, rollouts, batch = request.getfixturevalue(run)
    b = _np(batch)
    i = 0
    for ep in rollouts.episodes:
        env = SokobanEnv()
        obs = env.reset(ep.task)
        for turn in ep.turns:
            assert turn.obs == obs
            obs, reward, done, info = env.step(turn.projected.action)
            assert (obs, reward, info["valid"], info["won"]) == (turn.next_obs, turn.env_reward, turn.env_valid,
                                                                 turn.won)
            assert done == (turn.terminated or info["truncated"])
            assert b.reward[i] == np.float32(reward - config.invalid_penalty * (not turn.valid))
            i += 1
    stats = summarize(rollouts)
    assert stats.mean_return == pytest.approx(b.reward.sum() / len(rollouts.episodes), abs=1e-5)
    assert stats.success_rate == np.mean([ep.won for ep in rollouts.episodes])


@pytest.mark.parametrize("reward, expected", [
    ("env", [-0.1, -0.1 - 0.1, -0.1, -0.1, -0.1 + 1 + 10]),
    ("success", [-0.1, -0.1, -0.1, 0.0, 10.0]),
])
def test_scripted_replies_pin_rewards_penalties_and_history(tokenizer, reward, expected):
    replies = ["hello",  # no action block: the tail "hello" is sent, the env rejects it
               "<action>right</action>",  # missing <think>: invalid reply, but the env executes the move
               "<think>a</think><action>jump</action>",  # not a direction: invalid for both
               "<think>b</think><action>left</action>",
               "<think>c</think><action>up</action>"]  # pushes the box onto the target: won
    task = Task(env="sokoban", task_id="push", split="test", meta={"room": PUSH_ROOM, "task_type": "push"})
    config = CollectConfig.sokoban(group_size=2, max_prompt_tokens=640, reward=reward, sampling=SCRIPTED)
    rollouts = run_episodes(SerialPool(SokobanEnv, 3), [task], Scripted(tokenizer, replies), config,
                            jax.random.key(0))
    batch, stats = _np(to_step_batch(rollouts, config)), summarize(rollouts)
    for ep in rollouts.episodes:
        assert [t.reward for t in ep.turns] == pytest.approx(expected)
        assert [t.valid for t in ep.turns] == [False, False, False, True, True]
        assert [t.env_valid for t in ep.turns] == [False, True, False, True, True]
        assert ep.actions == ("hello", "right", "jump", "left", "up")
        assert ep.won and ep.turns[-1].terminated and not ep.turns[-1].truncated
        history = []
        for turn in ep.turns:  # every prompt is the template over the last two records
            messages = build_messages(SOKOBAN, turn.obs, history, turn.step, history_length=2)
            assert turn.prompt_ids.tolist() == encode_prompt(tokenizer, messages)
            history.append((turn.obs.text, turn.projected.action))
    m = batch.row_mask
    np.testing.assert_allclose(batch.reward[m], np.tile(expected, 2), rtol=1e-6)
    np.testing.assert_array_equal(batch.won[m], np.tile([0, 0, 0, 0, 1], 2).astype(bool))
    np.testing.assert_array_equal(batch.behaviour_logp[m][:, 0], -1.0)  # the unmasked log-prob is stored
    assert stats.invalid_reasons == {"bad_format": 2, "missing_think": 2, "no_action": 2}
    assert stats.success_by_task_type == {"push": 1.0} and stats.mean_episode_length == 5.0
    assert stats.mean_return == pytest.approx(sum(expected))
    assert stats.mean_env_return == pytest.approx(-0.1 * 2 + 10.9)  # moves right, left, up
    assert stats.as_dict()["rollout/invalid/no_action"] == 2 and stats.as_dict()["rollout/success/push"] == 1.0


@pytest.fixture(scope="module")
def ladder(sampler):
    """Episodes of 1, 2, 3, 4 steps (two rollouts each), constrained, through a recording policy."""
    policy = Recording(sampler)
    config = CollectConfig(group_size=2, max_steps=8, max_prompt_tokens=640, sampling=SAMPLING, constrained=True,
                           reward="env")
    rollouts = run_episodes(SerialPool(LadderEnv, 8), LadderEnv.tasks("train"), policy, config,
                            jax.random.key(1), template=LADDER, projector=project_action)
    return config, rollouts, policy.calls


def test_finished_rows_drop_out_of_the_batch(ladder):
    config, rollouts, calls = ladder
    assert [ep.length for ep in rollouts.episodes] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert rollouts.live_per_call == (8, 6, 4, 2)  # one call per turn of the longest episode, live rows only
    assert rollouts.padded_per_call == (8, 8, 8, 8)  # padded to batch_bucket
    for (size, limits), live in zip(calls, rollouts.live_per_call, strict=True):
        assert size == 8 and limits == [10] * live + [1] * (8 - live)  # dummy rows generate one token
    stats = summarize(rollouts)
    assert stats.num_generate_calls == 4 and stats.num_padded_rows == 12 and stats.num_turns == 20
    assert stats.truncation_rate == 0.0 and stats.invalid_rate == 0.0
    for ep in rollouts.episodes:
        assert ep.won == all(a == "climb" for a in ep.actions) and ep.turns[-1].terminated
    by_type = {k: np.mean([ep.won for ep in rollouts.episodes if ep.task.meta["task_type"] == k])
               for k in ("short", "long")}
    assert stats.success_by_task_type == pytest.approx(by_type)
    batch = _np(to_step_batch(rollouts, config))
    view = to_groups(to_step_batch(rollouts, config), num_groups=4, num_rollouts=2, max_steps=config.max_steps)
    np.testing.assert_array_equal(np.asarray(view.length), [[1, 1], [2, 2], [3, 3], [4, 4]])
    assert batch.row_mask.sum() == 20


def test_same_key_same_batch_across_runs_and_pools(sampler):
    config = CollectConfig(group_size=2, max_steps=3, max_prompt_tokens=640, sampling=SAMPLING, constrained=True)
    tasks = ChainEnv.tasks("train")[:4]
    run = functools.partial(collect, tasks=tasks, policy=sampler, config=config, template=TOY,
                            projector=project_action, task_indices=[10, 11, 12, 13])
    a, _ = run(SerialPool(ChainEnv, 8), key=jax.random.key(5))
    with EnvPool(ChainEnv, num_slots=8, num_workers=2) as pool:
        c, stats = run(pool, key=jax.random.key(5))
    d, _ = run(SerialPool(ChainEnv, 8), key=jax.random.key(6))
    for field in dataclasses.fields(a):
        np.testing.assert_array_equal(getattr(a, field.name), getattr(c, field.name), err_msg=field.name)
    assert not np.array_equal(np.asarray(a.response_tokens), np.asarray(d.response_tokens))
    np.testing.assert_array_equal(np.unique(np.asarray(a.task)[np.asarray(a.row_mask)]), [10, 11, 12, 13])
    assert stats.env_seconds > 0 and stats.generate_seconds > 0 and stats.total_seconds >= stats.generate_seconds


class FirstExit:
    """A policy replying ``<action>first exit</action>`` in every row: the first label the MDP observation lists."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, params, key, **kw) -> SampleOutput:
        b, t = len(prompts), params.max_new_tokens
        exits = [re.findall(r"exits: ([^\n]*)", self.tokenizer.decode(p))[-1].split(", ") for p in prompts]
        texts = [f"<action>{labels[0]}</action>" for labels in exits]
        tokens, lengths = np.zeros((b, t), np.int32), np.zeros(b, np.int32)
        for i, text in enumerate(texts):
            ids = (self.tokenizer.encode(text, add_special_tokens=False) + [IM_END_ID])[:t]
            tokens[i, :len(ids)], lengths[i] = ids, len(ids)
        logp = np.where(np.arange(t)[None] < lengths[:, None], -0.5, 0.0).astype(np.float32)
        return SampleOutput(tokens_bt=tokens, logp_bt=logp, logp_unmasked_bt=logp, length_b=lengths,
                            finish_b=np.full(b, Finish.STOP_TOKEN, np.int32), texts=texts)


def test_sample_seeds_give_each_episode_its_own_reproducible_slips(tokenizer):
    """The MDPs' slips (s2: 0.2 in every room) under ``sample_seeds``: a deterministic policy's 8 rollouts of a task
    differ only by their slips; the same key repeats every episode, another key changes them."""
    config = CollectConfig(group_size=8, max_steps=14, sampling=SCRIPTED, require_think=False, sample_seeds=True)
    tasks = MDPEnv.tasks("train")[:2]

    def paths(key: int, config: CollectConfig = config) -> list[tuple]:
        rollouts = run_episodes(SerialPool(functools.partial(MDPEnv, setting="s2"), 16), tasks, FirstExit(tokenizer),
                                config, jax.random.key(key))
        assert all(turn.valid for ep in rollouts.episodes for turn in ep.turns)
        return [tuple((t.info["state_id"], t.info["slipped"]) for t in ep.turns) for ep in rollouts.episodes]

    first = paths(0)
    assert paths(0) == first and paths(1) != first
    assert len(set(first[:8])) > 1 and any(slipped for path in first for _, slipped in path)
    assert all(len(set(paths(0, config.replace(sample_seeds=False))[:8])) > 1 for _ in range(2))  # fresh entropy
    assert sample_seeds(jax.random.key(0), 3) == sample_seeds(jax.random.key(0), 3)
    assert len(set(sample_seeds(jax.random.key(0), 16))) == 16


def test_the_batch_feeds_group_views_and_credit_kernels(soko_constrained):
    config, rollouts, batch = soko_constrained
    view = to_groups(batch, num_groups=2, num_rollouts=4, max_steps=config.max_steps)
    lengths = np.array([ep.length for ep in rollouts.episodes]).reshape(2, 4)
    np.testing.assert_array_equal(np.asarray(view.length), lengths)
    np.testing.assert_array_equal(np.asarray(view.success),
                                  np.array([ep.won for ep in rollouts.episodes], np.float32).reshape(2, 4))
    adv_gigpo = np.asarray(batched_gigpo(view))
    crbc = batched_crbc(view)
    assert adv_gigpo.shape == (2, 4, config.max_steps) and np.isfinite(adv_gigpo).all()
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(crbc))
    assert (adv_gigpo[~np.asarray(view.mask)] == 0).all()
    # key 3 gives one win (an early finish) among 8 rollouts: the winning group gets non-zero credit
    won_g = np.asarray(view.success).any(-1)
    assert won_g.sum() == 1 and (np.abs(adv_gigpo[won_g]) > 0).any()
    assert (np.abs(np.asarray(crbc.advantage)[won_g]) > 0).any()


def test_prompt_budget_errors_or_keeps_the_tail(tokenizer):
    task = Task(env="sokoban", task_id="push", split="test", meta={"room": PUSH_ROOM})
    config = CollectConfig.sokoban(group_size=1, max_steps=2, max_prompt_tokens=300, sampling=SCRIPTED)
    policy = Scripted(tokenizer, ["<think>a</think><action>left</action>"] * 2)
    with pytest.raises(ValueError, match="max_prompt_tokens=300.*truncation='left'"):
        run_episodes(SerialPool(SokobanEnv, 1), [task], policy, config, jax.random.key(0))
    policy.turn = 0
    config = config.replace(truncation="left")
    rollouts = run_episodes(SerialPool(SokobanEnv, 1), [task], policy, config, jax.random.key(0))
    history = []
    for turn in rollouts.episodes[0].turns:
        full = encode_prompt(tokenizer, build_messages(SOKOBAN, turn.obs, history, turn.step))
        assert len(full) > 300 and turn.prompt_truncated and turn.prompt_ids.tolist() == full[-300:]
        history.append((turn.obs.text, turn.projected.action))
    assert summarize(rollouts).num_truncated_prompts == 2
    assert bool(np.asarray(to_step_batch(rollouts, config).prompt_mask)[:2].all())


def test_history_too_long_for_the_budget_drops_its_oldest_records_instead_of_stopping(tokenizer):
    """Under truncation="error", a turn whose prompt is too long only because of its history (a 400-digit action:
    invalid, under MAX_ACTION_BYTES, kept in the records) shows fewer records, the oldest dropped first, and counts
    as cut; with room to spare the same turns show both records."""
    task = Task(env="sokoban", task_id="push", split="test", meta={"room": PUSH_ROOM})
    replies = ["<think>a</think><action>" + "7" * 400 + "</action>", "<think>b</think><action>left</action>",
               "<think>c</think><action>right</action>"]

    def episode(budget: int):
        config = CollectConfig.sokoban(group_size=1, max_steps=3, max_prompt_tokens=budget, sampling=SCRIPTED)
        rollouts = run_episodes(SerialPool(SokobanEnv, 1), [task], Scripted(tokenizer, replies), config,
                                jax.random.key(0))
        return rollouts.episodes[0].turns, summarize(rollouts)

    roomy, stats = episode(2048)
    assert [t.prompt_truncated for t in roomy] == [False] * 3 and stats.num_truncated_prompts == 0
    records = [(t.obs.text, t.projected.action) for t in roomy]
    assert len(records[0][1]) == 400
    prompt = lambda t, shown: encode_prompt(tokenizer, build_messages(SOKOBAN, roomy[t].obs, records[:t], t,  # noqa: E731
                                                                      history_length=shown))
    assert [t.prompt_ids.tolist() for t in roomy] == [prompt(0, 2), prompt(1, 2), prompt(2, 2)]
    budget = max(len(prompt(1, 0)), len(prompt(2, 1)))
    assert budget < min(len(prompt(1, 1)), len(prompt(2, 2)))  # the digits do not fit, the last record does
    tight, stats = episode(budget)
    assert [t.prompt_ids.tolist() for t in tight] == [prompt(0, 2), prompt(1, 0), prompt(2, 1)]
    assert [t.prompt_truncated for t in tight] == [False, True, True] and stats.num_truncated_prompts == 2
    assert [t.projected.action for t in tight] == [t.projected.action for t in roomy]


def test_an_env_exception_truncates_the_episode_without_a_penalty(tokenizer, caplog):
    config = CollectConfig(group_size=2, max_steps=4, max_prompt_tokens=640, sampling=SCRIPTED)
    policy = Scripted(tokenizer, ["<think>a</think><action>forward</action>", "<think>b</think><action>raise</action>"])
    batch, stats = collect(SerialPool(ChainEnv, 2), ChainEnv.tasks("train")[3:4], policy, config, jax.random.key(0),
                           template=TOY, projector=project_action)
    b = _np(batch)
    m = b.row_mask
    assert m.sum() == 4 and stats.num_crashes == 2 and stats.truncation_rate == 1.0
    np.testing.assert_array_equal(b.truncated[m], [False, True] * 2)
    np.testing.assert_array_equal(b.reward[m], 0.0)  # no penalty for the step the env failed on
    assert "toy env bug" in caplog.text


def test_bad_input_is_a_clear_error(sampler, tokenizer):
    pool, tasks = SerialPool(SokobanEnv, 4), SOKOBAN_TASKS
    with pytest.raises(ValueError, match="need 8 env slots, the pool has 4"):
        run_episodes(pool, tasks, sampler, SOKOBAN_CONFIG, jax.random.key(0))
    with pytest.raises(ValueError, match="no prompt template for env 'toy'.*template="):
        run_episodes(SerialPool(ChainEnv, 8), ChainEnv.tasks("train")[:1], sampler, SOKOBAN_CONFIG, jax.random.key(0))
    with pytest.raises(ValueError, match="no tokenizer"):
        run_episodes(pool, tasks[:1], Sampler(sampler_model(sampler)), SOKOBAN_CONFIG.replace(group_size=2),
                     jax.random.key(0))
    with pytest.raises(ValueError, match=r"needs \d+ tokens and a stop token, more than sampling.max_new_tokens=8"):
        tiny = SOKOBAN_CONFIG.replace(group_size=1, constrained=True,
                                      sampling=dataclasses.replace(SAMPLING, max_new_tokens=8))
        run_episodes(pool, tasks[:1], Scripted(tokenizer, ["x"]), tiny.replace(constrained_format="<action> {action} "
                                                                                  "</action> now"), jax.random.key(0))
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        CollectConfig(group_size=0)
    with pytest.raises(ValueError, match="needs sampling.stop_token_ids"):
        CollectConfig(constrained=True, sampling=SamplingParams())
    with pytest.raises((ValueError, TypeCheckError), match="shaped"):  # beartype checks the Literal in tests
        CollectConfig(reward="shaped")
    with pytest.raises(ValueError, match="capacity"):
        to_step_batch(run_episodes(SerialPool(SokobanEnv, 1), tasks[:1], Scripted(tokenizer, ["x"] * 5),
                                   SOKOBAN_CONFIG.replace(group_size=1, capacity=2), jax.random.key(0)),
                      SOKOBAN_CONFIG.replace(group_size=1, capacity=2))


def sampler_model(sampler: Sampler) -> Qwen:
    return nnx.merge(sampler.graphdef, sampler.weights)

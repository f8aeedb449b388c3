"""The tree collector on TextCraft-Synth: planner trees, budgets and depth, the shared inventory, batching, a tiny Qwen.

Checked: planner-made trees run through the collector to root success with every child verified, and the
TreeBatch matches the host records row by row (ids, flags, rewards, tokens, per-token roles, node and event
arrays); budgets, the depth limit, refused and malformed replies (penalised, never a crash), the turn cap; siblings
of one delegation share the inventory and act one after the other; a tiny random-init Qwen3 with constrained
decoding grows trees with exactly one policy call per turn over every live node of every tree.
"""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest
from flax import nnx

from agentjax.agents.grammar import Role, format_call, parse_textcraft
from agentjax.agents.judge import ProgramJudge
from agentjax.agents.textcraft_tree import PlannerTeacher, TextCraftTreeConfig, TextCraftTreeWorld
from agentjax.agents.tree import Status, TreeLimits, render_tree
from agentjax.credit import sera
from agentjax.models import Qwen, QwenConfig, Sampler, SamplingParams, load_tokenizer
from agentjax.models.tokenizer import ENDOFTEXT_ID, IM_END_ID
from agentjax.rollout.batch import NO_ID
from agentjax.rollout.tree_collect import TreeCollectConfig, run_trees, to_tree_batch, tree_stats
from envs.base import Task
from envs.textcraft import TextCraftSynthEnv

STOPS = (IM_END_ID, ENDOFTEXT_ID)
TEACH = TreeCollectConfig(trees_per_task=2, max_prompt_tokens=8192, sampling=SamplingParams(
    max_new_tokens=384, stop_token_ids=STOPS, prompt_bucket=256))
SHORT = TextCraftTreeConfig(show_recipes=False)


def host(struct) -> types.SimpleNamespace:
    """A flax struct's array fields as NumPy (a StepBatch rebuilt from NumPy would fail its own type checks)."""
    return types.SimpleNamespace(**{k: None if v is None else np.asarray(v) for k, v in vars(struct).items()})


def code(body: str) -> str:
    return f"<python>\n{body}\n</python>"


class CountingJudge(ProgramJudge):
    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def __call__(self, requests):
        self.sizes.append(len(requests))
        return super().__call__(requests)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def no_model(tokenizer):
    def generate(*args, **kwargs):
        raise AssertionError("a teacher run samples nothing")

    return types.SimpleNamespace(tokenizer=tokenizer, generate=generate)


@pytest.fixture(scope="module")
def medium():
    return [t for t in TextCraftSynthEnv.tasks("val") if t.meta["difficulty"] == "medium"]


@pytest.fixture(scope="module")
def planned(no_model, medium):
    judge = CountingJudge()
    rollouts = run_trees(medium[:2], no_model, TextCraftTreeWorld, judge, TEACH, jax.random.key(0),
                         teacher=PlannerTeacher(), task_indices=[7, 9])
    return rollouts, to_tree_batch(rollouts, TEACH), judge


def test_planner_trees_succeed_and_every_child_is_verified(planned):
    rollouts, _, judge = planned
    assert len(rollouts.trees) == 4 and rollouts.live_per_call == ()  # a teacher: no policy call
    for tree in rollouts.trees:
        assert tree.root_success and tree.root.finished and max(n.depth for n in tree.nodes) <= 3
        assert all(n.label == 1.0 and n.finished for n in tree.nodes[1:])
        assert all(u.valid for n in tree.nodes for u in n.turns) and len(tree.nodes) > 3
        for node in tree.nodes:  # a parent saw its children's finish messages after its delegation turn
            for turn in node.turns:
                if turn.children:
                    assert "Subagent results:" in turn.feedback and "finished: Done: crafted" in turn.feedback
    children = sum(len(t.nodes) - 1 for t in rollouts.trees)
    assert sum(judge.sizes) == children and max(judge.sizes) > 1  # siblings stop together: one batched call
    stats = tree_stats(rollouts)
    assert stats["tree/root_success"] == 1.0 and stats["tree/child_success"] == 1.0 and stats["tree/invalid"] == 0
    assert stats["judge/requests"] == children and stats["tree/policy_calls"] == 0


def test_tree_batch_matches_the_host_records(planned, tokenizer):
    rollouts, batch, _ = planned
    steps = host(batch.steps)
    rows = [(t, n, u) for t in rollouts.trees for n in t.nodes for u in n.turns]
    n = len(rows)
    assert steps.row_mask.sum() == n and batch.steps.capacity % TEACH.row_bucket == 0
    lp = TEACH.max_prompt_tokens
    for i, (tree, node, turn) in enumerate(rows):
        last = turn.step == len(node.turns) - 1
        assert (steps.group[i], steps.task[i], steps.rollout[i]) == (tree.group, [7, 9][tree.group], tree.index)
        assert (steps.node[i], steps.step[i], steps.depth[i]) == (node.id, turn.step, node.depth)
        assert steps.parent[i] == (NO_ID if node.parent < 0 else node.parent)
        assert (steps.done[i], steps.terminated[i], steps.truncated[i]) == (last, last and node.finished, False)
        assert steps.won[i] == last and steps.valid[i]
        assert steps.reward[i] == (TEACH.success_reward if last and node.parent < 0 else 0.0)
        k, m = len(turn.prompt_ids), len(turn.response_ids)
        np.testing.assert_array_equal(steps.prompt_tokens[i, lp - k:], turn.prompt_ids)
        assert steps.prompt_mask[i].sum() == k and steps.response_mask[i].sum() == m
        np.testing.assert_array_equal(steps.response_tokens[i, :m], turn.response_ids)
        assert turn.response_ids[-1] == IM_END_ID and tokenizer.decode(turn.response_ids[:-1]) == turn.reply.text
        # roles: the delegation statement's tokens on delegation turns, execution everywhere else
        role = np.asarray(batch.role[i, :m])
        delegation = turn.response_ids[role == Role.DELEGATION]
        if turn.reply.kind == "delegate":
            start, end = turn.reply.delegate_span
            assert tokenizer.decode(delegation).strip() == turn.reply.text[start:end].strip()
        else:
            assert delegation.size == 0
        assert set(role.tolist()) <= {Role.EXECUTION, Role.DELEGATION} and (np.asarray(batch.role[i, m:]) == 0).all()
    execution = np.asarray(batch.role_mask(Role.EXECUTION))
    delegation = np.asarray(batch.role_mask(Role.DELEGATION))
    assert not (execution & delegation).any() and ((execution | delegation) == steps.response_mask).all()
    np.testing.assert_array_equal(np.asarray(batch.for_role(Role.DELEGATION).response_mask), delegation)
    assert delegation.any() and not np.asarray(batch.role_mask(Role.RUBRIC)).any()
    np.testing.assert_array_equal(np.asarray(batch.tree_of_row())[:n], [t.group * 2 + t.index for t, _, _ in rows])


def test_tree_arrays_and_events_match_the_trees(planned):
    rollouts, batch, _ = planned
    trees = host(batch.trees)
    steps = host(batch.steps)
    assert trees.parent_tq.shape == (4, TEACH.slots) and trees.event_node_te.shape == (4, TEACH.events)
    for t, tree in enumerate(rollouts.trees):
        ref = tree.arrays(TEACH.slots, TEACH.events)
        for name in ("parent", "depth", "node_mask", "finished", "label", "label_mask", "turns", "event",
                     "event_node", "event_step"):
            np.testing.assert_array_equal(getattr(trees, f"{name}_tq" if name in ref and ref[name].shape ==
                                                  (TEACH.slots,) else f"{name}_te")[t], ref[name])
        assert trees.root_success_t[t] and (trees.group_t[t], trees.tree_t[t]) == (tree.group, tree.index)
        # every event names a delegation row of the StepBatch; its children point back to it
        for e in range(len(tree.events)):
            node, step = trees.event_node_te[t, e], trees.event_step_te[t, e]
            row = (steps.group == tree.group) & (steps.rollout == tree.index) & (steps.node == node) & \
                (steps.step == step) & steps.row_mask
            assert row.sum() == 1 and tree.nodes[node].turns[step].reply.kind == "delegate"
            assert {c for c in range(len(tree.nodes)) if trees.event_tq[t, c] == e} == \
                set(tree.nodes[node].turns[step].children)
        depth = sera.node_depth(batch.trees.parent_tq[t], batch.trees.node_mask_tq[t])
        real = trees.node_mask_tq[t]
        np.testing.assert_array_equal(np.asarray(depth)[real], trees.depth_tq[t][real])
    assert batch.by_task(batch.trees.parent_tq).shape == (2, 2, TEACH.slots)


def test_render_a_collected_tree(planned):
    rollouts, batch, _ = planned
    text = render_tree(rollouts.trees[0])
    assert text.startswith("tree 0 of task textcraft_synth.val.") and "root success" in text
    assert "delegated by [0] at its turn" in text and "reward 1 (verifier)" in text and "launch_subagent" in text
    assert "leaf coverage" in text
    for t, tree in enumerate(rollouts.trees):  # the printed leaf coverage is the decomposition kernel's reward
        cover = sera.leaf_coverage(batch.trees.parent_tq[t], batch.trees.node_mask_tq[t], batch.trees.event_tq[t],
                                   batch.trees.event_node_te[t], batch.trees.root_success_t[t].astype(np.float32))
        for e, (node, step) in enumerate(tree.events):
            want = tree.leaf_coverage(tree.nodes[node].turns[step].children)
            np.testing.assert_allclose(float(cover.reward_e[e]), want, atol=1e-6)


# ------------------------------------------------------------------------------------------------ scripted runs


def scripted(replies):
    """A teacher from a function of (tree, node) -> reply."""
    return lambda tree, node: replies(tree, node)


def test_budgets_depth_refusals_and_malformed_replies(no_model, medium):
    limits = TreeLimits(max_steps=3, max_depth=2, max_nodes=32)
    config = TEACH.replace(trees_per_task=1, limits=limits, invalid_penalty=0.25)
    item = next(iter(medium[0].meta["target_items"]))

    def reply(tree, node):
        turn = len(node.turns)
        if node.depth < 2:  # the root and depth 1 delegate on each turn
            return code(f"await {format_call('launch_subagent', {item: 1})}")
        if node.depth == 2 and turn == 0:
            return code(f"await {format_call('launch_subagent', {item: 1})}")  # refused: the depth limit
        return ["<python>__import__('os').system('echo pwned')</python>", "no code at all"][turn % 2]

    judge = CountingJudge()
    rollouts = run_trees(medium[:1], no_model, lambda t: TextCraftTreeWorld(t, config=SHORT), judge, config,
                         jax.random.key(0), teacher=scripted(reply))
    (tree,) = rollouts.trees
    depths = [n.depth for n in tree.nodes]
    assert depths.count(0) == 1 and depths.count(1) == 3 and depths.count(2) == 9 and len(tree.nodes) == 13
    for node in tree.nodes:
        assert len(node.turns) == 3 and node.status is Status.EXHAUSTED and not node.finished
        if node.depth == 2:
            first, *rest = node.turns
            assert not first.valid and "cannot delegate" in first.feedback and first.event >= 0
            assert not first.children and all(not u.valid and "Error" in u.feedback for u in rest)
            assert [u.reward for u in node.turns] == [-0.25] * 3
        else:
            assert all(u.valid and len(u.children) == 1 for u in node.turns)
            assert all("stopped without finishing" in u.feedback for u in node.turns)
    assert all(n.label == 0.0 for n in tree.nodes[1:]) and tree.root_success is False
    assert len(tree.events) == 3 + 9 + 9  # root and depth 1: 3 each (a child each); depth 2: one refused each
    batch = to_tree_batch(rollouts, config)
    assert int(np.asarray(batch.trees.dropped_events_t)[0]) == 0
    last = np.asarray(batch.steps.done) & np.asarray(batch.steps.row_mask)
    assert np.asarray(batch.steps.truncated)[last].all() and not np.asarray(batch.steps.won).any()


def test_siblings_share_the_inventory_and_act_one_after_the_other(no_model):
    book = TextCraftSynthEnv().book
    item, recipe = next((x, rs[0]) for x, rs in sorted(book.recipes.items())
                        if all(s.name not in book.recipes for s in rs[0].inputs))
    inputs = {s.name: s.count for s in recipe.inputs}
    task = Task("textcraft_synth", "shared", "test", meta={"target_items": {item: recipe.count},
                                                          "initial_inventory": dict(inputs), "max_steps": 50})
    both = code("await asyncio.gather(\n" + f"    {format_call('launch_subagent', {item: recipe.count})},\n" * 2 + ")")
    craft = code(format_call("craft", inputs, (item, recipe.count)))

    def reply(tree, node):
        if node.depth == 0:
            return both if not node.turns else code(format_call("finish", "done"))
        return craft if not node.turns else code(format_call("finish", "tried"))

    worlds = []
    factory = lambda t: worlds.append(TextCraftTreeWorld(t, config=SHORT)) or worlds[-1]  # noqa: E731
    rollouts = run_trees([task], no_model, factory, ProgramJudge(), TEACH.replace(trees_per_task=1),
                         jax.random.key(0), teacher=scripted(reply))
    (tree,) = rollouts.trees
    root, first, second = tree.nodes
    assert first.turns[0].valid and "Crafted" in first.turns[0].feedback
    assert not second.turns[0].valid and "enough" in second.turns[0].feedback  # the first took the ingredients
    # the released check: the target's count rose while the child ran — by anyone's craft, so both pass
    assert (first.label, second.label) == (1.0, 1.0) and tree.root_success
    assert worlds[0].world.inventory() == {item: recipe.count}  # nothing lost, nothing negative
    assert "[1] Craft the following items" in root.turns[0].feedback and "finished: tried" in root.turns[0].feedback


def test_the_turn_cap_cuts_running_trees(no_model, medium):
    config = TEACH.replace(trees_per_task=1, max_turns=2)
    rollouts = run_trees(medium[:1], no_model, lambda t: TextCraftTreeWorld(t, config=SHORT), ProgramJudge(),
                         config, jax.random.key(0), teacher=scripted(lambda tree, node: code("view_inventory()")))
    (tree,) = rollouts.trees
    assert tree.root.status is Status.CUT and len(tree.root.turns) == 2 and tree.root_success is False
    batch = to_tree_batch(rollouts, config)
    assert np.asarray(batch.steps.truncated)[1] and not np.asarray(batch.steps.terminated).any()
    assert tree_stats(rollouts)["tree/cut"] == 1.0


# ------------------------------------------------------------------------------------------------ a tiny Qwen


class Recording:
    """Forwards to a sampler; records every call's batch size."""

    def __init__(self, sampler: Sampler):
        self.sampler, self.tokenizer, self.config = sampler, sampler.tokenizer, sampler.config
        self.calls: list[int] = []

    def generate(self, prompts, params, key, **kw):
        self.calls.append(len(prompts))
        return self.sampler.generate(prompts, params, key, **kw)


def test_tiny_qwen_grows_trees_with_one_policy_call_per_turn(tokenizer, medium):
    model = Qwen(QwenConfig.tiny_qwen3(vocab_size=151_936, d_model=32, mlp_dim=64, num_layers=1, head_dim=8),
                 rngs=nnx.Rngs(0))
    policy = Recording(Sampler(model, tokenizer))
    config = TreeCollectConfig(
        trees_per_task=3, limits=TreeLimits(max_steps=3, max_depth=2, max_nodes=16), max_turns=7,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=48, stop_token_ids=STOPS, prompt_bucket=1024),
        max_prompt_tokens=2048, constrained=True, masked_logp=True, max_allowed=16, batch_bucket=8)
    worlds = {}

    def factory(task):
        world = TextCraftTreeWorld(task, config=SHORT)
        worlds[id(world)] = world
        return world

    rollouts = run_trees(medium[3:4], policy, factory, ProgramJudge(), config, jax.random.key(1))
    turns = [u for t in rollouts.trees for n in t.nodes for u in n.turns]
    assert policy.calls == list(rollouts.padded_per_call) and len(policy.calls) == len(rollouts.live_per_call)
    assert rollouts.live_per_call[0] == 3  # the three roots share the first call
    assert sum(rollouts.live_per_call) == len(turns) and all(c % 8 == 0 for c in policy.calls)
    assert all(u.reply.valid for u in turns)  # constrained to the grammar's admissible replies
    assert any(u.reply.kind == "delegate" for u in turns)
    batch = to_tree_batch(rollouts, config)
    steps = host(batch.steps)
    mask = steps.response_mask
    assert np.isfinite(steps.behaviour_logp).all() and (steps.behaviour_logp[mask] <= 1e-6).all()
    allowed = steps.allowed_tokens
    hit = (allowed == steps.response_tokens[..., None]).any(-1)
    assert hit[mask].all()  # every sampled token was one the trie allowed
    for tree in rollouts.trees:
        for node in tree.nodes[1:]:
            assert node.depth <= 2 and node.label in (0.0, 1.0) and tree.nodes[node.parent].depth == node.depth - 1
    text = render_tree(rollouts.trees[0])
    assert text.startswith("tree 0 of task") and "turn 0" in text
    assert parse_textcraft(rollouts.trees[0].root.turns[0].reply.text).valid

"""Hand-built recursive trees as a `TreeBatch` (through the collector's own `to_tree_batch`), and a NumPy reference of
RAO's per-row credit with explicit loops (METHODS.md "SERA" 4, 6, 8; the released readings)."""

from __future__ import annotations

import numpy as np

from agentjax.agents.grammar import Reply, Role
from agentjax.agents.tree import Goal, Node, NodeTurn, Status, Tree, TreeLimits
from agentjax.models import SamplingParams
from agentjax.rollout.tree_collect import TreeCollectConfig, TreeRollouts, to_tree_batch
from envs.base import Task

STOP = 1000  # a stop token id of a 1,024-token test vocabulary
LIMITS = TreeLimits(max_steps=8, max_depth=3, max_children=4, max_nodes=8)
CONFIG = TreeCollectConfig(trees_per_task=3, limits=LIMITS, max_prompt_tokens=8, row_bucket=16,
                           sampling=SamplingParams(max_new_tokens=6, stop_token_ids=(STOP,)))


def _turn(step: int, kind: str, children=(), event=-1, seed=0) -> NodeTurn:
    """A reply of ``kind`` with 4 or 5 tokens: a delegation's middle tokens carry the delegation role."""
    rng = np.random.default_rng(seed)
    n = 5 if kind == "delegate" else 4
    response = np.concatenate([rng.integers(100, 900, n - 1), [STOP]]).astype(np.int32)
    roles = np.full(n, int(Role.EXECUTION), np.int8)
    if kind == "delegate":
        roles[1:3] = int(Role.DELEGATION)
    return NodeTurn(step=step, reply=Reply(kind=kind, text=f"{kind} {seed}"), feedback="", valid=True,
                    children=tuple(children), event=event, prompt_ids=rng.integers(1, 90, 3 + step).astype(np.int32),
                    response_ids=response, logp=np.full(n, -0.5, np.float32), logp_masked=np.full(n, -0.5, np.float32),
                    role_ids=roles)


def make_tree(group: int, k: int, outcome: bool, nodes: list[dict]) -> Tree:
    """``nodes[i]``: ``parent``, ``label`` (children), ``kinds`` (its replies' kinds), ``launches`` ({turn: [child
    ids]}, one launch event each; an empty list is a refused delegation)."""
    tree = Tree(task=Task("textcraft_synth", f"task{group}", "train"), group=group, index=k, task_index=10 + group,
                limits=LIMITS, root_success=outcome)
    for i, spec in enumerate(nodes):
        parent = spec.get("parent", -1)
        depth = 0 if parent < 0 else tree.nodes[parent].depth + 1
        tree.nodes.append(Node(id=i, parent=parent, depth=depth, goal=Goal(f"goal {i}"), budget=8,
                               status=Status.FINISHED, label=spec.get("label")))
    for i, spec in enumerate(nodes):
        node = tree.nodes[i]
        for step, kind in enumerate(spec["kinds"]):
            children = spec.get("launches", {}).get(step)
            event = -1
            if children is not None:
                tree.events.append((i, step))
                event = len(tree.events) - 1
                for rank, c in enumerate(children):
                    tree.nodes[c].event, tree.nodes[c].rank, tree.nodes[c].launch_step = event, rank, step
                node.children += list(children)
            node.turns.append(_turn(step, kind, children or (), event, seed=100 * group + 10 * k + i + step))
    return tree


def hand_trees() -> list[Tree]:
    """2 root tasks × 3 trees. Task 0 (outcomes 1, 0, 1): a depth-2 tree with a two-child event; a tree whose only
    delegation was refused; a tree whose child has no label (dropped). Task 1: every outcome and label 0."""
    return [
        make_tree(0, 0, True, [dict(kinds=["delegate", "act", "finish"], launches={0: [1, 2]}),
                               dict(parent=0, label=1.0, kinds=["delegate", "finish"], launches={0: [3]}),
                               dict(parent=0, label=0.0, kinds=["act", "act"]),
                               dict(parent=1, label=1.0, kinds=["act", "finish"])]),
        make_tree(0, 1, False, [dict(kinds=["act", "delegate", "act"], launches={1: []})]),
        make_tree(0, 2, True, [dict(kinds=["delegate", "finish"], launches={0: [1]}),
                               dict(parent=0, label=None, kinds=["act"])]),
        make_tree(1, 0, False, [dict(kinds=["delegate", "finish"], launches={0: [1]}),
                                dict(parent=0, label=0.0, kinds=["act", "finish"])]),
        make_tree(1, 1, False, [dict(kinds=["act", "finish"])]),
        make_tree(1, 2, False, [dict(kinds=["act"])]),
    ]


def hand_batch(trees: list[Tree] | None = None):
    trees = hand_trees() if trees is None else trees
    rollouts = TreeRollouts(trees=tuple(trees), forks=(), searches=(), searches_not_run=0, num_groups=2,
                            trees_per_task=3, live_per_call=(), padded_per_call=(), judge_metrics={},
                            rubric_metrics={}, prompt_seconds=0.0, generate_seconds=0.0, env_seconds=0.0,
                            judge_seconds=0.0, rubric_seconds=0.0, total_seconds=0.0)
    return to_tree_batch(rollouts, CONFIG)


# ------------------------------------------------------------------------------------------------ NumPy reference


def _depth_weights(items: list[tuple[int, float]]) -> list[float]:
    """``w_d = (Σ c / Σ_d c_d / n_d) / n_d`` over (depth, data) trajectories."""
    n, c = {}, {}
    for d, data in items:
        n[d] = n.get(d, 0) + 1
        c[d] = c.get(d, 0.0) + data
    norm = sum(c.values()) / sum(c[d] / n[d] for d in n) if items else 0.0
    return [norm / n[d] for d, _ in items]


def _leaves(tree: Tree, q: int) -> int:
    node = tree.nodes[q]
    return 1 if not node.children else sum(_leaves(tree, c) for c in node.children)


def reference_rows(trees: list[Tree], stage: str, *, filter_zero_variance=True, depth_weighting="trajectory",
                   k_size: int = 3) -> dict[tuple[int, int, int, int], float]:
    """{(group, tree, node, turn): advantage} of every trained row (module docstring)."""
    groups = sorted({t.group for t in trees})
    samples = []  # (group, tree, key rows, reward-baseline, depth, data)
    for g in groups:
        task = [t for t in trees if t.group == g]
        outcomes = [float(t.root_success) for t in task]
        mine = []
        if stage == "execution":
            for t in task:
                base = np.mean([o for j, o in enumerate(outcomes) if j != t.index])
                for n in t.nodes:
                    r = outcomes[t.index] if n.parent < 0 else n.label
                    if r is None or not n.turns:
                        continue
                    rows = [(g, t.index, n.id, u.step) for u in n.turns]
                    mine.append((rows, r - base, n.depth, len(n.turns), n.id))
        else:
            means = []
            for t in task:
                rewards = [outcomes[t.index] * sum(_leaves(t, c) for c in t.nodes[node].turns[step].children)
                           / len([n for n in t.nodes if not n.children]) for node, step in t.events]
                means.append(np.mean(rewards) if rewards else 0.0)
            for t in task:
                base = np.mean([m for j, m in enumerate(means) if j != t.index])
                launchers = [node for node, _ in t.events]
                for (node, step) in t.events:
                    r = outcomes[t.index] * sum(_leaves(t, c) for c in t.nodes[node].turns[step].children) / len(
                        [n for n in t.nodes if not n.children])
                    mine.append(([(g, t.index, node, step)], r - base, t.nodes[node].depth,
                                 launchers.count(node), node))
        advs = [a for _, a, *_ in mine]
        if filter_zero_variance and (not advs or max(advs) == min(advs)):
            continue
        samples += mine
    if depth_weighting == "none":
        weights = [1.0] * len(samples)
    elif depth_weighting == "sample":
        weights = _depth_weights([(d, 1.0) for _, _, d, _, _ in samples])
    elif stage == "execution":
        weights = _depth_weights([(d, float(data)) for _, _, d, data, _ in samples])
    else:  # trajectories: the launching nodes, data: their events
        launchers = {}
        for rows, _, d, data, node in samples:
            launchers[(rows[0][0], rows[0][1], node)] = (d, float(data))
        keys = list(launchers)
        w = dict(zip(keys, _depth_weights([launchers[k] for k in keys]), strict=True))
        weights = [w[(rows[0][0], rows[0][1], node)] for rows, _, _, _, node in samples]
    out = {}
    for (rows, adv, *_), w in zip(samples, weights, strict=True):
        for row in rows:
            out[row] = adv * w
    return out

"""The tree collector's records and what leaves the host: :class:`TreeRollouts` (the trees, fork and search groups,
call counts and timings of one :func:`~agentjax.rollout.tree_collect.run_trees`), :func:`to_tree_batch` (the node
turns as one padded :class:`~agentjax.rollout.tree_batch.TreeBatch`) and :func:`tree_stats` (the scalars of a
collection). Row layout and rewards: :mod:`agentjax.rollout.tree_collect`'s docstring.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from agentjax.agents.tree import NO_PARENT, Status, Tree
from agentjax.rollout.batch import NO_ID, StepBatch
from agentjax.rollout.ids import group_local_ids
from agentjax.rollout.tree_batch import TreeArrays, TreeBatch
from agentjax.rollout.tree_config import TreeCollectConfig
from agentjax.rollout.tree_rubrics import ForkGroup
from agentjax.rollout.tree_search import SearchGroup, search_stats


@dataclasses.dataclass(frozen=True)
class TreeRollouts:
    """What :func:`~agentjax.rollout.tree_collect.run_trees` returns: the trees (group-major: ``trees[g * K + k]``)
    and how the loop spent time."""

    trees: tuple[Tree, ...]  # the main trees (fork trees are in ``forks``)
    forks: tuple[ForkGroup, ...]  # SERA's fork groups (rubric stage), in the order they opened
    searches: tuple[SearchGroup, ...]  # rubric-guided search's groups (inference), in the order they opened
    searches_not_run: int  # children past the search's fork cap (not run)
    num_groups: int
    trees_per_task: int
    live_per_call: tuple[int, ...]  # live nodes of each turn (one policy call each, none with a teacher)
    padded_per_call: tuple[int, ...]
    judge_metrics: dict[str, float]
    rubric_metrics: dict[str, float]  # SERA's rubric and grading calls (empty without rubrics)
    prompt_seconds: float
    generate_seconds: float
    env_seconds: float
    judge_seconds: float
    rubric_seconds: float
    total_seconds: float


# ------------------------------------------------------------------------------------------------ to arrays


def to_tree_batch(rollouts: TreeRollouts, config: TreeCollectConfig) -> TreeBatch:
    """The node turns of ``rollouts`` as one padded :class:`TreeBatch` (module docstrings here and in tree_batch)."""
    lp, lr = config.max_prompt_tokens, config.max_response_tokens
    rows = [(tree, node, turn) for tree in rollouts.trees for node in tree.nodes for turn in node.turns]
    n = len(rows)
    prompt = np.zeros((n, lp), np.int32)
    prompt_mask = np.zeros((n, lp), bool)
    response = np.zeros((n, lr), np.int32)
    response_mask = np.zeros((n, lr), bool)
    logp = np.zeros((n, lr), np.float32)
    role = np.zeros((n, lr), np.int32)
    allowed = np.full((n, lr, config.max_allowed), NO_ID, np.int32) if config.masked_logp else None
    for i, (_, _, turn) in enumerate(rows):
        k, m = len(turn.prompt_ids), len(turn.response_ids)
        if k > lp or m > lr:
            raise ValueError(f"to_tree_batch: a turn has {k} prompt / {m} response tokens, more than {lp} / {lr}")
        prompt[i, lp - k:], prompt_mask[i, lp - k:] = turn.prompt_ids, True
        response[i, :m], response_mask[i, :m], role[i, :m] = turn.response_ids, True, turn.role_ids
        logp[i, :m] = turn.logp_masked if config.masked_logp else turn.logp
        if allowed is not None and turn.allowed_ids is not None:
            for j, choices in enumerate(turn.allowed_ids):
                if len(choices) > config.max_allowed:
                    raise ValueError(f"to_tree_batch: {len(choices)} allowed tokens at a position, more than "
                                     f"max_allowed={config.max_allowed}")
                allowed[i, j, : len(choices)] = choices
    last = [turn.step == len(node.turns) - 1 for _, node, turn in rows]
    col = lambda f, dtype: np.array([f(tr, nd, tu) for tr, nd, tu in rows], dtype)  # noqa: E731
    group = col(lambda tr, nd, tu: tr.group, np.int32)
    won = [is_last and (tr.node_reward(nd) or 0.0) > 0 for (tr, nd, _), is_last in zip(rows, last, strict=True)]
    # terminal: a finish, or the shared world ended by success; a spent budget (turns, shared steps, cap) truncates
    ends = [is_last and (nd.finished or (nd.status is Status.ENDED and bool(tr.root_success)))
            for (tr, nd, _), is_last in zip(rows, last, strict=True)]
    fields = dict(
        prompt_tokens=prompt, prompt_mask=prompt_mask, response_tokens=response, response_mask=response_mask,
        behaviour_logp=logp, reward=col(lambda tr, nd, tu: tu.reward, np.float32), done=np.array(last, bool),
        terminated=np.array(ends, bool),
        truncated=np.array([a and not b for a, b in zip(last, ends, strict=True)], bool),
        won=np.array(won, bool), valid=col(lambda tr, nd, tu: tu.valid, bool), group=group,
        task=col(lambda tr, nd, tu: tr.task_index, np.int32), rollout=col(lambda tr, nd, tu: tr.index, np.int32),
        step=col(lambda tr, nd, tu: tu.step, np.int32),
        action=group_local_ids([tu.reply.text.strip() for _, _, tu in rows], group.tolist()),
        node=col(lambda tr, nd, tu: nd.id, np.int32),
        parent=col(lambda tr, nd, tu: NO_ID if nd.parent == NO_PARENT else nd.parent, np.int32),
        depth=col(lambda tr, nd, tu: nd.depth, np.int32),
    )
    if allowed is not None:
        fields["allowed_tokens"] = allowed
    capacity = config.capacity if config.capacity is not None else max(1, -(-n // config.row_bucket)
                                                                         * config.row_bucket)
    if n > capacity:
        raise ValueError(f"to_tree_batch: {n} node turns do not fit capacity {capacity}; raise it")
    steps = StepBatch.from_rows(capacity, lp, lr, **fields)
    role_b = np.zeros((capacity, lr), np.int32)
    role_b[:n] = role
    per_tree = [tree.arrays(config.slots, config.events) for tree in rollouts.trees]
    stack = lambda name: jnp.asarray(np.stack([a[name] for a in per_tree]))  # noqa: E731
    trees = TreeArrays(
        parent_tq=stack("parent"), depth_tq=stack("depth"), node_mask_tq=stack("node_mask"),
        finished_tq=stack("finished"), label_tq=stack("label"), label_mask_tq=stack("label_mask"),
        launch_step_tq=stack("launch_step"), turns_tq=stack("turns"), delegated_tq=stack("delegated"),
        event_tq=stack("event"), event_node_te=stack("event_node"), event_step_te=stack("event_step"),
        dropped_events_t=stack("dropped_events"),
        root_success_t=jnp.asarray([bool(t.root_success) for t in rollouts.trees], bool),
        group_t=jnp.asarray([t.group for t in rollouts.trees], jnp.int32),
        task_t=jnp.asarray([t.task_index for t in rollouts.trees], jnp.int32),
        tree_t=jnp.asarray([t.index for t in rollouts.trees], jnp.int32),
    )
    return TreeBatch(steps=steps, role=jnp.asarray(role_b), trees=trees, trees_per_task=rollouts.trees_per_task)


def tree_stats(rollouts: TreeRollouts) -> dict[str, float]:
    """Scalars of a collection: outcomes, shape of the trees, validity, calls, the judge's counters, seconds."""
    trees = rollouts.trees
    nodes = [n for t in trees for n in t.nodes]
    children = [n for n in nodes if n.parent != NO_PARENT]
    turns = [u for n in nodes for u in n.turns]
    labelled = [n.label for n in children if n.label is not None]
    out = {
        "tree/root_success": float(np.mean([bool(t.root_success) for t in trees])),
        "tree/nodes": float(np.mean([len(t.nodes) for t in trees])),
        "tree/max_depth": float(max(n.depth for n in nodes)),
        "tree/delegating_trees": float(np.mean([len(t.nodes) > 1 for t in trees])),
        "tree/child_success": float(np.mean(labelled)) if labelled else 0.0,
        "tree/unlabelled_children": float(len(children) - len(labelled)),
        "tree/turns": float(len(turns)),
        "tree/invalid": float(np.mean([not u.valid for u in turns])) if turns else 0.0,
        "tree/exhausted": float(np.mean([n.status is Status.EXHAUSTED for n in nodes])),
        "tree/cut": float(np.mean([n.status is Status.CUT for n in nodes])),
        "tree/ended": float(np.mean([n.status is Status.ENDED for n in nodes])),
        "tree/not_run": float(sum(not u.executed for u in turns)),
        "tree/policy_calls": float(len(rollouts.live_per_call)),
        "tree/rows_per_call": float(np.mean(rollouts.live_per_call)) if rollouts.live_per_call else 0.0,
        "time/prompt_s": rollouts.prompt_seconds, "time/generate_s": rollouts.generate_seconds,
        "time/env_s": rollouts.env_seconds, "time/judge_s": rollouts.judge_seconds,
        "time/rubric_s": rollouts.rubric_seconds,
        "time/total_s": rollouts.total_seconds,
    }
    for d in range(max(n.depth for n in nodes) + 1):
        out[f"tree/nodes_depth{d}"] = float(sum(n.depth == d for n in nodes)) / len(trees)
    if rollouts.forks:  # SERA's rubric stage: fork groups, their labels and grades
        arrays = [g.arrays() for g in rollouts.forks]
        valid = [v for _, _, v in arrays]
        out |= {"fork/groups": float(len(arrays)),
                "fork/branches": float(sum(len(v) for v in valid)),
                "fork/branch_success": float(np.mean(np.concatenate([lab for _, lab, _ in arrays]))),
                "fork/graded": float(np.mean(np.concatenate(valid))),
                "fork/mixed": float(np.mean([lab[v].any() and not lab[v].all() for _, lab, v in arrays]))}
    if rollouts.searches or rollouts.searches_not_run:
        out |= search_stats(list(rollouts.searches), rollouts.searches_not_run)
    return out | dict(rollouts.judge_metrics) | dict(rollouts.rubric_metrics)


__all__ = ["TreeRollouts", "to_tree_batch", "tree_stats"]

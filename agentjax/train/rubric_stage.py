"""SERA's rubric stage: fork groups → ranking rewards → leave-one-out advantages → one row per rubric completion.

METHODS.md "SERA" 5–6; papers/SERA.txt §3.4. A rubric-stage batch is grown with fork groups
(:func:`~agentjax.rollout.tree_collect.run_trees` with ``forks``; :mod:`agentjax.rollout.tree_rubrics`): at a
delegation, while a tree's fork budget lasts, the delegated child runs as ``I`` branches — branch 0 committed to the
tree, the others on isolated clones of the world as the child found it — each labelled by the env's verifier or judge
and graded by the policy with the one rubric its parent wrote for the child before any branch started.

:func:`rubric_rows` lays the groups out as ``[G, F, I]`` arrays (root task ``g``, fork-group slot
``f = k · (budget // I) + j`` for the ``j``-th group of tree ``k``, branch ``i``) for
:func:`~agentjax.credit.sera_stages.rubric_credit` — the ranking reward
``R_f = −mean_{i∈P, j∈N} max(0, m − (s_i − s_j))`` of groups with ≥ 2 valid grades and both labels, its
leave-one-out advantage over the mixed groups of the same root task, depth weights — and builds one
:class:`~agentjax.rollout.batch.StepBatch` row per group whose rubric parsed: the rubric-writing call's prompt and
completion, its behaviour log-probs (and the constrained decoder's choices), trained as a whole (every token of the
completion is a rubric token). The grading calls and the branches' own turns are never rows: labels never reward
execution. :func:`rubric_credit_rows` gathers each row's advantage × depth weight.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from agentjax.credit.sera_stages import rubric_credit
from agentjax.rollout.batch import NO_ID, StepBatch
from agentjax.rollout.policy import constrained_choices
from agentjax.rollout.tree_collect import TreeRollouts
from agentjax.rollout.tree_rubrics import ForkConfig, ForkGroup
from agentjax.train.config import SERACredit
from agentjax.train.tree_credit import RowCredit


@dataclasses.dataclass(frozen=True)
class RubricRows:
    """A rubric-stage batch: the rubric rows and the fork-group arrays of the credit (host NumPy)."""

    steps: StepBatch  # one row per fork group with a parsed rubric (row r: group slot (g_r, f_r))
    slot_gf: np.ndarray  # [B, 2] int32 (g, f) of each row (padding rows: 0, 0)
    score_gfi: np.ndarray  # [G, F, I] float32 the policy's final scores of the branches
    success_gfi: np.ndarray  # [G, F, I] bool labels
    valid_gfi: np.ndarray  # [G, F, I] bool a label and a score, in a group whose rubric parsed
    depth_gf: np.ndarray  # [G, F] int32 the delegated child's depth (0 on empty slots)
    rows: int  # real rows


def group_slots(rollouts: TreeRollouts, forks: ForkConfig) -> list[tuple[int, int]]:
    """``(g, f)`` of each fork group of ``rollouts`` (module docstring)."""
    per_tree = forks.budget // forks.branches
    seen: dict[int, int] = {}
    slots = []
    for group in rollouts.forks:
        tree = rollouts.trees[group.tree]
        j = seen.get(group.tree, 0)
        seen[group.tree] = j + 1
        if j >= per_tree:
            raise ValueError(f"rubric_rows: tree {group.tree} opened more than {per_tree} fork groups")
        slots.append((tree.group, tree.index * per_tree + j))
    return slots


def _choices(tokenizer: Any, group: ForkGroup, stops: Sequence[int], cache: dict[str, list[int]]) -> list:
    call = group.child.rubric_call
    for text in call.choices:
        if text not in cache:
            cache[text] = list(tokenizer.encode(text, add_special_tokens=False))
    return constrained_choices([cache[t] for t in call.choices], stops, call.response_ids.tolist())


def rubric_rows(rollouts: TreeRollouts, forks: ForkConfig, *, prompt_len: int, response_len: int, capacity: int,
                tokenizer: Any = None, masked_logp: bool = False, max_allowed: int = 16,
                stop_token_ids: Sequence[int] = ()) -> RubricRows:
    """The rubric rows and fork-group arrays of a rubric-stage collection (module docstring). With ``masked_logp``
    each row carries the constrained decoder's choices (the rubric calls must have been constrained)."""
    g_size, k_size, i_size = rollouts.num_groups, rollouts.trees_per_task, forks.branches
    f_size = k_size * (forks.budget // forks.branches)
    score = np.zeros((g_size, f_size, i_size), np.float32)
    success = np.zeros((g_size, f_size, i_size), bool)
    valid = np.zeros((g_size, f_size, i_size), bool)
    depth = np.zeros((g_size, f_size), np.int32)
    trained: list[tuple[ForkGroup, tuple[int, int]]] = []
    for group, (g, f) in zip(rollouts.forks, group_slots(rollouts, forks), strict=True):
        if len(group.branches) != i_size:
            raise ValueError(f"rubric_rows: a fork group has {len(group.branches)} branches, not {i_size}")
        depth[g, f] = group.child.depth
        if group.child.rubric is None:  # no rubric, no datum (counted by the collector's rubric/failures)
            continue
        score[g, f], success[g, f], valid[g, f] = group.arrays()
        trained.append((group, (g, f)))
    n = len(trained)
    if n > capacity:
        raise ValueError(f"rubric_rows: {n} rubric rows do not fit capacity {capacity}")
    prompt = np.zeros((n, prompt_len), np.int32)
    prompt_mask = np.zeros((n, prompt_len), bool)
    response = np.zeros((n, response_len), np.int32)
    response_mask = np.zeros((n, response_len), bool)
    logp = np.zeros((n, response_len), np.float32)
    allowed = np.full((n, response_len, max_allowed), NO_ID, np.int32) if masked_logp else None
    cache: dict[str, list[int]] = {}
    for r, (group, _) in enumerate(trained):
        call = group.child.rubric_call
        k, m = len(call.prompt_ids), len(call.response_ids)
        if k > prompt_len or m > response_len:
            raise ValueError(f"rubric_rows: a rubric call has {k} prompt / {m} response tokens, more than "
                             f"{prompt_len} / {response_len}")
        prompt[r, prompt_len - k:], prompt_mask[r, prompt_len - k:] = call.prompt_ids, True
        response[r, :m], response_mask[r, :m], logp[r, :m] = call.response_ids, True, call.logp
        if allowed is not None:
            if call.choices is None:
                raise ValueError("rubric_rows: masked_logp needs constrained rubric calls (tree.rubric_choices)")
            for j, c in enumerate(_choices(tokenizer, group, stop_token_ids, cache)):
                if len(c) > max_allowed:
                    raise ValueError(f"rubric_rows: {len(c)} allowed tokens at a position, more than "
                                     f"max_allowed={max_allowed}")
                allowed[r, j, :len(c)] = c
    col = lambda f, dtype: np.array([f(group) for group, _ in trained], dtype)  # noqa: E731
    trees = rollouts.trees
    fields = dict(prompt_tokens=prompt, prompt_mask=prompt_mask, response_tokens=response,
                  response_mask=response_mask, behaviour_logp=logp, done=np.ones(n, bool), valid=np.ones(n, bool),
                  group=col(lambda x: trees[x.tree].group, np.int32), task=col(lambda x: trees[x.tree].task_index,
                                                                                  np.int32),
                  rollout=col(lambda x: trees[x.tree].index, np.int32), step=np.zeros(n, np.int32),
                  node=col(lambda x: x.child.id, np.int32), parent=col(lambda x: x.child.parent, np.int32),
                  depth=col(lambda x: x.child.depth, np.int32))
    if allowed is not None:
        fields["allowed_tokens"] = allowed
    slot = np.zeros((capacity, 2), np.int32)
    if trained:
        slot[:n] = [s for _, s in trained]
    return RubricRows(steps=StepBatch.from_rows(capacity, prompt_len, response_len, **fields), slot_gf=slot,
                      score_gfi=score, success_gfi=success, valid_gfi=valid, depth_gf=depth, rows=n)


@jax.jit
def _gather(adv_gf, sample_gf, slot_gf, row_mask_b):
    g, f = slot_gf[:, 0], slot_gf[:, 1]
    sample = row_mask_b & sample_gf[g, f]
    return jnp.where(sample, adv_gf[g, f], 0.0), sample


def rubric_credit_rows(rows: RubricRows, credit: SERACredit, *, max_depth: int = 3) -> RowCredit:
    """Each rubric row's advantage × depth weight (:func:`~agentjax.credit.sera_stages.rubric_credit` with the
    credit's margin, filter and depth weighting); rows of unusable groups (homogeneous labels, < 2 valid grades, a
    root task with fewer than two usable groups under the zero-variance filter) do not train."""
    rank, c = rubric_credit(jnp.asarray(rows.score_gfi), jnp.asarray(rows.success_gfi), jnp.asarray(rows.valid_gfi),
                            jnp.asarray(rows.depth_gf), margin=credit.margin,
                            filter_zero_variance=credit.filter_zero_variance,
                            depth_weighting=credit.depth_weighting, max_depth=max_depth)
    steps = rows.steps
    adv_b, sample_b = _gather(c.advantage, c.sample, jnp.asarray(rows.slot_gf), steps.row_mask)
    token_mask = steps.response_mask & sample_b[:, None]
    usable = rank.usable
    n = jnp.maximum(usable.sum(), 1).astype(jnp.float32)
    mean = lambda x: jnp.sum(jnp.where(usable, x, 0.0)) / n  # noqa: E731
    stats = {"samples": c.sample.sum().astype(jnp.float32), "usable_groups": usable.sum().astype(jnp.float32),
             "reward_mean": mean(rank.reward), "pairwise_accuracy": mean(rank.accuracy),
             "margin_rate": mean(rank.margin_rate), "mean_gap": mean(rank.mean_gap),
             "adv_abs_max": jnp.max(jnp.abs(jnp.where(sample_b, adv_b, 0.0))),
             "trained_rows": sample_b.sum().astype(jnp.float32),
             "trained_tokens": token_mask.sum().astype(jnp.float32)}
    return RowCredit(advantage=adv_b, sample=sample_b, token_mask=token_mask, stats=stats)


__all__ = ["RubricRows", "group_slots", "rubric_credit_rows", "rubric_rows"]

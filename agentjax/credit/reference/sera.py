"""NumPy float64 references of the SERA / RAO kernels (credit/sera.py, sera_baselines.py, sera_stages.py).

Explicit loops, checkable by eye. Trees are parent arrays (−1 at the root) with a node mask; a root task's trees
are indexed ``k = 0..K-1``; launch events by ``e`` with ``event_node_e`` (−1 padding) and ``event_q``.
"""

from __future__ import annotations

import numpy as np


def _ancestors(q: int, parent_q: np.ndarray) -> list[int]:
    """q, its parent, its grandparent, ..., the root (walking the parent pointers)."""
    chain = [q]
    while parent_q[chain[-1]] >= 0:
        chain.append(int(parent_q[chain[-1]]))
        assert len(chain) <= len(parent_q), "cycle in the parent array"
    return chain


def leaves(parent_q: np.ndarray, node_mask_q: np.ndarray) -> np.ndarray:
    """Real nodes that no real node names as its parent."""
    out = np.zeros(len(parent_q), bool)
    for q in range(len(parent_q)):
        if node_mask_q[q]:
            out[q] = not any(node_mask_q[c] and parent_q[c] == q for c in range(len(parent_q)))
    return out


def node_depth(parent_q: np.ndarray, node_mask_q: np.ndarray) -> np.ndarray:
    """Number of parent hops to the root (−1 on padding)."""
    out = np.full(len(parent_q), -1)
    for q in range(len(parent_q)):
        if node_mask_q[q]:
            out[q] = len(_ancestors(q, parent_q)) - 1
    return out


def subtree_leaf_counts(parent_q: np.ndarray, node_mask_q: np.ndarray) -> np.ndarray:
    """For each node, the number of leaves whose ancestor chain contains it."""
    leaf = leaves(parent_q, node_mask_q)
    count = np.zeros(len(parent_q))
    for q in range(len(parent_q)):
        if leaf[q]:
            for a in _ancestors(q, parent_q):
                count[a] += 1
    return count


def leaf_coverage(parent_q, node_mask_q, event_q, event_node_e, root_outcome) -> tuple[np.ndarray, np.ndarray]:
    """(reward_e, reward_q): per launch event, R · |leaves under its children| / |leaves| (the children's leaf
    sets, collected one leaf at a time); per delegation parent(q) → q, R · |leaves under q| / |leaves|."""
    leaf = leaves(parent_q, node_mask_q)
    total = leaf.sum()
    reward_e = np.zeros(len(event_node_e))
    for e in range(len(event_node_e)):
        if event_node_e[e] < 0:
            continue
        covered = set()
        for c in range(len(parent_q)):
            if node_mask_q[c] and parent_q[c] >= 0 and event_q[c] == e:
                assert parent_q[c] == event_node_e[e], "a child's event is not its parent's"
                covered |= {ell for ell in range(len(parent_q)) if leaf[ell] and c in _ancestors(ell, parent_q)}
        reward_e[e] = float(root_outcome) * len(covered) / total
    count = subtree_leaf_counts(parent_q, node_mask_q)
    reward_q = np.zeros(len(parent_q))
    for q in range(len(parent_q)):
        if node_mask_q[q] and parent_q[q] >= 0:
            reward_q[q] = float(root_outcome) * count[q] / total
    return reward_e, reward_q


def execution_reward(parent_q, node_mask_q, child_reward_q, root_outcome) -> np.ndarray:
    """Root: the verified outcome; child: its given reward (final rubric score or label)."""
    out = np.zeros(len(parent_q))
    for q in range(len(parent_q)):
        if node_mask_q[q]:
            out[q] = float(root_outcome) if parent_q[q] < 0 else float(child_reward_q[q])
    return out


def rubric_weighted_score(gate, weight_c, score_c, mask_c) -> float:
    """gate · Σ w s / Σ w over the real criteria (0 if Σ w ≤ 0)."""
    num, den = 0.0, 0.0
    for c in range(len(weight_c)):
        if mask_c[c]:
            num += float(weight_c[c]) * float(score_c[c])
            den += float(weight_c[c])
    return (num / den if den > 0 else 0.0) if gate else 0.0


def ranking_reward(score_i, success_i, valid_i, margin: float = 0.2) -> tuple[float, bool]:
    """(−mean hinge over (success, failure) pairs, usable); (0, False) without ≥ 2 valid grades and both labels."""
    pos = [i for i in range(len(score_i)) if valid_i[i] and success_i[i]]
    neg = [j for j in range(len(score_i)) if valid_i[j] and not success_i[j]]
    if sum(bool(v) for v in valid_i) < 2 or not pos or not neg:
        return 0.0, False
    losses = [max(0.0, margin - (float(score_i[i]) - float(score_i[j]))) for i in pos for j in neg]
    return -float(np.mean(losses)), True


def loo_advantage(x_k: np.ndarray, mask_k: np.ndarray) -> np.ndarray:
    """A_k = x_k − mean over the other real entries j ≠ k of x_j (0 without other entries)."""
    out = np.zeros(len(x_k))
    for k in range(len(x_k)):
        if not mask_k[k]:
            continue
        others = [float(x_k[j]) for j in range(len(x_k)) if j != k and mask_k[j]]
        out[k] = float(x_k[k]) - np.mean(others) if others else 0.0
    return out


def tree_loo_advantage(reward_kx, mask_kx, tree_mask_k, *, baseline="tree_mean", empty_as_zero=True) -> np.ndarray:
    """A_kx = r_kx − baseline from the other trees: the mean of their tree means (an empty real tree is 0 or left
    out), or the pooled mean of their samples."""
    num_trees, num_x = reward_kx.shape
    samples = [[float(reward_kx[k, x]) for x in range(num_x) if mask_kx[k, x] and tree_mask_k[k]]
               for k in range(num_trees)]
    out = np.zeros((num_trees, num_x))
    for k in range(num_trees):
        if not tree_mask_k[k]:
            continue
        if baseline == "tree_mean":
            others = [np.mean(samples[j]) if samples[j] else 0.0 for j in range(num_trees)
                      if j != k and tree_mask_k[j] and (samples[j] or empty_as_zero)]
        else:
            others = [r for j in range(num_trees) if j != k for r in samples[j]]
        if not others:
            continue
        for x in range(num_x):
            if mask_kx[k, x]:
                out[k, x] = float(reward_kx[k, x]) - np.mean(others)
    return out


def execution_advantage(reward_kq, sample_kq, root_outcome_k, tree_mask_k, *, baseline="root") -> np.ndarray:
    """"root": A_kq = r_kq − mean of the other real trees' root outcomes; otherwise :func:`tree_loo_advantage`."""
    if baseline != "root":
        return tree_loo_advantage(reward_kq, sample_kq, tree_mask_k, baseline=baseline, empty_as_zero=False)
    out = np.zeros(reward_kq.shape)
    for k in range(len(root_outcome_k)):
        others = [float(root_outcome_k[j]) for j in range(len(root_outcome_k)) if j != k and tree_mask_k[j]]
        if not tree_mask_k[k] or not others:
            continue
        for q in range(reward_kq.shape[1]):
            if sample_kq[k, q]:
                out[k, q] = float(reward_kq[k, q]) - np.mean(others)
    return out


def depth_weights(depth_b, data_b, mask_b, *, max_depth: int = 3) -> np.ndarray:
    """w_d = (Σ c / Σ_d c_d / n_d) / n_d with n_d trajectories (entries with data) and c_d data at depth d."""
    trajectories: dict[int, int] = {}
    data: dict[int, float] = {}
    for d, x, m in zip(depth_b, data_b, mask_b, strict=True):
        if m and x > 0:
            d = min(max(int(d), 0), max_depth)
            trajectories[d] = trajectories.get(d, 0) + 1
            data[d] = data.get(d, 0.0) + float(x)
    unnorm = sum(data[d] / trajectories[d] for d in trajectories)
    out = np.zeros(len(depth_b))
    for b in range(len(depth_b)):
        if mask_b[b] and data_b[b] > 0:
            d = min(max(int(depth_b[b]), 0), max_depth)
            out[b] = sum(data.values()) / unnorm / trajectories[d]
    return out


def nonconstant(x, mask) -> bool:
    values = {float(v) for v, m in zip(np.ravel(x), np.ravel(mask), strict=True) if m}
    return len(values) > 1


# ----------------------------------------------------------------------------------------- whole stages


def execution_credit(parent, mask, child_reward, graded, outcome, rows, *, baseline="root",
                     filter_zero_variance=True, depth_weighting="trajectory", max_depth=3) -> dict:
    """The execution stage over [G, K, Q] arrays: reward, LOO, zero-variance filter, depth weights."""
    num_tasks, num_trees, num_nodes = parent.shape
    reward, adv, depth = (np.zeros(parent.shape) for _ in range(3))
    sample = np.zeros(parent.shape, bool)
    keep = np.zeros(num_tasks, bool)
    for g in range(num_tasks):
        for k in range(num_trees):
            reward[g, k] = execution_reward(parent[g, k], mask[g, k], child_reward[g, k], outcome[g, k])
            depth[g, k] = node_depth(parent[g, k], mask[g, k])
            for q in range(num_nodes):
                sample[g, k, q] = mask[g, k, q] and (parent[g, k, q] < 0 or graded[g, k, q]) and rows[g, k, q] > 0
        adv[g] = execution_advantage(reward[g], sample[g], outcome[g], mask[g].any(-1), baseline=baseline)
        keep[g] = nonconstant(adv[g], sample[g]) if filter_zero_variance else sample[g].any()
        sample[g] &= keep[g]
    data = rows if depth_weighting == "trajectory" else np.ones(parent.shape)
    return _weighted(reward, adv, sample, depth, data, keep, depth_weighting, max_depth)


def _weighted(reward, adv, sample, depth, data, keep, depth_weighting, max_depth) -> dict:
    if depth_weighting == "none":
        weight = sample.astype(float)
    else:
        weight = depth_weights(depth.ravel(), data.ravel(), sample.ravel(), max_depth=max_depth).reshape(sample.shape)
    return dict(reward=reward, advantage=np.where(sample, adv * weight, 0.0), sample=sample, weight=weight,
                keep_g=keep)


def decomposition_credit(parent, mask, event_q, event_node, outcome, *, unit="event", empty_as_zero=True,
                         filter_zero_variance=True, depth_weighting="trajectory", max_depth=3) -> dict:
    """The decomposition stage: launch events (or delegations) of [G, K, ·] trees."""
    num_tasks, num_trees, num_nodes = parent.shape
    size = event_node.shape[-1] if unit == "event" else num_nodes
    reward, adv, depth = (np.zeros((num_tasks, num_trees, size)) for _ in range(3))
    sample = np.zeros((num_tasks, num_trees, size), bool)
    keep = np.zeros(num_tasks, bool)
    for g in range(num_tasks):
        tree_mask = mask[g].any(-1)
        for k in range(num_trees):
            reward_e, reward_q = leaf_coverage(parent[g, k], mask[g, k], event_q[g, k], event_node[g, k],
                                               outcome[g, k])
            d = node_depth(parent[g, k], mask[g, k])
            if unit == "event":
                reward[g, k] = reward_e
                for e in range(size):
                    sample[g, k, e] = event_node[g, k, e] >= 0 and tree_mask[k]
                    depth[g, k, e] = d[event_node[g, k, e]] if sample[g, k, e] else -1
            else:
                reward[g, k] = reward_q
                sample[g, k] = mask[g, k] & (parent[g, k] >= 0)
                depth[g, k] = np.where(sample[g, k], d - 1, -1)
        adv[g] = tree_loo_advantage(reward[g], sample[g], tree_mask, empty_as_zero=empty_as_zero)
        keep[g] = nonconstant(adv[g], sample[g]) if filter_zero_variance else sample[g].any()
        sample[g] &= keep[g]
    if unit == "event" and depth_weighting == "trajectory":  # trajectories: launching nodes; data: events
        nodes = sorted({(g, k, int(event_node[g, k, e])) for g, k, e in zip(*np.nonzero(sample), strict=True)})
        events = [int(sum(sample[g, k, e] and event_node[g, k, e] == q for e in range(size))) for g, k, q in nodes]
        node_depths = [node_depth(parent[g, k], mask[g, k])[q] for g, k, q in nodes]
        w = depth_weights(np.array(node_depths), np.array(events, float), np.ones(len(nodes), bool),
                          max_depth=max_depth) if nodes else np.zeros(0)
        weight = np.zeros(sample.shape)
        for (g, k, q), wq in zip(nodes, w, strict=True):
            weight[g, k] = np.where(sample[g, k] & (event_node[g, k] == q), wq, weight[g, k])
        return dict(reward=reward, advantage=np.where(sample, adv * weight, 0.0), sample=sample, weight=weight,
                    keep_g=keep)
    return _weighted(reward, adv, sample, depth, np.ones(sample.shape), keep, depth_weighting, max_depth)


def rubric_credit(score, success, valid, child_depth, *, margin=0.2, filter_zero_variance=True,
                  depth_weighting="trajectory", max_depth=3) -> dict:
    """The rubric stage over [G, F, I] fork groups: ranking reward, LOO over usable groups, filter, depth."""
    num_tasks, num_groups, _ = score.shape
    reward, adv = np.zeros((num_tasks, num_groups)), np.zeros((num_tasks, num_groups))
    usable = np.zeros((num_tasks, num_groups), bool)
    keep = np.zeros(num_tasks, bool)
    for g in range(num_tasks):
        for f in range(num_groups):
            reward[g, f], usable[g, f] = ranking_reward(score[g, f], success[g, f], valid[g, f], margin)
        adv[g] = loo_advantage(reward[g], usable[g])
        keep[g] = nonconstant(adv[g], usable[g]) if filter_zero_variance else usable[g].any()
        usable[g] &= keep[g]
    return _weighted(reward, adv, usable, child_depth, np.ones(usable.shape), keep, depth_weighting, max_depth)

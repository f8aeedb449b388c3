"""Random recursive trees for the SERA tests: node slots, launch events, fork groups (NumPy, seeded)."""

from __future__ import annotations

import numpy as np

MAX_DEPTH = 3


def random_tree(rng: np.random.Generator, num_slots: int, num_events: int, max_depth: int = MAX_DEPTH):
    """A random tree of depth <= max_depth on random slots (labels not in topological order; padding -9), its
    children grouped into launch events (several children per event, some events that spawned nothing) on random
    event slots. Returns (parent_q, mask_q, event_q, event_node_e)."""
    size = int(rng.integers(1, num_slots + 1))
    parent, depth, event = [-1], [0], [-1]
    events: list[int] = []  # launching node (tree label) of each event
    for _ in range(1, size):
        p = int(rng.choice([i for i in range(len(parent)) if depth[i] < max_depth]))
        own = [e for e, n in enumerate(events) if n == p]
        if own and rng.random() < 0.4 or len(events) >= num_events:
            if not own:  # no free event slot and p has none: attach to a node that has one
                p = events[int(rng.integers(len(events)))]
                own = [e for e, n in enumerate(events) if n == p]
            e = int(rng.choice(own))
        else:
            events.append(p)
            e = len(events) - 1
        parent.append(p)
        depth.append(depth[p] + 1)
        event.append(e)
    while len(events) < num_events and rng.random() < 0.3:  # replies that attempted a delegation, spawning nothing
        events.append(int(rng.integers(len(parent))))
    slots = rng.permutation(num_slots)[:size]  # node i lives in slot slots[i]
    event_slots = rng.permutation(num_events)[: len(events)]
    parent_q = np.full(num_slots, -9, np.int32)
    mask_q = np.zeros(num_slots, bool)
    event_q = np.full(num_slots, -1, np.int32)
    event_node_e = np.full(num_events, -1, np.int32)
    for i in range(size):
        parent_q[slots[i]] = -1 if parent[i] < 0 else slots[parent[i]]
        mask_q[slots[i]] = True
        event_q[slots[i]] = -1 if event[i] < 0 else event_slots[event[i]]
    for e, n in enumerate(events):
        event_node_e[event_slots[e]] = slots[n]
    return parent_q, mask_q, event_q, event_node_e


def random_forest(seed: int, num_tasks: int = 3, num_trees: int = 5, num_slots: int = 9, num_events: int = 6,
                  num_criteria: int = 3) -> dict[str, np.ndarray]:
    """[G, K, ...] arrays of G root tasks × K trees: trees, events, outcomes, child rewards, gradings, rows per node,
    rubric criteria; the last tree of a task is sometimes missing (no real node)."""
    rng = np.random.default_rng(seed)
    trees = [[random_tree(rng, num_slots, num_events) for _ in range(num_trees)] for _ in range(num_tasks)]
    field = lambda i: np.array([[t[i] for t in task] for task in trees])  # noqa: E731
    parent, mask, event_q, event_node = field(0), field(1), field(2), field(3)
    missing = rng.random(num_tasks) < 0.5
    mask[missing, -1] = False
    event_node[missing, -1] = -1
    success = rng.random((num_tasks, num_trees)) < 0.6
    shape_c = mask.shape + (num_criteria,)
    return dict(
        parent=parent, mask=mask, event_q=event_q, event_node=event_node, outcome=success.astype(np.float32),
        child_reward=rng.choice([0.0, 0.25, 0.5, 1.0], mask.shape).astype(np.float32),
        graded=rng.random(mask.shape) < 0.85,
        rows=rng.integers(0, 4, mask.shape).astype(np.int32),
        gate=rng.random(mask.shape) < 0.7,
        weight=rng.uniform(0.0, 3.0, shape_c).astype(np.float32),
        score=rng.uniform(0.0, 1.0, shape_c).astype(np.float32),
        crit_mask=rng.random(shape_c) < 0.8,
    )


def random_fork_groups(seed: int, num_tasks: int = 3, num_groups: int = 5, num_branches: int = 8):
    """[G, F, I] fork groups: scores on a coarse grid (ties happen), labels, valid grades; some groups empty,
    some homogeneous. Returns (score, success, valid, child_depth)."""
    rng = np.random.default_rng(seed)
    shape = (num_tasks, num_groups, num_branches)
    score = rng.choice(np.linspace(0.0, 1.0, 11), shape).astype(np.float32)
    success = rng.random(shape) < rng.uniform(0.0, 1.0, shape[:2] + (1,))
    valid = (rng.random(shape) < 0.9) & (rng.random(shape[:2] + (1,)) < 0.85)
    child_depth = rng.integers(1, MAX_DEPTH + 1, shape[:2]).astype(np.int32)
    return score, success, valid, child_depth

"""Generate a credit-testbed MDP from a seed and an :class:`~envs.mdp.config.MDPConfig` (its docstring draws
the layout and says what each knob does).

Generation is a pure function of ``(seed, config)``. Each part draws from its own stream,
``default_rng([seed, part])``: the rooms (the start and layers 1..depth), the ledge, the lock, the action order,
the labels, the room numbers. So the lock does not change the rooms, and ``slip`` / ``noise`` enter only the
probabilities of ``p_sat``, never the graph: two settings that differ in those knobs share every state and edge.

Rooms, layer by layer (layer 0 is the start, whose exits are forward actions and, with a shortcut, the ledge):

1. The forward actions of layer ``l − 1`` lead into layer ``l``, of ``min(width, forward actions)`` rooms, of
   which ``round(doomed · width_l)`` are doomed (fewer where the forward actions of reachable-goal rooms could
   not cover the rest, and always at least one room that is not).
2. Targets: every room that can reach the goal sends its first forward action to one that can (in a round-robin
   over a shuffled list, so every one of them gets a predecessor), the rooms nobody reaches yet take a spare
   forward action each, and the rest go to uniformly random rooms of the layer (doomed rooms' only to doomed
   ones, or into the pit when the layer has none). A state's actions lead to distinct rooms while it can.
3. Each room draws its number of actions in ``min_actions .. max_actions`` and, per action, falls into the pit
   with probability ``dead_ends``, loops back with probability ``loops`` (to a random earlier state of its own
   kind; a doomed room with no earlier doomed room goes forward instead) or goes forward; a room whose draws
   left it without a forward action gets one at a random slot.

The last layer's forward actions lead into the lock (or straight to the goal without one); doomed rooms' into
the pit. By construction every room that is not doomed has a deterministic path to the goal and every doomed
room has none.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from envs.mdp.config import MAX_ACTIONS, MDPConfig
from envs.mdp.model import MDP
from envs.mdp.text import GOAL, LABELS, PIT, room_name

_PIT, _EXIT, _GOAL, _NEXT = -1, -2, -3, -100  # symbolic targets, resolved to state indices at the end
_ROOMS, _LEDGE, _LOCK, _ORDER, _LABELS, _NAMES = range(6)  # the random streams, one per part
_FALL, _LOOP, _ON = range(3)  # what a room's action does (step 3)


@dataclasses.dataclass(eq=False)
class _Node:
    """A state that acts, while it is being built."""

    kind: str  # "start", "room", "ledge" or "lock"
    layer: int
    good: bool  # the goal can be reached from it
    succ: list[int] = dataclasses.field(default_factory=list)  # intended successor per action (index or marker)
    forward: list[int] = dataclasses.field(default_factory=list)  # slots whose target is in the next layer


def generate_mdp(seed: int, config: MDPConfig | None = None) -> MDP:
    """The MDP of a seed under a setting (default: ``MDPConfig()``); the same pair gives the same model."""
    config = config if config is not None else MDPConfig()
    streams = [np.random.default_rng([seed, part]) for part in range(6)]
    nodes = _rooms(streams[_ROOMS], config)
    start = nodes[0]
    if config.shortcut:
        ledge = _chain(streams[_LEDGE], config, "ledge", config.shortcut, _EXIT)
        start.succ.append(len(nodes))
        nodes += ledge
    exit_ = len(nodes) if config.lock else _GOAL
    nodes += _chain(streams[_LOCK], config, "lock", config.lock, _GOAL, first_layer=config.depth + 1)
    _shuffle_actions(streams[_ORDER], nodes)
    labels = _labels(streams[_LABELS], [len(n.succ) for n in nodes])
    return _build(seed, config, nodes, exit_, labels, streams[_NAMES])


# -- the rooms ---------------------------------------------------------------------------------------------------------
def _rooms(rng: np.random.Generator, config: MDPConfig) -> list[_Node]:
    """The start (index 0) and the rooms of layers 1..depth, with every target resolved but the last layer's."""
    start = _Node("start", 0, True)
    n_forward = _num_actions(rng, config) - (1 if config.shortcut else 0)
    start.succ, start.forward = [_EXIT] * n_forward, list(range(n_forward))
    nodes, previous = [start], [start]
    for layer in range(1, config.depth + 1):
        current = _new_layer(rng, config, previous, layer)
        _assign_forward(rng, previous, current, len(nodes))
        for node in current:
            _draw_actions(rng, config, node, nodes)
        nodes += current
        previous = current
    for node in previous:
        for slot in node.forward:
            node.succ[slot] = _EXIT if node.good else _PIT
    return nodes


def _new_layer(rng: np.random.Generator, config: MDPConfig, previous: list[_Node], layer: int) -> list[_Node]:
    """The rooms of a layer (step 1 of the module docstring), in a random order."""
    good_owners = [n for n in previous if n.good]
    good_slots = sum(len(n.forward) for n in good_owners)
    slots = sum(len(n.forward) for n in previous)
    width = min(config.width, slots)
    n_good = min(width - min(int(config.doomed * width + 0.5), width - 1), good_slots)
    n_doomed = min(width - n_good, slots - max(len(good_owners), n_good))
    rooms = [_Node("room", layer, True) for _ in range(n_good)] + [_Node("room", layer, False) for _ in range(n_doomed)]
    return [rooms[i] for i in rng.permutation(len(rooms))]


def _assign_forward(rng: np.random.Generator, previous: list[_Node], current: list[_Node], offset: int) -> None:
    """Targets of the forward actions of ``previous`` in ``current`` (whose first index is ``offset``); step 2."""
    index = {id(node): offset + i for i, node in enumerate(current)}
    good = [index[id(n)] for n in current if n.good]
    doomed = [index[id(n)] for n in current if not n.good]
    free = [(node, slot) for node in previous for slot in node.forward]
    covered: set[int] = set()

    def take(pool: list[tuple[_Node, int]], target: int) -> None:
        fresh = [i for i, (node, _) in enumerate(pool) if target not in node.succ]
        node, slot = pool[int(rng.choice(fresh))] if fresh else pool[int(rng.integers(len(pool)))]
        node.succ[slot] = target
        free.remove((node, slot))
        covered.add(target)

    order = [good[i] for i in rng.permutation(len(good))]
    owners = [n for n in previous if n.good]
    for k, i in enumerate(rng.permutation(len(owners))):
        take([(owners[i], owners[i].forward[0])], order[k % len(order)])
    for target in [t for t in order if t not in covered]:
        take([(node, slot) for node, slot in free if node.good], target)
    for target in doomed:
        take(list(free), target)
    for node, slot in list(free):
        choices = good + doomed if node.good else doomed
        fresh = [t for t in choices if t not in node.succ]
        node.succ[slot] = int(rng.choice(fresh or choices)) if choices else _PIT
    for node in previous:
        node.forward = []


def _draw_actions(rng: np.random.Generator, config: MDPConfig, node: _Node, earlier: list[_Node]) -> None:
    """A room's actions: pit, loop or forward (step 3); forward targets are left for the next layer."""
    n = _num_actions(rng, config)
    loop_targets = [i for i, e in enumerate(earlier) if e.good == node.good and e.kind in ("start", "room")]
    kinds = rng.choice(3, size=n, p=[config.dead_ends, config.loops, 1.0 - config.dead_ends - config.loops])
    if not loop_targets:
        kinds[kinds == _LOOP] = _ON
    if not np.any(kinds == _ON):
        kinds[rng.integers(n)] = _ON
    for slot, kind in enumerate(kinds):
        if kind == _FALL:
            node.succ.append(_PIT)
        elif kind == _LOOP:
            node.succ.append(int(rng.choice(loop_targets)))
        else:
            node.succ.append(_EXIT)  # a placeholder until the next layer is built
            node.forward.append(slot)


def _num_actions(rng: np.random.Generator, config: MDPConfig) -> int:
    return int(rng.integers(config.min_actions, config.max_actions + 1))


# -- the ledge and the lock --------------------------------------------------------------------------------------------
def _chain(rng: np.random.Generator, config: MDPConfig, kind: str, length: int, last: int,
           first_layer: int = 1) -> list[_Node]:
    """``length`` states in a row: one random action of each goes on (the last state's to ``last``), the others
    into the pit. The next state of the chain is the marker ``_NEXT - k`` (its position k), resolved in
    :func:`_build` once the chain has its place in the list."""
    nodes = []
    for i in range(length):
        n = _num_actions(rng, config)
        node = _Node(kind, first_layer + i, True, [_PIT] * n)
        node.succ[int(rng.integers(n))] = last if i == length - 1 else _NEXT - (i + 1)
        nodes.append(node)
    return nodes


def _shuffle_actions(rng: np.random.Generator, nodes: list[_Node]) -> None:
    """Each state's actions in a random order, so a slot's position says nothing about where it leads."""
    for node in nodes:
        node.succ = [node.succ[i] for i in rng.permutation(len(node.succ))]


# -- arrays ------------------------------------------------------------------------------------------------------------
def _build(seed: int, config: MDPConfig, nodes: list[_Node], exit_: int, labels: tuple[tuple[str, ...], ...],
           rng: np.random.Generator) -> MDP:
    """Resolves the markers and fills the arrays of :class:`~envs.mdp.model.MDP`."""
    num_acting = len(nodes)
    goal = num_acting
    uses_pit = any(t == _PIT for node in nodes for t in node.succ)
    num_states = num_acting + 1 + int(uses_pit)
    chain_start = {kind: next((i for i, n in enumerate(nodes) if n.kind == kind), -1) for kind in ("ledge", "lock")}

    def resolve(node: _Node, target: int) -> int:
        if target >= 0:
            return target
        if target == _PIT:
            return goal + 1
        if target == _GOAL:
            return goal
        if target == _EXIT:
            return exit_ if exit_ >= 0 else goal
        return chain_start[node.kind] + (_NEXT - target)

    next_sa = np.full((num_states, MAX_ACTIONS), -1, dtype=np.int64)
    for s, node in enumerate(nodes):
        next_sa[s, : len(node.succ)] = [resolve(node, t) for t in node.succ]
    slip_s = np.array([_slip(config, n.kind) for n in nodes] + [0.0] * (num_states - num_acting))
    numbers = rng.permutation(num_acting) + 1
    names = tuple(room_name(int(k)) for k in numbers) + (GOAL,) + ((PIT,) if uses_pit else ())
    terminal_s = np.arange(num_states) >= num_acting
    return MDP(
        p_sat=_transitions(next_sa, slip_s), mask_sa=next_sa >= 0, next_sa=next_sa,
        goal_s=np.arange(num_states) == goal, terminal_s=terminal_s, start=0, max_steps=config.step_cap,
        names=names, labels=labels + ((),) * (num_states - num_acting),
        kind_s=tuple(n.kind for n in nodes) + ("goal",) + (("pit",) if uses_pit else ()),
        layer_s=np.array([n.layer for n in nodes] + [-1] * (num_states - num_acting)),
        doomed_s=np.array([not n.good for n in nodes] + [False] * (num_states - num_acting)), config=config, seed=seed,
    )


def _slip(config: MDPConfig, kind: str) -> float:
    return {"start": config.noise, "room": config.noise, "ledge": config.slip}.get(kind, 0.0)


def _labels(rng: np.random.Generator, counts: list[int]) -> tuple[tuple[str, ...], ...]:
    """Per state, ``n`` distinct labels of :data:`LABELS` in a random order."""
    return tuple(tuple(LABELS[i] for i in rng.permutation(len(LABELS))[:n]) for n in counts)


def _transitions(next_sa: np.ndarray, slip_s: np.ndarray) -> np.ndarray:
    """[S, A, S] ``P(s'|s,a) = (1 − p_s)·1[s' = next(s,a)] + p_s / (n_s − 1) · Σ_{b ≠ a} 1[s' = next(s,b)]``."""
    num_states = next_sa.shape[0]
    p_sat = np.zeros((num_states, MAX_ACTIONS, num_states))
    for s in range(num_states):
        succ = next_sa[s][next_sa[s] >= 0]
        for a, t in enumerate(succ):
            p_sat[s, a, t] += 1.0 - slip_s[s]
            for b, u in enumerate(succ):
                if b != a:
                    p_sat[s, a, u] += slip_s[s] / (len(succ) - 1)
    return p_sat

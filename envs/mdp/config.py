"""The knobs of a generated credit-testbed MDP (:mod:`envs.mdp.generate` builds one from a seed and these).

The layout every setting shares (state kinds in brackets)::

    [start] ── forward ──> layer 1 ──> layer 2 ──> ... ──> layer `depth` ──> [lock 1] ─> ... ─> [lock k] ─> [goal]
       └──── ledge ────> [ledge 1] ─> ... ─> [ledge `shortcut`] ──────────────────────┘
    (wrong turns: [pit], the one absorbing failure state; rooms of layers 1..depth are [room]s)

Each knob changes one mechanism:

- ``depth`` (horizon): layers of rooms on the safe route; the safe path takes ``depth + 1 + lock`` steps.
- ``width`` (converging paths): rooms per layer (layer widths grow from the start's exits up to ``width``).
  Every forward action leads to a room of the next layer, so each room has about as many predecessors as a
  room has forward actions; the fewer rooms per layer, the more often two episodes meet in the same room.
- ``doomed`` (delayed failure): the fraction of each layer's rooms from which the goal cannot be reached. They
  look like any room; their way forward leads only to doomed rooms and finally into the pit, so a wrong turn is
  paid for only at the end of the route.
- ``shortcut`` and ``slip`` (stochastic transitions; the shortest path is not the likeliest success): one exit of
  the start leads onto a ledge of ``shortcut`` states that joins the route at the lock, ``depth − shortcut``
  steps sooner. On the ledge one action goes on and the others fall into the pit, and with probability ``slip``
  an action lands on the successor of another of the state's actions (uniformly), so following the ledge
  succeeds with probability ``(1 − slip) ** shortcut``, while the safe route needs no luck.
- ``noise``: the same slip probability in the start and in every room (0 keeps the safe route deterministic).
- ``dead_ends``: each action of a room falls into the pit with this probability (a terminal failure at once).
- ``loops``: each action of a room returns, with this probability, to a random room of an earlier layer (the
  start included) of the same kind (reachable goal or doomed): the episode loses steps against the cap.
- ``lock``: ``k`` states before the goal, each with one right action; every other action falls into the pit, so
  a uniform policy passes the lock with probability ``Π 1 / n_j`` over its ``n_j`` actions.
- ``min_actions`` / ``max_actions``: every state that acts has a uniform number of actions in this range.
- ``max_steps``: the episode's step cap (0: twice the safe path's length).
"""

from __future__ import annotations

import dataclasses
import numbers

MAX_ACTIONS = 4  # the padded action axis of the transition table


@dataclasses.dataclass(frozen=True)
class MDPConfig:
    """Settings of a generated MDP (module docstring: what each knob does); validated when built."""

    depth: int = 6  # layers of rooms between the start and the lock (the horizon)
    width: int = 3  # rooms per layer (converging paths)
    doomed: float = 0.0  # fraction of each layer's rooms from which the goal cannot be reached
    shortcut: int = 0  # ledge states of the slippery shortcut (0: none; else 1 .. depth - 1)
    slip: float = 0.0  # slip probability on the ledge
    noise: float = 0.0  # slip probability in the start and in the rooms
    dead_ends: float = 0.0  # probability that a room's action falls into the pit
    loops: float = 0.0  # probability that a room's action returns to an earlier layer
    lock: int = 0  # states before the goal that each need one specific action
    min_actions: int = 2  # fewest actions of a state that acts
    max_actions: int = 4  # most actions of a state that acts (at most MAX_ACTIONS)
    max_steps: int = 0  # the step cap; 0: 2 * (depth + 1 + lock)

    def __post_init__(self):
        _check_int("depth", self.depth, 1, 64)
        _check_int("width", self.width, 1, 32)
        _check_int("lock", self.lock, 0, 16)
        _check_int("min_actions", self.min_actions, 2, MAX_ACTIONS)
        _check_int("max_actions", self.max_actions, self.min_actions, MAX_ACTIONS)
        _check_int("shortcut", self.shortcut, 0, self.depth - 1)
        for name in ("doomed", "slip", "noise", "dead_ends", "loops"):
            _check_probability(name, getattr(self, name))
        if self.dead_ends + self.loops >= 1.0:
            raise ValueError(f"dead_ends + loops must be < 1 (rooms need a way forward), got "
                             f"{self.dead_ends} + {self.loops}")
        if self.slip > 0.0 and self.shortcut == 0:
            raise ValueError(f"slip ({self.slip}) acts on the ledge only: set shortcut >= 1 (or noise for the rooms)")
        _check_int("max_steps", self.max_steps, 0, 10_000)
        if 0 < self.max_steps < self.shortest_path:
            raise ValueError(f"max_steps ({self.max_steps}) is below the shortest path to the goal "
                             f"({self.shortest_path} steps): no episode could succeed")

    @property
    def safe_path(self) -> int:
        """Steps of the route through the rooms: ``depth`` layers, the step into the lock, ``lock`` steps."""
        return self.depth + 1 + self.lock

    @property
    def shortest_path(self) -> int:
        """Steps of the shortest route to the goal (over the ledge when there is one)."""
        return (self.shortcut + 1 + self.lock) if self.shortcut else self.safe_path

    @property
    def step_cap(self) -> int:
        """The episode's step cap: ``max_steps``, or twice the safe path's length when it is 0."""
        return self.max_steps or 2 * self.safe_path


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must lie in {low}..{high}, got {value}")


def _check_probability(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must lie in [0, 1), got {value}")

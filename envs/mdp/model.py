"""A small text MDP with a known model: transition table, masks, names and labels, as plain NumPy arrays.

States are indexed ``0 .. S-1`` and actions ``0 .. MAX_ACTIONS-1`` per state; a state with fewer actions has its
last slots masked (``mask_sa``). Terminal states (the goal and the pit) have no actions: their rows of ``p_sat``
are zero and the episode ends on entering them. The reward is 1 on the step that enters a goal state and 0
otherwise. Arrays are read-only once built (models are cached and shared).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from envs.mdp.config import MAX_ACTIONS, MDPConfig
from envs.mdp.text import observation

KINDS = ("start", "room", "ledge", "lock", "goal", "pit")


@dataclasses.dataclass(frozen=True, eq=False)
class MDP:
    """A finite MDP with sparse terminal reward and an episode step cap ``max_steps``."""

    p_sat: np.ndarray  # [S, A, S] float64, P(s' | s, a); zero rows where mask_sa is False
    mask_sa: np.ndarray  # [S, A] bool, admissible actions (a prefix of the slots)
    next_sa: np.ndarray  # [S, A] int, the intended successor of an action (-1 where masked)
    goal_s: np.ndarray  # [S] bool, entering it wins (reward 1)
    terminal_s: np.ndarray  # [S] bool, the episode ends on entering it (goal or pit)
    start: int  # the state of every reset
    max_steps: int  # the episode's step cap H
    names: tuple[str, ...]  # [S] "room 17", "goal", "pit"
    labels: tuple[tuple[str, ...], ...]  # [S] the admissible action labels, in slot order
    kind_s: tuple[str, ...] = ()  # [S] one of KINDS ("" for hand-built models)
    layer_s: np.ndarray | None = None  # [S] int: start 0, rooms 1..depth, ledge 1..shortcut, lock depth+j, -1 terminal
    doomed_s: np.ndarray | None = None  # [S] bool, the rooms from which the goal cannot be reached (by construction)
    config: MDPConfig | None = None  # the settings it was generated from (None: hand-built)
    seed: int | None = None  # the seed it was generated from

    def __post_init__(self):
        s = self.num_states
        _check_shape("p_sat", self.p_sat, (s, MAX_ACTIONS, s))
        for name, shape in (("mask_sa", (s, MAX_ACTIONS)), ("next_sa", (s, MAX_ACTIONS)), ("goal_s", (s,)),
                            ("terminal_s", (s,))):
            _check_shape(name, getattr(self, name), shape)
        counts = self.mask_sa.sum(1)
        if np.any(self.mask_sa[:, 1:] & ~self.mask_sa[:, :-1]):
            raise ValueError("mask_sa: admissible actions must be a prefix of the action slots")
        if np.any(counts[self.terminal_s] != 0) or np.any(counts[~self.terminal_s] < 1):
            raise ValueError("mask_sa: terminal states have no actions, every other state has at least one")
        rows = self.p_sat.sum(2)
        if np.any(self.p_sat < 0) or not np.allclose(rows, self.mask_sa.astype(float), atol=1e-9):
            raise ValueError("p_sat: rows must be probability distributions on admissible actions, zero elsewhere")
        if np.any(self.goal_s & ~self.terminal_s):
            raise ValueError("goal_s: goal states must be terminal")
        if not 0 <= self.start < s or self.terminal_s[self.start]:
            raise ValueError(f"start ({self.start}) must be a non-terminal state")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if len(self.names) != s or [len(x) for x in self.labels] != counts.tolist():
            raise ValueError("names and labels must have one entry per state, one label per admissible action")
        for array in (self.p_sat, self.mask_sa, self.next_sa, self.goal_s, self.terminal_s, self.layer_s,
                      self.doomed_s):
            if array is not None:
                array.setflags(write=False)

    @property
    def num_states(self) -> int:
        return int(self.p_sat.shape[0])

    @property
    def num_actions_s(self) -> np.ndarray:
        """[S] int, admissible actions per state (0 for terminal states)."""
        return self.mask_sa.sum(1)

    def text(self, state: int) -> str:
        """The observation of a state (:func:`envs.mdp.text.observation`)."""
        return observation(self.names[state], self.labels[state])

    def predecessors(self) -> list[set[int]]:
        """``[S]`` the states with an action that can lead to each state (with positive probability)."""
        pred: list[set[int]] = [set() for _ in range(self.num_states)]
        for s, _, t in zip(*np.nonzero(self.p_sat > 0), strict=True):
            pred[int(t)].add(int(s))
        return pred

    def fan_in_s(self) -> np.ndarray:
        """[S] int, the number of distinct predecessors of each state (:meth:`predecessors`)."""
        return np.array([len(p) for p in self.predecessors()])


def _check_shape(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    if not isinstance(array, np.ndarray) or array.shape != shape:
        raise ValueError(f"{name} must be an array of shape {shape}, got {getattr(array, 'shape', type(array))}")

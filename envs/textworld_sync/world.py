"""The shared world of one tree: one :class:`WorldState` behind one lock, several agents acting on it.

The authors' coordinator (``CompositeCookingWorldCoordinator``; GitHub ``OliverLeeXZ/SERA``,
``Runtime/environments/textworld/composite_cooking.py``) serialises every step and observation of every agent with
one ``asyncio.Lock``; here a re-entrant ``threading.RLock`` does the same for threads, so a step is checked, applied,
scored, logged and observed before any other agent's step or read starts: a concurrent run equals the serial run of
its event log (:func:`replay`). Agents keep their own location and history; ingredients, inventory, counter, dishes,
gate, tool cooldowns and the step budget are shared.

The runtime's inventory lookup (the authors' ``textworld_continuous_policy/env.py`` and evaluator ``_run_agent``):
``inventory`` / ``view inventory`` / ``check inventory`` read the shared inventory *without* a world step (no budget,
no cooldown tick); :meth:`World.lookup` gives that text, in the training runtime's wording or the evaluator's
(:data:`LOOKUP_TEXTS`). :meth:`World.step` is the bare engine, where those commands are accepted no-ops that use a
step.

Deviations, on purpose: an agent must be added (:meth:`World.add_agent`) before it acts or reads (the engine gives
an unknown agent the kitchen); a step after the world is done changes nothing, uses no budget and is not logged (the
authors' agents stop on ``done``, so the engine only sees such a step in a race between agents, and then applies it
past the budget).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from envs.textworld_sync import rules
from envs.textworld_sync.state import ROOT, START_ROOM, WorldState, normalise

T = TypeVar("T")
INVENTORY_COMMANDS = frozenset({"inventory", "view inventory", "check inventory"})
LOOKUP_TEXTS = {
    "evaluation": "[Inventory Lookup]\nCurrent shared inventory (visible to all Agents):\n{inventory}\n\n"
                  "Current environment observation:\n{observation}",
    "training": "[Inventory Lookup]\nCurrent shared inventory:\n{inventory}\n\n"
                "Current environment observation:\n{observation}",
}


def is_lookup(command: str) -> bool:
    """Whether the runtime answers ``command`` with an inventory lookup instead of a world step."""
    return normalise(command or "") in INVENTORY_COMMANDS


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one command of one agent produced."""

    observation: str  # what the agent reads: the engine's status text, or the lookup text
    reward: float  # 1.0 on the step that completes the task
    done: bool  # success, failure or the shared budget spent
    infos: dict[str, Any]  # the engine's infos for this agent after the step
    accepted: bool  # the engine accepted the command (a lookup is always accepted)
    lookup: bool = False  # an inventory lookup: no world step was taken


class World:
    """A :class:`WorldState` behind a lock, with the agents acting in it (module docstring)."""

    def __init__(self, state: WorldState):
        if not isinstance(state, WorldState):
            raise TypeError(f"World takes a WorldState, got {type(state).__name__}")
        self._state = state
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:  # the lock is not state
        with self._lock:
            return {"state": copy.deepcopy(self._state)}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self._state, self._lock = d["state"], threading.RLock()

    # -- agents -----------------------------------------------------------------------------------------------------
    def add_agent(self, agent: str, *, location: str | None = None) -> None:
        """A new agent, by default where the root agent stands (the engine's ``fork_shared``), else the kitchen."""
        if not isinstance(agent, str) or not agent:
            raise ValueError(f"an agent id is a non-empty str, got {agent!r}")
        with self._lock:
            s = self._state
            if agent in s.locations:
                raise ValueError(f"agent {agent!r} already exists; agents are {sorted(s.locations)}")
            room = location if location is not None else s.locations.get(ROOT, START_ROOM)
            if room not in s.rooms:
                raise ValueError(f"unknown room {room!r}; rooms are {list(s.rooms)}")
            s.locations[agent] = room
            s.histories[agent] = []

    @property
    def agents(self) -> list[str]:
        with self._lock:
            return list(self._state.locations)

    # -- acting and reading -----------------------------------------------------------------------------------------
    def step(self, agent: str, command: str) -> StepResult:
        """One engine step of ``agent``, atomically (module docstring)."""
        if not isinstance(command, str):
            raise TypeError(f"a command is a str, got {type(command).__name__}")
        with self._lock:
            s = self._state
            self._check(agent)
            if s.done:
                info = rules.infos(s, agent)
                return StepResult(rules.observation(s, agent), 0.0, True, info, False)
            text, reward, done, info, ok = rules.transition(s, agent, command)
            s.histories[agent].append((command.strip(), text))
            return StepResult(text, reward, done, info, ok)

    def lookup(self, agent: str, command: str = "inventory", *, style: str = "evaluation") -> StepResult:
        """The runtime's inventory lookup for ``agent``: no world step (module docstring)."""
        if style not in LOOKUP_TEXTS:
            raise ValueError(f"unknown lookup style {style!r}; one of {sorted(LOOKUP_TEXTS)}")
        with self._lock:
            s = self._state
            self._check(agent)
            info = rules.infos(s, agent)
            text = LOOKUP_TEXTS[style].format(inventory=str(info["inventory"]).strip() or "(empty)",
                                              observation=rules.observation(s, agent))
            s.histories[agent].append((command.strip(), text))
            return StepResult(text, 0.0, s.done, info, True, lookup=True)

    def act(self, agent: str, command: str, *, style: str = "evaluation") -> StepResult:
        """What the runtime does with an agent's command: a lookup for the inventory commands, else a step."""
        return self.lookup(agent, command, style=style) if is_lookup(command) else self.step(agent, command)

    def observe(self, agent: str) -> tuple[str, dict[str, Any]]:
        """``agent``'s observation text and infos now, without acting."""
        with self._lock:
            self._check(agent)
            return rules.observation(self._state, agent), rules.infos(self._state, agent)

    def read(self, fn: Callable[[WorldState], T]) -> T:
        """``fn(state)`` under the lock: a consistent read (planners, verifiers). ``fn`` must not mutate."""
        with self._lock:
            return fn(self._state)

    @contextlib.contextmanager
    def locked(self) -> Iterator[WorldState]:
        """Holds the lock for a block of reads (several calls that must see one state)."""
        with self._lock:
            yield self._state

    # -- copies -----------------------------------------------------------------------------------------------------
    def snapshot(self) -> WorldState:
        """An exact, picklable deep copy of the whole shared state (agents, histories, event log)."""
        with self._lock:
            return copy.deepcopy(self._state)

    def restore(self, state: WorldState) -> None:
        if not isinstance(state, WorldState):
            raise TypeError(f"restore() takes a WorldState (from snapshot()), got {type(state).__name__}")
        with self._lock:
            self._state = copy.deepcopy(state)

    def clone(self) -> World:
        """An independent world in the same state with its own lock (a counterfactual fork)."""
        return World(self.snapshot())

    # -- summaries --------------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        with self._lock:
            return self._state.done

    @property
    def won(self) -> bool:
        with self._lock:
            return rules.score(self._state)["task_success"]

    @property
    def budget_left(self) -> int:
        with self._lock:
            return self._state.budget_left

    def _check(self, agent: str) -> None:
        if agent not in self._state.locations:
            raise KeyError(f"unknown agent {agent!r}; agents are {sorted(self._state.locations)} (add_agent() first)")


def replay(initial: WorldState, events: list[tuple[str, str]]) -> WorldState:
    """The state reached by stepping ``(agent, command)`` pairs one by one from ``initial`` (which must hold the same
    agents): the serial order that a concurrent run committed (``[(e.agent, e.action) for e in state.events]``)."""
    world = World(copy.deepcopy(initial))
    for agent, command in events:
        world.step(agent, command)
    return world.snapshot()

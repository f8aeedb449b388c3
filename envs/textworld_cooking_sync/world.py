"""The shared world several agents act in: one state, one lock, per-agent location, history and step budget.

SERA's TextWorld-Sync (METHODS.md; SERA App. C.1): agents share objects, inventories, tools, doors, recipe progress
and score, and keep their own location, history, observations and step budget; environment reads and state
transitions are serialised and committed atomically. Here every public method takes the world's re-entrant lock
for its whole duration, so a command of one agent is parsed, applied, scored and logged before any other agent's
command or read starts: any interleaving of concurrent callers equals the serial execution of the commands in the
order the world committed them (``WorldState.log``), which :func:`replay` reproduces.

Inventories. By default (``WorldState.shared_inventory``) all agents carry one shared inventory, the reading of
"agents share ... inventories" in which an ingredient fetched by one agent is at once usable by every other (as
SERA's TextCraft children share their parent's inventory). With ``shared_inventory=False`` each agent carries its
own items; every inventory is still part of the one shared state, so all agents see consistent holdings (an item
held by one agent is not on the floor for another).

Step budgets: an agent with ``max_steps`` can issue that many commands (valid or not); the command that uses the
last step returns ``done`` with ``truncated`` unless the world was won by it. Commands after the world is won or lost,
or after the budget is spent, change nothing and are not counted.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from envs.textworld_cooking_sync import rules
from envs.textworld_cooking_sync.state import Agent, WorldState
from envs.textworld_cooking_sync.text import room_text

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one agent's command produced."""

    text: str  # the feedback the agent reads
    reward: float  # score gained by this command
    done: bool  # this agent can act no more: the world is won or lost, or its budget is spent
    valid: bool  # the command was understood and its preconditions held
    won: bool  # the world is won (every dish eaten)
    lost: bool  # a dish became impossible
    truncated: bool  # the agent's budget ran out on this step and the world was not won
    score: int
    max_score: int


class World:
    """A :class:`WorldState` behind a lock, with the agents acting in it (module docstring)."""

    def __init__(self, state: WorldState):
        self._state = state
        self._lock = threading.RLock()

    # -- pickling: the lock is not state ----------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"state": copy.deepcopy(self._state)}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self._state, self._lock = d["state"], threading.RLock()

    # -- agents -----------------------------------------------------------------------------------------------------
    def add_agent(
        self, agent_id: str, *, room: str | None = None, max_steps: int | None = None, parent: str | None = None
    ) -> None:
        """A new agent in ``room`` (default: the parent's room, else the world's start room)."""
        if not isinstance(agent_id, str) or not agent_id:
            raise ValueError(f"an agent id is a non-empty str, got {agent_id!r}")
        if max_steps is not None and max_steps <= 0:
            raise ValueError(f"max_steps must be positive or None, got {max_steps}")
        with self._lock:
            s = self._state
            if agent_id in s.agents:
                raise ValueError(f"agent {agent_id!r} already exists; agents are {sorted(s.agents)}")
            if parent is not None and parent not in s.agents:
                raise ValueError(f"parent {parent!r} is not an agent of this world; agents are {sorted(s.agents)}")
            if room is None:
                room = s.agents[parent].room if parent is not None else s.start_room
            if room not in s.rooms:
                raise ValueError(f"unknown room {room!r}; rooms are {sorted(s.rooms)}")
            s.agents[agent_id] = Agent(id=agent_id, room=room, max_steps=max_steps, parent=parent)

    @property
    def agents(self) -> list[str]:
        with self._lock:
            return list(self._state.agents)

    # -- acting and reading -----------------------------------------------------------------------------------------
    def step(self, agent_id: str, command: str) -> StepResult:
        """Applies one command of ``agent_id`` atomically (module docstring)."""
        if not isinstance(command, str):
            raise TypeError(f"a command is a str, got {type(command).__name__}")
        with self._lock:
            s = self._state
            agent = self._agent(agent_id)
            if s.over:
                return self._result(agent, "The game is over.", 0, False, False)
            if agent.max_steps is not None and agent.steps >= agent.max_steps:
                return self._result(agent, "You have no steps left.", 0, False, True)
            before = s.score
            out = rules.execute(s, agent_id, command)
            agent.steps += 1
            agent.history.append((command, out.text))
            s.log.append((agent_id, command))
            spent = agent.max_steps is not None and agent.steps >= agent.max_steps
            return self._result(agent, out.text, s.score - before, out.valid, spent)

    def observe(self, agent_id: str) -> str:
        """What ``agent_id`` sees now (the ``look`` text), without acting."""
        with self._lock:
            return room_text(self._state, self._agent(agent_id).room, agent_id)

    def admissible(self, agent_id: str) -> tuple[str, ...]:
        with self._lock:
            self._agent(agent_id)
            return rules.admissible(self._state, agent_id)

    def read(self, fn: Callable[[WorldState], T]) -> T:
        """``fn(state)`` under the lock: a consistent read (verifiers, planners). ``fn`` must not mutate."""
        with self._lock:
            return fn(self._state)

    @contextlib.contextmanager
    def locked(self) -> Iterator[WorldState]:
        """Holds the lock for a block of reads (and, for tools that know what they do, writes)."""
        with self._lock:
            yield self._state

    def snapshot(self) -> WorldState:
        """An exact, picklable copy of the whole shared state (agents, histories and log included)."""
        with self._lock:
            return copy.deepcopy(self._state)

    def restore(self, state: WorldState) -> None:
        if not isinstance(state, WorldState):
            raise TypeError(f"restore() takes a WorldState (from snapshot()), got {type(state).__name__}")
        with self._lock:
            self._state = copy.deepcopy(state)

    @property
    def won(self) -> bool:
        with self._lock:
            return self._state.won

    @property
    def lost(self) -> bool:
        with self._lock:
            return self._state.lost

    @property
    def score(self) -> tuple[int, int]:
        with self._lock:
            return self._state.score, self._state.max_score

    # -- helpers ------------------------------------------------------------------------------------------------------
    def _agent(self, agent_id: str) -> Agent:
        agent = self._state.agents.get(agent_id)
        if agent is None:
            raise KeyError(f"unknown agent {agent_id!r}; agents are {sorted(self._state.agents)} (add_agent() first)")
        return agent

    def _result(self, agent: Agent, text: str, reward: int, valid: bool, spent: bool) -> StepResult:
        s = self._state
        won, lost = s.won, s.lost
        return StepResult(
            text=text,
            reward=float(reward),
            done=won or lost or spent,
            valid=valid,
            won=won,
            lost=lost,
            truncated=spent and not won,
            score=s.score,
            max_score=s.max_score,
        )


def replay(initial: WorldState, log: list[tuple[str, str]]) -> WorldState:
    """The state reached by executing ``log``'s (agent, command) pairs one by one from ``initial`` (which must hold
    the same agents): the serial order a concurrent run committed."""
    world = World(copy.deepcopy(initial))
    for agent_id, command in log:
        world.step(agent_id, command)
    return world.snapshot()

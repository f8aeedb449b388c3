"""TextWorld-Sync on tw-cooking behind the one Env protocol (the root agent) plus handles for more agents on the
same world.

``TextWorldCookingSyncEnv`` is an :class:`envs.base.Env`: ``reset(task)`` builds the task's world (generate.py) with one
agent, ``"root"``, whose observation stream the env returns; ``step`` is the root's command. The SERA recursive
runtime adds children with :meth:`TextWorldCookingSyncEnv.spawn`, which returns an :class:`AgentHandle` (its own
``step``/``observe``/``oracle``, its own step budget and history) acting on the same shared :class:`World`; all
agents' commands are serialised by the world's lock (world.py), whichever threads issue them.

Observations (``Obs``):

- ``text``: the feedback of the last command, as TextWorld shows it; after ``reset``, the objective and the room.
- ``anchor``: the feedback, the agent's room description and its inventory: equal anchors mean the same feedback in
  the same visible state (TextWorld's feedback alone, e.g. "You open the fridge.", does not identify the state).
- ``admissible``: the agent's admissible commands (rules.py), or None with ``admissible=False``.
- ``instruction``: the objective ("You are hungry! Let's cook 3 delicious dishes: ..."), or a child's own task.

Rewards are score gains (CookingWorld's points: take, cook, cut, prepare, eat); ``info`` has ``won`` (every dish
eaten), ``lost`` (a dish became impossible; the episode terminates, as CookingWorld's lost game), ``valid``,
``truncated``, ``score``, ``max_score`` and ``eaten`` (dishes eaten so far, the partial progress).

Tasks: the fixed manifest (manifest.py) or any ``Task(env="textworld_cooking_sync", seed=s, meta={"family": f,
"difficulty": d})``; ``meta["state"]`` (a WorldState without agents) plays a hand-built world instead
(twcheck.py builds them from TextWorld games). ``meta["shared_inventory"]`` or the constructor's
``shared_inventory`` picks the inventory reading (world.py); the default is one shared inventory.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar

from envs.base import Env, Obs, Task, step_info
from envs.textworld_cooking_sync import manifest
from envs.textworld_cooking_sync.generate import FAMILIES, LEVELS, generate
from envs.textworld_cooking_sync.planner import Blocked, Unsolvable, next_command, plan
from envs.textworld_cooking_sync.state import WorldState
from envs.textworld_cooking_sync.text import inventory_text, room_text
from envs.textworld_cooking_sync.world import StepResult, World

ROOT = "root"


def world_state(task: Task, shared_inventory: bool | None = None) -> WorldState:
    """The fresh world of a task (module docstring)."""
    meta = task.meta
    shared = meta.get("shared_inventory", True) if shared_inventory is None else shared_inventory
    if "state" in meta:
        state = copy.deepcopy(meta["state"])
        if not isinstance(state, WorldState):
            raise TypeError(f"task {task.task_id!r}: meta['state'] must be a WorldState, got {type(state).__name__}")
        state.shared_inventory = shared
        return state
    missing = [k for k in ("family", "difficulty") if k not in meta]
    if missing:
        raise ValueError(
            f"task {task.task_id!r} has no {missing} in meta: give meta={{'family': one of {FAMILIES}, "
            f"'difficulty': one of {tuple(LEVELS)}}} (or meta['state'], a hand-built WorldState)"
        )
    return generate(meta["family"], meta["difficulty"], task.seed, shared_inventory=shared)


def _obs(world: World, agent: str, text: str, instruction: str, admissible: bool) -> Obs:
    def read(s: WorldState) -> tuple[str, tuple[str, ...] | None]:
        view = f"{text}\n\n{room_text(s, s.agents[agent].room, agent)}\n\n{inventory_text(s, agent)}"
        return view, world.admissible(agent) if admissible else None

    anchor, commands = world.read(read)
    return Obs(text=text, anchor=anchor, admissible=commands, instruction=instruction)


def _info(world: World, r: StepResult) -> dict[str, Any]:
    eaten = world.read(lambda s: sum(d.status == "eaten" for d in s.dishes))
    return step_info(
        won=r.won, truncated=False, valid=r.valid, lost=r.lost, score=r.score, max_score=r.max_score, eaten=eaten
    )


@dataclasses.dataclass(frozen=True)
class SyncSnapshot:
    """An exact snapshot of the env: the whole shared world (every agent), the root's step count and last text."""

    task: Task
    state: WorldState
    steps: int
    done: bool
    max_steps: int
    text: str


class AgentHandle:
    """One agent on a shared world: the SERA runtime's view of a child (or of the root)."""

    def __init__(self, world: World, agent: str, instruction: str, *, admissible: bool = True):
        self.world, self.agent, self.instruction, self.admissible = world, agent, instruction, admissible

    def step(self, command: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        """The agent's command; ``done`` when the world is over or the agent's budget is spent."""
        with self.world.locked():  # the observation is of the state this command produced
            r = self.world.step(self.agent, command)
            info = _info(self.world, r)
            info["truncated"] = r.truncated
            obs = _obs(self.world, self.agent, r.text, self.instruction, self.admissible)
        return obs, r.reward, r.done, info

    def observe(self) -> Obs:
        """The agent's current view (its room), without acting."""
        return _obs(self.world, self.agent, self.world.observe(self.agent), self.instruction, self.admissible)

    def oracle(self, dishes: Iterable[str] | None = None, *, release: bool | None = None) -> str:
        """The planner's next command for this agent towards ``dishes`` (default: all); ``look`` to wait."""
        rel = self.world.read(lambda s: not s.shared_inventory) if release is None else release
        return self.world.read(lambda s: next_command(s, self.agent, dishes, release=rel))

    @property
    def history(self) -> list[tuple[str, str]]:
        return self.world.read(lambda s: list(s.agents[self.agent].history))

    @property
    def steps_left(self) -> int | None:
        def left(s: WorldState) -> int | None:
            a = s.agents[self.agent]
            return None if a.max_steps is None else a.max_steps - a.steps

        return self.world.read(left)


class TextWorldCookingSyncEnv(Env):
    """The root agent's env over a shared multi-agent CookingWorld (module docstring)."""

    name: ClassVar[str] = "textworld_cooking_sync"
    splits: ClassVar[tuple[str, ...]] = tuple(manifest.SPLIT_SIZES)

    def __init__(self, *, max_steps: int | None = None, admissible: bool = True, shared_inventory: bool | None = None):
        super().__init__(max_steps or LEVELS["extreme"].max_steps)
        self._max_steps_override = max_steps
        self.admissible = admissible
        self.shared_inventory = shared_inventory
        self.world: World | None = None
        self.text = ""
        self._plan: list[str] = []
        self._plan_at = -1  # the world log length at which self._plan is valid

    # -- the protocol ----------------------------------------------------------------------------------------------
    def _reset(self, task: Task) -> Obs:
        difficulty = task.meta.get("difficulty")
        default = task.meta.get("max_steps") or (LEVELS[difficulty].max_steps if difficulty in LEVELS else 100)
        self.max_steps = self._max_steps_override or int(default)
        self.world = World(world_state(task, self.shared_inventory))
        self.world.add_agent(ROOT)
        self.text = self.world.read(lambda s: s.objective) + "\n\n" + self.world.observe(ROOT)
        self._plan, self._plan_at = [], -1
        return self._obs()

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        with self.world.locked():  # the observation is of the state this command produced
            log_before = self._log_len()
            r = self.world.step(ROOT, action)
            self.text = r.text
            if self._plan and self._plan_at == log_before and action == self._plan[0]:
                self._plan, self._plan_at = self._plan[1:], log_before + 1
            else:
                self._plan, self._plan_at = [], -1
            return self._obs(), r.reward, r.won or r.lost, _info(self.world, r)

    def snapshot(self) -> SyncSnapshot:
        if self.task is None or self.world is None:
            raise RuntimeError(f"{self.name}: snapshot() before reset()")
        return SyncSnapshot(self.task, self.world.snapshot(), self.steps, self.done, self.max_steps, self.text)

    def restore(self, snapshot: SyncSnapshot) -> Obs:
        if not isinstance(snapshot, SyncSnapshot) or snapshot.task.env != self.name:
            raise ValueError(f"restore() takes a {self.name} SyncSnapshot, got {type(snapshot).__name__}")
        self.task, self.steps, self.done = snapshot.task, snapshot.steps, snapshot.done
        self.max_steps, self.text = snapshot.max_steps, snapshot.text
        self.world = World(copy.deepcopy(snapshot.state))
        self._plan, self._plan_at = [], -1
        return self._obs()

    def oracle(self) -> str:
        """The single-agent planner's next command for the root (planner.py); ``look`` when nothing is left to do
        or the dishes can no longer be finished. The plan is cached while the root follows it and no other agent
        acts; with per-agent inventories and other agents present it puts down what it does not need (``release``)."""
        if self.world is None:
            raise RuntimeError(f"{self.name}: oracle() before reset()")
        if not self._plan or self._plan_at != self._log_len():
            try:
                self._plan = self.world.read(
                    lambda s: plan(s, ROOT, release=not s.shared_inventory and len(s.agents) > 1)
                )
            except (Unsolvable, Blocked):
                self._plan = []
            self._plan_at = self._log_len()
        return self._plan[0] if self._plan else "look"

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        return manifest.tasks(split)

    # -- more agents -------------------------------------------------------------------------------------------------
    def spawn(
        self, agent: str, *, max_steps: int | None = 20, parent: str = ROOT, instruction: str | None = None
    ) -> AgentHandle:
        """A new agent (a SERA child) in its parent's room, with its own step budget, on this env's world."""
        if self.world is None:
            raise RuntimeError(f"{self.name}: spawn() before reset()")
        self.world.add_agent(agent, max_steps=max_steps, parent=parent)
        text = instruction if instruction is not None else self.world.read(lambda s: s.objective)
        return AgentHandle(self.world, agent, text, admissible=self.admissible)

    def handle(self, agent: str = ROOT) -> AgentHandle:
        """A handle on an existing agent (the root included) of this env's world."""
        if self.world is None or agent not in self.world.agents:
            raise KeyError(f"no agent {agent!r}; agents are {self.world.agents if self.world else []}")
        return AgentHandle(self.world, agent, self.world.read(lambda s: s.objective), admissible=self.admissible)

    # -- helpers -------------------------------------------------------------------------------------------------------
    def _log_len(self) -> int:
        return self.world.read(lambda s: len(s.log))

    def _obs(self) -> Obs:
        return _obs(self.world, ROOT, self.text, self.world.read(lambda s: s.objective), self.admissible)

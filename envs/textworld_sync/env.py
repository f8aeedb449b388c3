"""The released TextWorld-Sync benchmark behind the one Env protocol, plus agent handles for the recursive runtime.

``TextWorldSyncEnv`` is an :class:`envs.base.Env` for the root agent (``"root"``): ``reset(task)`` builds the task's
world (state.py) with the root in the kitchen; ``step`` is what the authors' runtime does with a root command (an
inventory lookup without a world step for ``inventory`` / ``view inventory`` / ``check inventory``, else one engine
step: world.py). The recursive runtime adds agents with :meth:`TextWorldSyncEnv.spawn` (or ``handle().spawn``),
each an :class:`AgentHandle` with its own location and history on the same :class:`~envs.textworld_sync.world.World`;
all steps of all agents are serialised by the world's lock. :meth:`AgentHandle.fork` clones the world for a
counterfactual branch (the authors' ``fork_counterfactual``: the new agent starts where the forking agent stands).

Observations (``Obs``):

- ``text``: the engine's observation (``You are in the kitchen.`` / visible objects / gate / tool cooldowns /
  prepared counter / dish progress / shared steps remaining), or the inventory lookup's text;
- ``admissible``: the engine's valid actions (its ``validActions``), or None with ``admissible=False``;
- ``anchor``: the observation without its ``Shared steps remaining`` line (a step counter), followed by
  ``Inventory: ...`` (the shared inventory, which the observation does not show): equal anchors, equal visible
  state;
- ``instruction``: the task's description (the root's goal) or a child's goal.

Budgets. The world's shared budget ends the episode for every agent (``done``; ``info["truncated"]`` when the task
was not completed): the task's own ``parallelism.shared_environment_max_steps`` under ``protocol="evaluation"`` (the
authors' evaluator), 100 under ``protocol="training"`` (their training runtime: it never passes the task's budget),
or ``budget=N``. ``max_steps`` caps the root's own turns (default 200, the authors' single-agent baseline's root
cap); lookups count as turns, not as world steps. Per-node turn budgets (20 in SERA) belong to the tree runtime.

``info``: ``won`` (the root check: every ingredient collected and processed exactly as required, every dish
prepared and eaten), ``valid`` (accepted by the engine), ``truncated``, ``score`` (the engine's, 1.0 or 0.0),
``completed_dishes`` / ``total_dishes`` (the partial progress), ``remaining_shared_steps``, ``task_failure``,
``lookup``. The reward is the engine's: 1.0 on the completing step.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Iterable
from typing import Any, ClassVar

from envs.base import Env, Obs, Task, step_info
from envs.textworld_sync import planner, tasks
from envs.textworld_sync.state import ROOT, WorldState, build
from envs.textworld_sync.world import StepResult, World

TRAINING_BUDGET = 100  # the authors' training runtime's shared budget (create_textworld_env's default)
PROTOCOLS = ("evaluation", "training")
_STEPS_LINE = "Shared steps remaining:"


def anchor_text(observation: str, inventory: str) -> str:
    """The anchor of an engine observation (module docstring)."""
    lines = [line for line in observation.split("\n") if not line.startswith(_STEPS_LINE)]
    return "\n".join(lines) + f"\nInventory: {inventory}"


def _obs(world: World, agent: str, text: str, instruction: str, admissible: bool,
         seen: tuple[str, dict[str, Any]] | None = None) -> Obs:
    """The Obs of ``agent`` showing ``text``; ``seen``: its observation and infos when the caller has them."""
    observation, info = seen or world.observe(agent)
    commands = tuple(info["validActions"]) if admissible else None
    return Obs(text=text, anchor=anchor_text(observation, info["inventory"]), admissible=commands,
               instruction=instruction)


def _info(r: StepResult) -> dict[str, Any]:
    i = r.infos
    return step_info(won=bool(i["tasksuccess"]), truncated=bool(r.done and not i["tasksuccess"]
                                                                    and not i["taskfailure"]),
                     valid=r.accepted, score=float(i["score"]), completed_dishes=i["completed_dishes"],
                     total_dishes=i["total_dishes"], remaining_shared_steps=i["remaining_shared_steps"],
                     task_failure=bool(i["taskfailure"]), lookup=r.lookup)


class AgentHandle:
    """One agent on a shared world: the recursive runtime's view of a node (the root included)."""

    _ids = itertools.count()

    def __init__(self, world: World, agent: str, instruction: str, *, admissible: bool = True,
                 style: str = "evaluation"):
        self.world, self.agent, self.instruction = world, agent, instruction
        self.admissible, self.style = admissible, style

    def step(self, command: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        """The agent's command, atomically; ``done`` once the world is done (success, failure, budget spent)."""
        with self.world.locked():  # the observation is of the state this command produced
            r = self.world.act(self.agent, command, style=self.style)
            seen = None if r.lookup else (r.observation, r.infos)
            obs = _obs(self.world, self.agent, r.observation, self.instruction, self.admissible, seen)
            return obs, r.reward, r.done, _info(r)

    def observe(self) -> Obs:
        """The agent's current view, without acting."""
        with self.world.locked():
            text, _ = self.world.observe(self.agent)
            return _obs(self.world, self.agent, text, self.instruction, self.admissible)

    def oracle(self, dishes: Iterable[str] | None = None, ingredients: Iterable[str] | None = None) -> str:
        """The planner's next command for this agent towards a subtask (default: the whole task)."""
        return self.world.read(lambda s: planner.next_command(s, self.agent, dishes, ingredients))

    def spawn(self, agent: str | None = None, instruction: str = "", *, location: str | None = None) -> AgentHandle:
        """A new agent on the same world (a child), where the root stands unless ``location`` is given."""
        agent = agent or f"{self.agent}/subagent-{next(self._ids)}"
        self.world.add_agent(agent, location=location)
        return AgentHandle(self.world, agent, instruction, admissible=self.admissible, style=self.style)

    def fork(self, agent: str | None = None, instruction: str | None = None) -> AgentHandle:
        """A new agent on a *clone* of the world (an independent counterfactual branch), where this agent stands."""
        world = self.world.clone()
        agent = agent or f"{self.agent}/cf-{next(self._ids)}"
        world.add_agent(agent, location=self.location)
        return AgentHandle(world, agent, self.instruction if instruction is None else instruction,
                           admissible=self.admissible, style=self.style)

    @property
    def location(self) -> str:
        return self.world.read(lambda s: s.locations[self.agent])

    @property
    def history(self) -> list[tuple[str, str]]:
        """The agent's own ``(command, observation)`` pairs, lookups included."""
        return self.world.read(lambda s: list(s.histories[self.agent]))


@dataclasses.dataclass(frozen=True)
class SyncSnapshot:
    """An exact snapshot of the env: the whole shared world (every agent), the root's turn count and last text."""

    task: Task
    state: WorldState
    steps: int
    done: bool
    max_steps: int
    text: str


class TextWorldSyncEnv(Env):
    """The root agent's env over the released TextWorld-Sync world (module docstring)."""

    name: ClassVar[str] = "textworld_sync"
    splits: ClassVar[tuple[str, ...]] = tuple(tasks.FILES)

    def __init__(self, *, max_steps: int = 200, protocol: str = "evaluation", budget: int | None = None,
                 admissible: bool = True):
        super().__init__(max_steps)
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; one of {PROTOCOLS}")
        if budget is not None and budget <= 0:
            raise ValueError(f"budget must be positive or None, got {budget}")
        self.protocol, self.budget, self.admissible = protocol, budget, admissible
        self.world: World | None = None
        self.text = ""

    def shared_budget(self, task: Task) -> int:
        """The world's shared step budget for ``task`` (module docstring)."""
        if self.budget is not None:
            return self.budget
        return int(task.meta.get("budget", TRAINING_BUDGET)) if self.protocol == "evaluation" else TRAINING_BUDGET

    # -- the protocol ----------------------------------------------------------------------------------------------
    def _reset(self, task: Task) -> Obs:
        self.world = World(build(task.meta, self.shared_budget(task)))
        self.world.add_agent(ROOT)
        self.text, _ = self.world.observe(ROOT)
        return self._obs()

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        obs, reward, done, info = self.handle().step(action)
        self.text = obs.text
        return obs, reward, info["won"] or info["task_failure"], info

    def step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        """:meth:`Env.step`, and the shared budget: a spent budget ends the episode as a truncation."""
        obs, reward, done, info = super().step(action)
        if not done and self.world.done:
            info["truncated"], self.done, done = True, True, True
        return obs, reward, done, info

    def snapshot(self) -> SyncSnapshot:
        if self.task is None or self.world is None:
            raise RuntimeError(f"{self.name}: snapshot() before reset()")
        return SyncSnapshot(self.task, self.world.snapshot(), self.steps, self.done, self.max_steps, self.text)

    def restore(self, snapshot: SyncSnapshot) -> Obs:
        if not isinstance(snapshot, SyncSnapshot) or snapshot.task.env != self.name:
            raise ValueError(f"restore() takes a {self.name} SyncSnapshot, got {type(snapshot).__name__}")
        self.task, self.steps, self.done = snapshot.task, snapshot.steps, snapshot.done
        self.max_steps, self.text = snapshot.max_steps, snapshot.text
        self.world = World(copy.deepcopy(snapshot.state))  # the snapshot stays untouched
        return self._obs()

    def oracle(self) -> str:
        """The planner's next command for the root towards the whole task (planner.py)."""
        if self.world is None:
            raise RuntimeError(f"{self.name}: oracle() before reset()")
        return self.handle().oracle()

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        return tasks.tasks(split)

    # -- more agents -------------------------------------------------------------------------------------------------
    def handle(self, agent: str = ROOT) -> AgentHandle:
        """A handle on an existing agent (the root by default) of this env's world."""
        if self.world is None or agent not in self.world.agents:
            raise KeyError(f"no agent {agent!r}; agents are {self.world.agents if self.world else []}")
        instruction = self.task.meta.get("description", "") if agent == ROOT else ""
        return AgentHandle(self.world, agent, instruction, admissible=self.admissible, style=self.style)

    def spawn(self, agent: str | None = None, instruction: str = "", *, location: str | None = None) -> AgentHandle:
        """A new agent (a child) on this env's world, where the root stands unless ``location`` is given."""
        if self.world is None:
            raise RuntimeError(f"{self.name}: spawn() before reset()")
        return self.handle().spawn(agent, instruction, location=location)

    @property
    def style(self) -> str:
        """The inventory lookup's wording (``world.LOOKUP_TEXTS``): the evaluator's or the training runtime's."""
        return self.protocol

    def _obs(self) -> Obs:
        return _obs(self.world, ROOT, self.text, self.task.meta.get("description", ""), self.admissible)

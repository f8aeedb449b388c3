"""A small deterministic chain environment for the pool tests (plain Python, picklable, no data).

The agent walks along a chain of ``length = 3 + seed % 4`` cells from cell 0; reaching the last cell wins (reward
1). ``"back"`` moves one cell left (reward -0.1 at cell 0: a wall), ``"wait"`` stays. Test hooks: ``"crash"`` kills
the process hosting the env (``os._exit(1)``), ``"raise"`` raises inside ``step``, ``"hang"`` sleeps for a minute;
a task with ``meta={"crash": True}`` kills the process on reset (``os._exit(3)``), one with ``meta={"hang": True}``
hangs (a minute) in ``oracle`` and ``restore``. Any other action is invalid. :class:`HangingOracleSokoban` is Sokoban
whose oracle hangs in some tasks (SERO's oracle timeout).
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from envs.base import Env, Obs, Task, step_info
from envs.sokoban.env import SokobanEnv

ACTIONS = ("forward", "back", "wait")


class ChainEnv(Env):
    name: ClassVar[str] = "toy"

    def __init__(self, max_steps: int = 10):
        super().__init__(max_steps)
        self.pos = 0
        self.length = 0

    def _obs(self, note: str = "") -> Obs:
        anchor = f"cell {self.pos} of {self.length}"
        text = f"{note}You are in {anchor} (step {self.steps})."
        return Obs(text=text, anchor=anchor, admissible=ACTIONS, instruction=f"Reach cell {self.length - 1}.")

    def _reset(self, task: Task) -> Obs:
        if task.meta.get("crash"):
            os._exit(3)
        self.pos, self.length = 0, 3 + task.seed % 4
        return self._obs()

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        if action == "crash":
            os._exit(1)
        if action == "raise":
            raise RuntimeError("toy env bug")
        if action == "hang":
            time.sleep(60)
        if action not in ACTIONS:
            return self._obs("Nothing happens. "), 0.0, False, step_info(won=False, truncated=False, valid=False)
        reward = 0.0
        if action == "forward":
            self.pos += 1
        elif action == "back":
            reward = -0.1 if self.pos == 0 else 0.0
            self.pos = max(0, self.pos - 1)
        won = self.pos == self.length - 1
        return self._obs(), 1.0 if won else reward, won, step_info(won=won, truncated=False, valid=True, pos=self.pos)

    def snapshot(self) -> Any:
        return self.task, self.pos, self.length, self.steps, self.done

    def restore(self, snapshot: Any) -> Obs:
        if snapshot[0].meta.get("hang"):
            time.sleep(60)
        self.task, self.pos, self.length, self.steps, self.done = snapshot
        return self._obs()

    def oracle(self) -> str:
        if self.task.meta.get("hang"):
            time.sleep(60)
        return "forward"

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        return [Task(env=cls.name, task_id=f"chain-{i}", split=split, seed=i) for i in range(8)]


class HangingOracleSokoban(SokobanEnv):
    """Sokoban whose oracle hangs (a minute) in the tasks named in ``hang``, as a planner without a time limit can."""

    def __init__(self, hang: tuple[str, ...] = (), **kwargs: Any):
        super().__init__(**kwargs)
        self.hang = frozenset(hang)

    def oracle(self) -> str:
        if self.task.task_id in self.hang:
            time.sleep(60)
        return super().oracle()

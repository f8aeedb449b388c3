"""Two environments a trainer must learn from scratch (tests/train/test_learns.py): plain Python, the `envs.base`
protocol, deterministic given the task, no data.

- :class:`CueBandit` — a contextual bandit. The observation names which of the four :data:`COLOURS` pays; one
  action ends the episode, won (reward 1) iff it was the named one. A uniform policy wins 1/4.
- :class:`CueChain` — a chain of :data:`CHAIN_LENGTH` steps with a sparse terminal reward. At every step two
  colours are admissible (the paying one and a decoy, in an order drawn from the task's seed) and the observation
  names the paying one; the right one moves to the next step, the wrong one ends the episode as a failure (a
  terminal state, reward 0); the last right action wins (reward 1, the only reward). A uniform policy wins
  ``2 ** -CHAIN_LENGTH``. Every rollout of a group sees the same observations while it survives, so the step-level
  methods (GiGPO, HGPO, GraphGPO, CRBC) find shared anchors at every step.

Both show the observation alone in the prompt (:data:`BANDIT_TEMPLATE`, :data:`CHAIN_TEMPLATE`: a one-line system
message, no history; the constrained decoder gives the reply format and the admissible actions), and replies are
scored by :func:`agentjax.agents.project_action`. :func:`corpus` lists every text they show, for a small
tokenizer (agentjax/models/word_tokenizer.py).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, ClassVar

from agentjax.agents.prompts import PromptTemplate
from envs.base import Env, Obs, Task, step_info

COLOURS = ("red", "green", "blue", "gold")
CHAIN_LENGTH = 3
SPLITS = {"train": 0, "eval": 10_000}  # seed offset of each split; the splits share no task
TASKS_PER_SPLIT = 64


def _tasks(env: str, split: str) -> list[Task]:
    if split not in SPLITS:
        raise ValueError(f"{env}: unknown split {split!r}; choose one of {sorted(SPLITS)}")
    return [Task(env=env, task_id=f"{env}-{split}-{i}", split=split, seed=SPLITS[split] + i)
            for i in range(TASKS_PER_SPLIT)]


class CueBandit(Env):
    """One pull: the observation names the paying colour (module docstring). An action that is not a colour is
    invalid and, the step limit being 1, ends the episode as truncated."""

    name: ClassVar[str] = "cue_bandit"

    def __init__(self, max_steps: int = 1):
        super().__init__(max_steps)
        self.paying = ""

    def _obs(self) -> Obs:
        text = f"The paying action is {self.paying}."
        return Obs(text=text, anchor=text, admissible=COLOURS, instruction="Choose the paying action.")

    def _reset(self, task: Task) -> Obs:
        self.paying = random.Random(task.seed).choice(COLOURS)
        return self._obs()

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        if action not in COLOURS:
            return self._obs(), 0.0, False, step_info(won=False, truncated=False, valid=False)
        won = action == self.paying
        return self._obs(), float(won), True, step_info(won=won, truncated=False, valid=True)

    def snapshot(self) -> Any:
        return self.task, self.paying, self.steps, self.done

    def restore(self, snapshot: Any) -> Obs:
        self.task, self.paying, self.steps, self.done = snapshot
        return self._obs()

    def oracle(self) -> str:
        return self.paying

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        return _tasks(cls.name, split)


class CueChain(Env):
    """:data:`CHAIN_LENGTH` steps, each a choice between the paying colour it names and a decoy (module
    docstring). An action that is neither leaves the state as it is (invalid)."""

    name: ClassVar[str] = "cue_chain"

    def __init__(self, max_steps: int = 2 * CHAIN_LENGTH):
        super().__init__(max_steps)
        self.pos = 0
        self.choices: tuple[tuple[str, tuple[str, str]], ...] = ()  # per step: (paying, admissible pair)

    def _obs(self, note: str = "") -> Obs:
        if self.pos >= CHAIN_LENGTH:  # after the last step (pos = CHAIN_LENGTH: won) or a wrong one: no choice left
            text = "The chain is won." if self.pos == CHAIN_LENGTH else "The chain is lost."
            return Obs(text=text, anchor=text, admissible=(), instruction="Follow the chain.")
        paying, pair = self.choices[self.pos]
        anchor = f"Step {self.pos + 1} of {CHAIN_LENGTH}. The paying action is {paying}."
        return Obs(text=note + anchor, anchor=anchor, admissible=pair, instruction="Follow the chain.")

    def _reset(self, task: Task) -> Obs:
        rng = random.Random(task.seed)
        choices = []
        for _ in range(CHAIN_LENGTH):
            paying, decoy = rng.sample(COLOURS, 2)
            choices.append((paying, (paying, decoy) if rng.random() < 0.5 else (decoy, paying)))
        self.pos, self.choices = 0, tuple(choices)
        return self._obs()

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        paying, pair = self.choices[self.pos]
        if action not in pair:
            return self._obs("Nothing happens. "), 0.0, False, step_info(won=False, truncated=False, valid=False)
        if action != paying:
            self.pos = CHAIN_LENGTH + 1
            return self._obs(), 0.0, True, step_info(won=False, truncated=False, valid=True)
        self.pos += 1
        won = self.pos == CHAIN_LENGTH
        return self._obs(), float(won), won, step_info(won=won, truncated=False, valid=True)

    def snapshot(self) -> Any:
        return self.task, self.pos, self.choices, self.steps, self.done

    def restore(self, snapshot: Any) -> Obs:
        self.task, self.pos, self.choices, self.steps, self.done = snapshot
        return self._obs()

    def oracle(self) -> str:
        return self.choices[self.pos][0]

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        return _tasks(cls.name, split)


# The prompt is the observation alone: the reply format and the admissible actions are the constrained decoder's.
BANDIT_TEMPLATE = PromptTemplate(
    name=CueBandit.name,
    first_turn="{current_observation}",
    with_history="{current_observation}",
    action_hint="",
    system="Act on the cue.",
)
CHAIN_TEMPLATE = dataclasses.replace(BANDIT_TEMPLATE, name=CueChain.name)


def corpus() -> list[str]:
    """Every text these envs, their templates and the constrained replies can show (a tokenizer's corpus): the
    observations of every task of both splits along the paying path and after each possible step from it."""
    texts = [BANDIT_TEMPLATE.system, *(f"<action>{colour}</action>" for colour in COLOURS)]
    for env in (CueBandit(), CueChain()):
        for split in SPLITS:
            for task in env.tasks(split):
                obs, done = env.reset(task), False
                while not done:
                    texts.append(obs.text)
                    for action in (*COLOURS, "dance"):
                        saved = env.snapshot()
                        texts.append(env.step(action)[0].text)
                        env.restore(saved)
                    obs, _, done, _ = env.step(env.oracle())
                texts.append(obs.text)
    return sorted(set(texts))

"""TextWorld CookingWorld (Côté et al. 2018; the First TextWorld Problems games) on textworld's own engine.

Games: ``tw-make tw-cooking`` games from the fixed manifest (:mod:`envs.textworld.tasks`), generated on first use
into the cache folder (:mod:`envs.textworld.generate`; ``$TEXTWORLD_GAMES``). Each is played the way ``textworld``
plays any game it generated: ``textworld.start(game.z8, request_infos)`` runs the ``.z8`` story file in the
Z-machine interpreter of ``jericho`` (``JerichoEnv``) under textworld's ``TWInform7`` wrappers, which track the game
state from the ``.json`` next to it (admissible commands, the winning policy, won / lost, the score). One engine per
environment object; a new game is ``load``-ed into it. Every game is checked against the manifest's SHA-256 when it is
loaded, so a stale or foreign cache cannot slip in.

- ``Obs.text`` and ``Obs.anchor``: the engine's feedback, cleaned as CookingWorld agents clean it (GATA's ``preproc``
  and the FTWP starter kits drop the ASCII-art banner): the banner of the reset (the lines up to the last drawn with
  ``$``), the interpreter's prompt line at the end (``>`` followed by the status bar, the room and ``score/moves``:
  a step counter, so it must not reach the anchor), and the ``Would you like to RESTART, RESTORE ...`` question
  after the game ends are removed; each line is stripped and runs of blank lines become one. So a reset shows the
  objective and the first room, ``"You are hungry! Let's cook a delicious meal. ... enjoy your meal!\n\n-= Bedroom
  =-\nYou have stumbled into ..."``, and a step its feedback, ``"You take the red potato from the counter.\n\nYour
  score has just gone up by one point."``.
- ``Obs.admissible``: textworld's ``admissible_commands`` (sorted; ``look``, ``inventory`` and ``examine ...``
  included): computed from the game logic, so every command that changes the state is among them.
- ``Obs.instruction``: the game's objective, ``"You are hungry! Let's cook a delicious meal. Check the cookbook in
  the kitchen for the recipe. Once done, enjoy your meal!"`` (the recipe itself is read in game: ``examine
  cookbook``).
- ``reward``: 10 on the winning step (``eat meal`` with every ingredient prepared as the recipe says), else 0, as
  ALFWorld (METHODS.md: 10 x success at the last step). ``info`` adds the game's ``score`` / ``max_score``
  (one point a recipe sub-goal, FTWP's reward) and ``lost``, for score-based shaping.
- Termination: ``won`` or ``lost`` from the engine (its ``*** The End ***`` / ``*** You lost! ***``). A game is lost
  for good by burning an ingredient (cooking it twice), cooking or cutting it the wrong way, or eating an
  ingredient: ``done`` with ``won = False`` and ``info["lost"] = True``.

Invalid commands. A command is normalised as the agent layer does (stripped, whitespace runs collapsed to one space,
lower-cased: the interpreter's parser is case-insensitive); it is *valid* when it is then an admissible command, and
only valid commands reach the engine. Anything else is answered ``"Invalid command."`` (the text of textworld's own
state-machine backend, ``textworld.envs.tw``) and changes nothing but the step count. This departs from playing the
``.z8`` with free text (the parser would also take ``x cookbook``, ``n``, ``take all``, ``get potato``), on purpose:
some of those change the world under other names, and textworld's state tracker (admissible commands, winning
policy) only follows the actions it recognises, so free text could desynchronise it; and the base protocol wants an
invalid action to change nothing.

Snapshots. A snapshot is the task and the commands sent since the reset with the observation, admissible commands and
score they led to (picklable); :meth:`restore` resets the game, replays the commands and raises
:class:`ReplayMismatch` unless it reaches the recorded observation, admissible commands and score (the games are
deterministic). Not jericho's save states, although textworld's interpreter (jericho 3.3.1) has them
(``FrotzEnv.get_state`` / ``set_state``, ~10 us): they hold the Z-machine only, while the admissible commands, the
winning policy and won / lost come from textworld's Python-side ``GameProgression``, which they do not hold.
textworld's ``env.copy()`` copies both, but takes 0.3-0.6 s on levels 4-6 (as long as replaying 20-45 commands) and
cannot leave the process. A replay costs the reset (25-200 ms) plus one step per command, and works from a pickled
snapshot in any process (SERO's isolated copies).

Oracle (training only). :meth:`plan`: the rest of the game's walkthrough (``tw-cooking``'s own, stored in the game:
``inventory``, go to the kitchen, ``examine cookbook``, fetch, cook, cut, ``prepare meal``, ``eat meal``) while the
episode follows it, skipping the walkthrough's commands that are not admissible when their turn comes (it re-opens
doors and containers that are open: no-ops the interpreter refuses); from any other state textworld's
``policy_commands``, the remaining winning policy of the game's quests from the current state (it skips
``inventory`` / ``examine cookbook``). :meth:`oracle` returns the plan's first command, checked against the
admissible commands (:class:`OracleError` otherwise, or when there is no plan). A lost game has none, but it has
ended. ``experiments/bench/env_textworld.py`` checks, on all 480 games: the walkthrough replayed command for command,
the oracle from the reset, and the oracle after 1-20 random admissible commands (unless they lost the game) all win.
``oracle=False`` asks textworld not to track the quests (no ``policy_commands``): steps are faster (level 6: ~6 ms
instead of ~16 ms; levels 1-5: 10-40% faster), and the oracle then only follows the walkthrough.

Speed: textworld recomputes the winning policy after every state-changing command, so level 6 steps are the
slowest; the wrapper's own work (cleaning the text, the admissible lookup) is small against the engine's
(``experiments/bench/env_textworld.py`` measures both in one run; ``experiments/bench/README.md``).

Deviations from playing ``tw-make`` games through ``textworld.gym`` as FTWP agents did: the text is cleaned as above;
invalid commands do not reach the interpreter; generation is pinned so that games are byte-identical
(``generate.py``); no ``--drop`` games. The step limit is 100 by default, 1.7 times the longest walkthrough of the
manifest (60 commands, level 6).
"""

from __future__ import annotations

import dataclasses
import pathlib
import warnings
from typing import Any, ClassVar

from envs.base import Env, Obs, Task, step_info
from envs.textworld.tasks import ENV_NAME, split_tasks, task_entry, verify_game

WIN_REWARD = 10.0
INVALID_TEXT = "Invalid command."
_RESTART_QUESTION = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"


class ReplayMismatch(RuntimeError):
    """Replaying a snapshot's commands did not reproduce its observation, admissible commands or score."""


class OracleError(RuntimeError):
    """The expert has no command, or its command is not admissible."""


@dataclasses.dataclass(frozen=True)
class TextWorldSnapshot:
    """Reset ``task`` and replay ``actions`` (every command sent, invalid ones included); the result must show
    ``text`` with ``admissible`` and ``score``."""

    task: Task
    actions: tuple[str, ...]  # the commands since reset, as sent; len == steps
    text: str  # the observation after the last command (the reset's when there is none)
    admissible: tuple[str, ...]
    score: int
    done: bool
    max_steps: int


def normalise(command: str) -> str:
    """Stripped, whitespace runs collapsed to one space, lower-cased (the agent layer's projection does the same)."""
    return " ".join(command.lower().split())


def clean(feedback: str, *, reset: bool = False) -> str:
    """The engine's feedback without banner (``reset``), prompt / status line and end-of-game question (module
    docstring); lines stripped, runs of blank lines collapsed."""
    lines = feedback.split("\n")
    if reset:
        art = [i for i, line in enumerate(lines) if "$$$$" in line]
        lines = lines[art[-1] + 1 :] if art else lines
    while lines and not lines[-1].strip():
        lines.pop()
    if lines and lines[-1].startswith(">"):  # the prompt, then the status bar: "-= Kitchen =-2/5" (score/moves)
        lines.pop()
    out: list[str] = []
    for line in (line.strip() for line in lines):
        if line == _RESTART_QUESTION or (not line and (not out or not out[-1])):
            continue
        out.append(line)
    return "\n".join(out).strip()


def _request_infos(policy: bool = True) -> Any:
    """What the engine reports; ``policy``: textworld tracks the quests and reports ``policy_commands``."""
    import textworld

    return textworld.EnvInfos(admissible_commands=True, policy_commands=policy, won=True, lost=True, score=True,
                              max_score=True, objective=True, extras=["walkthrough"])


class TextWorldCookingEnv(Env):
    """CookingWorld games of the manifest (module docstring); tasks from ``tasks(split)``, games in the cache."""

    name: ClassVar[str] = ENV_NAME
    default_max_steps: ClassVar[int] = 100

    def __init__(self, *, max_steps: int = default_max_steps, root: str | None = None, oracle: bool = True):
        super().__init__(max_steps)
        self.root = root  # the games' cache folder; None: $TEXTWORLD_GAMES or ~/.cache/agentjax/textworld
        self.track_policy = oracle  # False: no policy off the walkthrough, faster steps (module docstring)
        self._engine: Any = None
        self._gamefile: str | None = None
        self._state: Any = None  # textworld's GameState of the last command
        self._actions: list[str] = []
        self._text = ""
        self._admissible: tuple[str, ...] = ()
        self._spelling: dict[str, str] = {}  # normalise(command) -> the admissible command
        self._instruction = ""
        self._walkthrough: tuple[str, ...] = ()
        self._walk_pos: int | None = 0  # the walkthrough's next command, while the episode follows it; else None

    # -- the protocol ----------------------------------------------------------------------------------------------
    def _reset(self, task: Task) -> Obs:
        gamefile = self.gamefile(task)
        if gamefile != self._gamefile:
            import jericho  # the engine loads with the first game: importing envs stays fast
            import textworld

            self._gamefile = None  # a failed load leaves no game behind
            verify_game(task_entry(task), pathlib.Path(gamefile))
            with warnings.catch_warnings():  # jericho has no bindings for TextWorld games (textworld hides this too)
                warnings.simplefilter("ignore", jericho.UnsupportedGameWarning)
                if self._engine is None:
                    self._engine = textworld.start(gamefile, request_infos=_request_infos(self.track_policy))
                else:
                    self._engine.load(gamefile)
            self._gamefile = gamefile
        self._state = self._engine.reset()
        self._actions = []
        self._walk_pos = 0
        self._text = clean(self._state.feedback, reset=True)
        self._set_admissible(self._state["admissible_commands"])
        self._instruction = self._state["objective"]
        self._walkthrough = tuple(self._state["extra.walkthrough"])
        return self._obs()

    def _step(self, action: str) -> tuple[Obs, float, bool, dict[str, Any]]:
        command = self._spelling.get(normalise(action))  # the admissible command, as the game spells it
        valid = command is not None
        head = self._walk_head()
        on_walkthrough = head is not None and head < len(self._walkthrough) and command == self._walkthrough[head]
        self._walk_pos = head + 1 if on_walkthrough else None  # (an invalid command is None: it leaves)
        self._actions.append(action)
        if valid:
            self._state, _, _ = self._engine.step(command)
            self._text = clean(self._state.feedback)
            self._set_admissible(self._state["admissible_commands"])
        else:
            self._text = INVALID_TEXT
        won, lost = bool(self._state["won"]), bool(self._state["lost"])
        info = step_info(won=won, truncated=False, valid=valid, lost=lost, score=int(self._state["score"]),
                         max_score=int(self._state["max_score"]))
        return self._obs(), WIN_REWARD if won else 0.0, won or lost, info

    def snapshot(self) -> TextWorldSnapshot:
        if self.task is None:
            raise RuntimeError(f"{self.name}: snapshot() before reset()")
        return TextWorldSnapshot(self.task, tuple(self._actions), self._text, self._admissible, self.score,
                                 self.done, self.max_steps)

    def restore(self, snapshot: TextWorldSnapshot) -> Obs:
        """Resets the snapshot's game, replays its commands and checks that the result is the recorded one."""
        if snapshot.task.env != self.name:
            raise ValueError(f"snapshot of env {snapshot.task.env!r}, not {self.name!r}")
        self.max_steps = snapshot.max_steps
        self.reset(snapshot.task)
        try:
            for i, action in enumerate(snapshot.actions):
                if self._state["won"] or self._state["lost"]:
                    raise ReplayMismatch(f"{snapshot.task.task_id}: the replay ended the game after {i} of "
                                         f"{len(snapshot.actions)} commands")
                self._step(action)
            if (self._text, self._admissible, self.score) != (snapshot.text, snapshot.admissible, snapshot.score):
                raise ReplayMismatch(
                    f"{snapshot.task.task_id}: replaying {len(snapshot.actions)} commands gave {self._text!r} with "
                    f"{len(self._admissible)} admissible commands and score {self.score}; the snapshot recorded "
                    f"{snapshot.text!r} with {len(snapshot.admissible)} and score {snapshot.score}"
                )
        except BaseException:
            self.done = True  # a failed restore leaves no usable episode: step() asks for a reset
            raise
        self.steps, self.done = len(snapshot.actions), snapshot.done
        return self._obs()

    def oracle(self) -> str:
        """The expert's next command (module docstring); raises :class:`OracleError` when there is none or it is
        not admissible."""
        if self.task is None or self.done:
            raise RuntimeError(f"{self.name}: oracle() needs a running episode")
        plan = self.plan()
        if not plan:
            raise OracleError(f"{self.task.task_id}: textworld has no winning policy at step {self.steps}")
        if plan[0] not in self._admissible:
            raise OracleError(f"{self.task.task_id}: the expert's command {plan[0]!r} at step {self.steps} is not "
                              f"admissible ({len(self._admissible)} admissible commands)")
        return plan[0]

    @classmethod
    def tasks(cls, split: str) -> list[Task]:
        return split_tasks(split)

    # -- helpers shared with tests and benchmarks -----------------------------------------------------------------
    def gamefile(self, task: Task) -> str:
        """The task's ``.z8`` in the cache, generated first if missing (:func:`envs.textworld.generate.ensure_games`:
        a ``PYTHONHASHSEED=0`` worker subprocess, ~5 s for the first game)."""
        from envs.textworld.generate import ensure_games

        return str(ensure_games([task], self.root)[0])

    def plan(self) -> list[str]:
        """The expert's remaining commands: the rest of the walkthrough while the episode has followed it (its
        inadmissible no-ops skipped, :meth:`_walk_head`), else textworld's ``policy_commands`` from the current state
        (empty when there is none)."""
        if self._state is None:
            raise RuntimeError(f"{self.name}: plan() before reset()")
        head = self._walk_head()
        if head is not None:
            return list(self._walkthrough[head:])
        if not self.track_policy:
            raise OracleError(f"{self.name}: this env was built with oracle=False: it has no plan off the walkthrough")
        return list(self._state["policy_commands"] or ())

    def walkthrough(self) -> list[str]:
        """The game's stored winning command list (``tw-cooking``'s walkthrough)."""
        if self._state is None:
            raise RuntimeError(f"{self.name}: walkthrough() before reset()")
        return list(self._walkthrough)

    @property
    def score(self) -> int:
        """The game's score (one point a recipe sub-goal reached)."""
        return int(self._state["score"]) if self._state is not None else 0

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(self._actions)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine, self._gamefile, self._state = None, None, None

    # -- internals -------------------------------------------------------------------------------------------------
    def _walk_head(self) -> int | None:
        """The walkthrough's next command from here, past those that are not admissible now (tw-cooking's
        walkthrough opens a container again that it opened before: a no-op the interpreter refuses); None once the
        episode has left the walkthrough."""
        pos = self._walk_pos
        while pos is not None and pos < len(self._walkthrough) and self._walkthrough[pos] not in self._admissible:
            pos += 1
        return pos

    def _set_admissible(self, commands: list[str]) -> None:
        self._admissible = tuple(commands)
        self._spelling = {normalise(c): c for c in commands}

    def _obs(self) -> Obs:
        return Obs(text=self._text, anchor=self._text, admissible=self._admissible, instruction=self._instruction)

"""Compact prompts: observations a small policy can read (the tiny presets' default; paper presets keep verl-agent's).

The verl-agent templates (:mod:`agentjax.agents.prompts`) put a long instruction *after* the observation and
before the reply, show two history records and, for Sokoban, RAGEN's grid text, which Qwen's BPE merges into
context-dependent tokens (``'###'``, ``'_P'``, ``'XP'``, ``'#\\n'``): the cell under the player is a different
token in every room. A 2-layer d = 64 policy does not learn to read that from a few thousand demonstrations. The
compact prompts change four things, nothing else:

1. **The observation last**, right before the generation prompt: one short instruction first (with the legend
   and the action list), then the current observation.
2. **One token per grid cell** (Sokoban): each cell is written as a space and one character, rows end with
   ``" |"``. Every cell symbol is then one Qwen token (``' #'``, ``' _'``, ``' O'``, ``' X'``, ``' P'``, ``' S'``,
   ``' *'``, ``' |'``; ``'√'`` is two tokens, so a box on a target is written ``*``, as in the XSB Sokoban
   notation). A 6×6 room is 42 tokens (36 cells + 6 row ends); ``tests/agents/test_compact.py`` checks this with
   the real tokenizer.
3. **No history where the state is fully observed** (Sokoban: the grid is the state; the MDPs: the room is). The
   collector's ``history_length`` still applies to the partially observed envs; :data:`FULLY_OBSERVED` names the
   others, and the tiny presets set ``history_length=0`` for them.
4. **A short system message** instead of the chat template's default ("You are Qwen, created by ...").

The templates are :class:`~agentjax.agents.prompts.PromptTemplate` values, so :func:`~agentjax.agents.prompts.
build_prompt` renders them; ``PromptTemplate.render`` turns the env's observation text into the shown text (and
the history records' observations the same way). Select them with ``CollectConfig.prompt="compact"``.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

from agentjax.agents.prompts import TEMPLATES, PromptTemplate

SOKOBAN_CELLS = types.MappingProxyType({"√": "*"})  # RAGEN's symbol -> the compact one (one token with a space)
ROW_END = " |"


def sokoban_grid(text: str) -> str:
    """RAGEN's grid text as one token per cell: ``" c"`` per cell, ``" |"`` after each row, ``√`` written ``*``."""
    return "".join("".join(" " + SOKOBAN_CELLS.get(c, c) for c in row) + ROW_END for row in text.split("\n"))


_HINT = "Reply <action>ACTION</action>."
_ACTIONS = "Actions: {actions}.\n"
_LATER = "Recent steps:\n{action_history}\n"

SOKOBAN = PromptTemplate(
    name="sokoban",
    system="You play Sokoban.",
    first_turn=("Push every box X onto a target O. # wall, _ floor, P you, S you on a target, * box on a target. "
                "Moves: Up, Down, Left, Right. {action_hint}\nRoom:{current_observation}"),
    with_history=("Push every box X onto a target O. # wall, _ floor, P you, S you on a target, * box on a target. "
                  "Moves: Up, Down, Left, Right. {action_hint}\n" + _LATER + "Room:{current_observation}"),
    action_hint=_HINT,
    render=sokoban_grid,
)


def _text_env(name: str, system: str) -> PromptTemplate:
    """The layout of the text environments: task, action hint, [recent steps], admissible actions, observation."""
    head = "Task: {task_description}\n{action_hint}\n"
    tail = "{admissible_block}Observation: {current_observation}"
    return PromptTemplate(name=name, system=system, first_turn=head + tail, with_history=head + _LATER + tail,
                          action_hint=_HINT, admissible_block=_ACTIONS, action_item="{action}", action_sep="; ")


ALFWORLD = _text_env("alfworld", "You act in a household text world.")
WEBSHOP = dataclasses.replace(_text_env("webshop", "You shop on a web store."), action_sep="\n",
                              admissible_block="Actions:\n{actions}\n")
TEXTCRAFT = _text_env("textcraft", "You craft Minecraft items.")
TEXTCRAFT_SYNTH = dataclasses.replace(TEXTCRAFT, name="textcraft_synth")
TEXTWORLD = _text_env("textworld", "You cook in a text world.")
TEXTWORLD_SYNC = _text_env("textworld_sync", "You cook several dishes in a shared world.")

# The credit-testbed MDPs (envs/mdp): the observation alone, which names the room and lists its exits (the
# admissible labels); the task is the system message. With history_length 0 the prompt is a function of the state
# only, so the policy is a table pi(a | s) that agentjax.train.exact reads with one forward pass per state.
MDP = PromptTemplate(name="mdp", system="You walk through rooms to the goal.", first_turn="{current_observation}",
                     with_history=_LATER + "{current_observation}", action_hint=_HINT)

COMPACT_TEMPLATES: Mapping[str, PromptTemplate] = types.MappingProxyType(
    {t.name: t for t in (ALFWORLD, SOKOBAN, WEBSHOP, TEXTCRAFT, TEXTCRAFT_SYNTH, TEXTWORLD, TEXTWORLD_SYNC, MDP)})
FULLY_OBSERVED = frozenset({"sokoban", "mdp"})  # the observation is the whole state: no history needed
PROMPT_STYLES = ("verl-agent", "compact")


def templates(style: str) -> Mapping[str, PromptTemplate]:
    """The templates of a prompt style (``CollectConfig.prompt``): ``"verl-agent"`` or ``"compact"``."""
    if style == "compact":
        return COMPACT_TEMPLATES
    if style == "verl-agent":
        return TEMPLATES
    raise ValueError(f"unknown prompt style {style!r}; one of {PROMPT_STYLES}")

__all__ = ["COMPACT_TEMPLATES", "FULLY_OBSERVED", "PROMPT_STYLES", "ROW_END", "SOKOBAN_CELLS", "sokoban_grid",
           "templates"]

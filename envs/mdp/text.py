"""What the MDP environment says, over a small word-level vocabulary.

A state that acts reads ``"room 17. exits: north, ladder, blue door"``: its name (``room`` and a number that
carries no structure) and its action labels, drawn per state from :data:`LABELS` in a random order, so no label
means the same thing in two states and the policy has to learn a table. The terminal states read ``"goal."``
and ``"pit."``.

A *word* is a run of lower-case letters, one digit, or one of ``. , :`` (:func:`split_words`); numbers are read
digit by digit so the vocabulary stays finite. :func:`vocabulary` lists every word that an observation, an
action label or the instruction can contain.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

LABELS: tuple[str, ...] = (
    "north", "south", "east", "west", "up", "down", "ladder", "stairs",
    "hatch", "tunnel", "bridge", "rope", "red door", "blue door", "green door", "gate",
)
ROOM, GOAL, PIT = "room", "goal", "pit"
INSTRUCTION = "reach the goal. each turn, choose one exit."

_WORD = re.compile(r"[a-z]+|[0-9]|[.,:]")


def split_words(text: str) -> list[str]:
    """The words of a text, in order: letter runs, single digits and the marks ``. , :`` (spaces dropped)."""
    return _WORD.findall(text)


def vocabulary() -> tuple[str, ...]:
    """Every word (:func:`split_words`) that an observation, an action label or the instruction can contain,
    sorted: the letter words, the ten digits and the three marks."""
    texts = (*LABELS, ROOM, GOAL, PIT, "exits", INSTRUCTION, "0123456789.,:")
    return tuple(sorted({word for text in texts for word in split_words(text)}))


def room_name(number: int) -> str:
    """The name of the state with this number: ``"room 17"``."""
    return f"{ROOM} {number}"


def observation(name: str, labels: Sequence[str]) -> str:
    """``"<name>. exits: <label>, <label>"`` for a state that acts; ``"<name>."`` for a terminal one."""
    return f"{name}. exits: {', '.join(labels)}" if labels else f"{name}."


def normalize(action: str) -> str:
    """An action as typed, in the form labels are compared: lower case, runs of white space as one space."""
    return " ".join(action.lower().split())

"""Action projection: the model's reply ``<think>...</think><action>...</action>`` -> the string sent to the env.

After verl-agent's ``env_package/*/projection.py`` (``alfworld_projection``, ``sokoban_projection``,
``webshop_projection``). A reply is **valid** when, in this order of checks (the first failure is the reason):

1. it has an action block ``<action> ... </action>`` (tags matched case-insensitively): else ``no_action``,
   or ``unclosed_action`` when an ``<action>`` is never closed;
2. exactly one ``<action>`` and one ``</action>`` tag: else ``multiple_actions``;
3. the action is not empty after normalisation: else ``empty_action``;
4. (``require_think``) exactly one ``<think>`` and one ``</think>``, in that order, closed before the action
   block opens: else ``missing_think`` (a tag absent) or ``malformed_think``;
5. no Chinese character (CJK U+4E00–U+9FFF, verl-agent's range) anywhere in the reply: else ``chinese``;
6. the normalised action has at most :data:`MAX_ACTION_BYTES` bytes in UTF-8: else ``too_long``;
7. the environment's command grammar (Sokoban, WebShop, TextCraft only): else ``bad_format``;
8. (``require_admissible``, when a list is given) the action is one of the admissible actions: else
   ``not_admissible``.

The action is the content of the **last** complete block (with one block, the only one; with several, the last is
most likely the answer and not a tag quoted in the reasoning), normalised: stripped, runs of whitespace collapsed
to one space and lower-cased (verl-agent lower-cases ALFWorld, Sokoban and WebShop replies). When it matches an
admissible action up to case and whitespace, the admissible spelling is returned.

An invalid reply never raises. It is still sent to the environment, as verl-agent does: the extracted action
when there is a block (the env executes it or answers that nothing happens), else the normalised last
:data:`FALLBACK_CHARS` characters of the reply (verl-agent ALFWorld: ``actions[i][-30:]``), which no environment
executes. An action longer than :data:`MAX_ACTION_BYTES` (whatever else is wrong with the reply) is sent as its
first :data:`FALLBACK_CHARS` characters, so that what the model writes reaches the environment, and through the
history the next prompts, bounded: a byte-level BPE tokenizer never needs more tokens than bytes, and TextCraft
echoes a command it cannot execute. The step is charged
:data:`INVALID_PENALTY` by the trainer (METHODS.md), from ``Projected.valid``.

Deviations from verl-agent, on purpose: it takes the first ``<action>`` / first ``</action>`` and counts a
reply with several blocks, an empty block, or think tags in any order or number as valid; here those are
invalid. Its Sokoban projection matches the first of up/down/left/right/still as a substring; here exactly one
direction word must appear. Its WebShop projection accepts any block; here it must read ``search[...]`` or
``click[...]``. It has no length limit on an action.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Literal

INVALID_PENALTY = 0.1  # subtracted from the reward of a step whose reply is invalid (METHODS.md)
FALLBACK_CHARS = 30  # how much of the reply's tail is sent to the env when there is no action block
# Longer actions (UTF-8 bytes) are invalid (``too_long``); the longest admissible actions of any env (TextCraft-Synth
# crafts with several ingredients) are a fraction of it.
MAX_ACTION_BYTES = 512

Reason = Literal[
    "ok",
    "no_action",
    "unclosed_action",
    "multiple_actions",
    "empty_action",
    "missing_think",
    "malformed_think",
    "chinese",
    "too_long",
    "bad_format",
    "not_admissible",
]

SOKOBAN_ACTIONS: tuple[str, ...] = ("up", "down", "left", "right")

_ACTION_OPEN = re.compile(r"<action>", re.IGNORECASE)
_ACTION_CLOSE = re.compile(r"</action>", re.IGNORECASE)
_ACTION_BLOCK = re.compile(r"<action>((?:(?!<action>).)*?)</action>", re.IGNORECASE | re.DOTALL)
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_CHINESE = re.compile(r"[\u4e00-\u9fff]")
_WEBSHOP = re.compile(r"(search|click)\[(.*)\]", re.DOTALL)
_TEXTCRAFT = re.compile(r"inventory|get \S.*|craft \S.* using \S.*", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Projected:
    """The outcome of projecting one reply."""

    action: str  # the string to send to the environment (also when invalid)
    valid: bool  # False: the step is charged INVALID_PENALTY
    reason: Reason  # "ok" when valid, else the first failed check (module docstring)


def normalize(text: str, *, lowercase: bool = True) -> str:
    """Stripped, whitespace runs collapsed to one space, lower-cased when ``lowercase``."""
    text = " ".join(text.split())
    return text.lower() if lowercase else text


def _key(text: str) -> str:
    return " ".join(text.split()).casefold()


@dataclasses.dataclass(frozen=True)
class _Parsed:
    content: str | None  # the raw content of the last complete action block, None when there is none
    reason: Reason  # the first failed structural check (1-5 of the module docstring), "ok" if none


def _parse(text: str, *, require_think: bool) -> _Parsed:
    blocks = list(_ACTION_BLOCK.finditer(text))
    opens = [m.start() for m in _ACTION_OPEN.finditer(text)]
    if not blocks:
        return _Parsed(None, "unclosed_action" if opens else "no_action")
    block = blocks[-1]
    content = block.group(1)
    if len(opens) > 1 or len(_ACTION_CLOSE.findall(text)) > 1:
        return _Parsed(content, "multiple_actions")
    if not content.split():
        return _Parsed(content, "empty_action")
    if require_think:
        think_opens = [m.start() for m in _THINK_OPEN.finditer(text)]
        think_closes = [m.end() for m in _THINK_CLOSE.finditer(text)]
        if not think_opens or not think_closes:
            return _Parsed(content, "missing_think")
        if len(think_opens) > 1 or len(think_closes) > 1 or not think_opens[0] < think_closes[0] <= block.start():
            return _Parsed(content, "malformed_think")
    if _CHINESE.search(text):
        return _Parsed(content, "chinese")
    return _Parsed(content, "ok")


def _fallback(text: str, *, lowercase: bool) -> str:
    return normalize(text[-FALLBACK_CHARS:], lowercase=lowercase)


def _match(action: str, admissible: Sequence[str] | None) -> str | None:
    """The admissible action equal to ``action`` up to case and whitespace, or None."""
    if admissible is None:
        return None
    key = _key(action)
    return next((a for a in admissible if _key(a) == key), None)


def _bounded(action: str, reason: Reason) -> tuple[str, Reason]:
    """Check 6: an action over :data:`MAX_ACTION_BYTES` bytes is cut to its first :data:`FALLBACK_CHARS` characters."""
    if len(action.encode("utf-8", "surrogatepass")) <= MAX_ACTION_BYTES:
        return action, reason
    return action[:FALLBACK_CHARS].strip(), "too_long" if reason == "ok" else reason


def _finish(action: str, reason: Reason, admissible: Sequence[str] | None, require_admissible: bool) -> Projected:
    """Canonicalises ``action`` against ``admissible`` and applies check 8."""
    canonical = _match(action, admissible)
    if canonical is not None:
        action = canonical
    elif reason == "ok" and require_admissible and admissible is not None:
        reason = "not_admissible"
    return Projected(action=action, valid=reason == "ok", reason=reason)


def project_action(
    text: str,
    admissible: Sequence[str] | None = None,
    *,
    require_think: bool = True,
    require_admissible: bool = False,
    lowercase: bool = True,
) -> Projected:
    """The generic projection (ALFWorld, TextWorld): checks 1-6 and 8 of the module docstring.

    Args:
      text: the model's reply (response tokens decoded, without the chat template's end-of-turn token).
      admissible: the environment's admissible actions, or None; an action equal to one of them up to case and
        whitespace is returned in the list's spelling.
      require_think: check 4 (the ``<think> </think>`` block the prompts ask for).
      require_admissible: check 8; ignored when ``admissible`` is None.
      lowercase: lower-case the action (verl-agent does for ALFWorld).

    Returns: :class:`Projected`; never raises.
    """
    parsed = _parse(text, require_think=require_think)
    if parsed.content is None:
        return Projected(action=_fallback(text, lowercase=lowercase), valid=False, reason=parsed.reason)
    action, reason = _bounded(normalize(parsed.content, lowercase=lowercase), parsed.reason)
    return _finish(action, reason, admissible, require_admissible)


def project_sokoban(text: str, admissible: Sequence[str] | None = None, *, require_think: bool = True) -> Projected:
    """Sokoban: the action block must name exactly one of up / down / left / right (as a word, any case).

    Returns the direction in lower case (``"up"``; "Up", "move up", "UP." all give it). No direction, or two
    different ones ("left then up"), is ``bad_format`` and sends the normalised text, which the env rejects.
    ``admissible`` is unused (the action set is fixed); it is accepted for a uniform call.
    """
    del admissible
    parsed = _parse(text, require_think=require_think)
    if parsed.content is None:
        return Projected(action=_fallback(text, lowercase=True), valid=False, reason=parsed.reason)
    action, reason = _bounded(normalize(parsed.content), parsed.reason)
    directions = {w for w in re.findall(r"[a-z]+", action) if w in SOKOBAN_ACTIONS}
    if len(directions) == 1:
        action = directions.pop()
    elif reason == "ok":
        reason = "bad_format"
    return Projected(action=action, valid=reason == "ok", reason=reason)


def project_webshop(
    text: str,
    admissible: Sequence[str] | None = None,
    *,
    require_think: bool = True,
    require_admissible: bool = False,
) -> Projected:
    """WebShop: the action must read ``search[<query>]`` or ``click[<button>]`` (lower-cased, inner text stripped).

    With ``require_admissible``, a search is admissible when the list offers one (an entry starting with
    ``search[``, e.g. verl-agent's ``search[<your query>]``), a click when ``click[<button>]`` is in the list.
    """
    parsed = _parse(text, require_think=require_think)
    if parsed.content is None:
        return Projected(action=_fallback(text, lowercase=True), valid=False, reason=parsed.reason)
    action, reason = _bounded(normalize(parsed.content), parsed.reason)
    match = _WEBSHOP.fullmatch(action)
    if match is None or not match.group(2).strip():
        return Projected(action=action, valid=False, reason=reason if reason != "ok" else "bad_format")
    kind, arg = match.group(1), match.group(2).strip()
    action = f"{kind}[{arg}]"
    if kind == "search":
        if reason == "ok" and require_admissible and admissible is not None:
            if not any(_key(a).startswith("search[") for a in admissible):
                reason = "not_admissible"
        return Projected(action=action, valid=reason == "ok", reason=reason)
    return _finish(action, reason, admissible, require_admissible)


def project_mdp(text: str, admissible: Sequence[str] | None = None, *, require_think: bool = True) -> Projected:
    """The credit-testbed MDPs (envs/mdp): the action block must name one of the state's exits (its admissible
    labels, up to case and white space), returned in the list's spelling; anything else is invalid
    (``not_admissible``, or the structural reason), and the env leaves the state as it is."""
    return project_action(text, admissible, require_think=require_think, require_admissible=True)


def project_textcraft(
    text: str,
    admissible: Sequence[str] | None = None,
    *,
    require_think: bool = True,
    require_admissible: bool = False,
) -> Projected:
    """TextCraft / TextCraft-Synth: a free-form command, ``inventory``, ``get ...`` or ``craft ... using ...``
    (lower-cased, whitespace collapsed); anything else is ``bad_format``."""
    parsed = _parse(text, require_think=require_think)
    if parsed.content is None:
        return Projected(action=_fallback(text, lowercase=True), valid=False, reason=parsed.reason)
    action, reason = _bounded(normalize(parsed.content), parsed.reason)
    if reason == "ok" and _TEXTCRAFT.fullmatch(action) is None:
        reason = "bad_format"
    return _finish(action, reason, admissible, require_admissible)

"""Reply grammars of recursive agents (SERA / RAO, METHODS.md "SERA" 1): one per environment, parsed, never run.

A node's reply is one of three things: act in the environment, delegate one or several subtasks (children run
concurrently), or finish with a message for its parent. Every parser returns a :class:`Reply`; a reply that does
not fit the grammar is ``kind == "invalid"`` with an ``error`` (the runtime charges the invalid-action penalty and
shows the error) — parsers never raise on model output.

**TextWorld-Sync** (the released protocol, ``Runtime/agents/textworld_protocol.py``): the reply holds exactly one
*kind* of block among ``<action>command</action>``, ``<finish>message</finish>`` and ``<delegate>{json}</delegate>``
(tags case-insensitive; text around the blocks, e.g. reasoning, is allowed; with several blocks of the one kind the
first counts, as in the released parser). The delegate payload is a JSON object ``{"goal": "...", "max_steps": 20}``
or ``{"delegations": [{"goal": ...}, ...]}`` (one or several children; ``max_steps`` optional, a positive integer).
An empty action, finish or goal, two kinds of block, or a payload that is not such JSON is invalid.

**TextCraft(-Synth)** (the released platoon agents write Python that calls the executor's functions): the reply
holds a ``<python>...</python>`` block (an optional ``<thought>...</thought>`` before it; the closing tag may be
missing at the end, as platoon appends it). The code is *parsed* with :mod:`ast` (no compile, no eval, no exec)
and accepted only if every statement is, after an optional ``name =`` assignment, ``await`` or ``print(...)``,
one whitelisted call whose arguments are literals (read with :func:`ast.literal_eval`, which evaluates nothing
but literals):

- ``craft(ingredients: dict[str, int], target: tuple[str, int])``,
- ``get_info(items: list[str])``, ``view_inventory()``,
- ``finish(message: str)``,
- ``launch_subagent(targets: dict[str, int], context: str = "", num_steps: int = None)`` — alone, or several
  inside one ``asyncio.gather(...)`` (concurrent children); a positional second argument that is an int is read as
  ``num_steps`` (platoon's older signature).

Calls run in order; ``finish`` or the delegation statement (at most one of them) must be the last statement.
Loops, conditions, names as arguments, attribute calls other than ``asyncio.gather``, imports, ``*args`` — anything
else is invalid. At most ``max_calls`` calls per reply.

Token roles (:class:`Role`): the delegation's characters (the ``<delegate>`` block with its tags; the statement
that calls ``launch_subagent`` / ``asyncio.gather``) are :attr:`Role.DELEGATION`; the rest of the reply (acting,
finishing, reasoning, the stop token) is :attr:`Role.EXECUTION`. SERA's rubric and grading calls are separate
policy calls with their own roles (:attr:`Role.RUBRIC`, :attr:`Role.GRADING`).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

MAX_CHARS = 16_000  # longer replies are invalid without parsing
MAX_CALLS = 16  # calls per TextCraft reply


class Role(enum.IntEnum):
    """What a response token is trained by (SERA's stages; 0 marks padding)."""

    NONE = 0
    EXECUTION = 1  # acting and finishing (and everything else of a node's own reply)
    DELEGATION = 2  # the delegate span
    RUBRIC = 3  # the rubric a parent writes at a delegation (SERA)
    GRADING = 4  # the policy's grading of a child (SERA; greedy, no gradient)


@dataclasses.dataclass(frozen=True)
class Call:
    """One environment call of a reply: ``name`` with its arguments by parameter name, and its source text."""

    name: str  # "craft", "get_info", "view_inventory" (TextCraft); "action" (TextWorld: args {"command": ...})
    args: Mapping[str, Any]
    source: str  # the call as written (TextWorld: the command)


@dataclasses.dataclass(frozen=True)
class Delegation:
    """One child to launch: its goal text, targets (TextCraft: ``{item: count}``), context and requested budget."""

    goal: str
    targets: Mapping[str, int] = dataclasses.field(default_factory=dict)
    context: str = ""
    max_steps: int | None = None  # requested budget (the runtime caps it at the node budget)


Kind = Literal["act", "delegate", "finish", "invalid"]


@dataclasses.dataclass(frozen=True)
class Reply:
    """A parsed reply: environment calls in order, then at most one delegation or finish."""

    kind: Kind
    text: str
    calls: tuple[Call, ...] = ()
    delegations: tuple[Delegation, ...] = ()
    message: str = ""  # the finish message
    error: str = ""  # why the reply is invalid
    delegate_span: tuple[int, int] | None = None  # [start, end) characters of the delegation in ``text``

    @property
    def valid(self) -> bool:
        return self.kind != "invalid"

    def role_spans(self) -> tuple[tuple[int, int, Role], ...]:
        """``(start, end, role)`` character spans of the roles other than :attr:`Role.EXECUTION`."""
        return () if self.delegate_span is None else ((*self.delegate_span, Role.DELEGATION),)


def invalid(text: str, error: str) -> Reply:
    return Reply(kind="invalid", text=text, error=error)


# ------------------------------------------------------------------------------------------------ TextWorld-Sync

_BLOCKS = {kind: re.compile(rf"<{kind}>(.*?)</{kind}>", re.IGNORECASE | re.DOTALL)
           for kind in ("action", "delegate", "finish")}


def parse_textworld(text: str, *, max_chars: int = MAX_CHARS) -> Reply:
    """The TextWorld-Sync reply protocol (module docstring)."""
    if not isinstance(text, str) or len(text) > max_chars:
        return invalid(str(text)[:max_chars], f"a reply is a string of at most {max_chars} characters")
    found = {kind: pattern.search(text) for kind, pattern in _BLOCKS.items()}
    present = [kind for kind, m in found.items() if m]
    if len(present) != 1:
        return invalid(text, "a reply holds exactly one kind of block: <action>, <delegate> or <finish>")
    kind, m = present[0], found[present[0]]
    body = m.group(1).strip()
    if kind == "action":
        if not body:
            return invalid(text, "the action block is empty")
        return Reply(kind="act", text=text, calls=(Call("action", {"command": body}, body),))
    if kind == "finish":
        if not body:
            return invalid(text, "the finish block is empty")
        return Reply(kind="finish", text=text, message=body)
    try:
        delegations = _delegations(json.loads(body))
    except (ValueError, RecursionError) as error:  # json.JSONDecodeError is a ValueError
        return invalid(text, f"bad delegate payload: {error}")
    return Reply(kind="delegate", text=text, delegations=delegations, delegate_span=m.span())


def _delegations(payload: Any) -> tuple[Delegation, ...]:
    items = payload["delegations"] if isinstance(payload, dict) and "delegations" in payload else [payload]
    if not isinstance(items, list) or not items:
        raise ValueError("the payload is an object with a goal, or {\"delegations\": [objects with a goal, ...]}")
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise ValueError("every delegation is a JSON object")
        goal = item.get("goal")
        if not isinstance(goal, str) or not goal.strip():
            raise ValueError("every delegation needs a non-empty goal string")
        steps = item.get("max_steps")
        if steps is not None and (type(steps) is not int or steps <= 0):
            raise ValueError("max_steps is a positive integer")
        out.append(Delegation(goal=goal.strip(), max_steps=steps))
    return tuple(out)


# ------------------------------------------------------------------------------------------------ TextCraft

_PYTHON = re.compile(r"<python>(.*?)(?:</python>|\Z)", re.DOTALL)
ENV_CALLS = ("craft", "get_info", "view_inventory")
_PARAMS = {  # positional order of each whitelisted function's parameters
    "craft": ("ingredients", "target"),
    "get_info": ("items",),
    "view_inventory": (),
    "finish": ("message",),
    "launch_subagent": ("targets", "context", "num_steps"),
}
_REQUIRED = {"craft": 2, "get_info": 1, "view_inventory": 0, "finish": 1, "launch_subagent": 1}


class _Reject(Exception):
    """A grammar violation (becomes an invalid reply)."""


def parse_textcraft(text: str, *, max_chars: int = MAX_CHARS, max_calls: int = MAX_CALLS) -> Reply:
    """The TextCraft call grammar (module docstring)."""
    if not isinstance(text, str) or len(text) > max_chars:
        return invalid(str(text)[:max_chars], f"a reply is a string of at most {max_chars} characters")
    m = _PYTHON.search(text)
    if m is None:
        return invalid(text, "no <python>...</python> block")
    code, base = m.group(1), m.start(1)
    try:
        return _parse_code(text, code, base, max_calls)
    except _Reject as error:
        return invalid(text, str(error))
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as error:
        return invalid(text, f"the code does not parse: {type(error).__name__}")


def _parse_code(text: str, code: str, base: int, max_calls: int) -> Reply:
    lines = code.split("\n")
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    short = [line[indent:] for line in lines]  # every non-blank line starts with >= indent whitespace characters
    dedented = "\n".join(short)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    tree = ast.parse(dedented, mode="exec")

    def offset(line: int, col: int) -> int:  # ast's (1-based line, UTF-8 byte column) -> index in ``text``
        chars = len(short[line - 1].encode("utf-8")[:col].decode("utf-8", "ignore"))
        return base + starts[line - 1] + min(indent, len(lines[line - 1])) + chars

    calls: list[Call] = []
    delegations: tuple[Delegation, ...] = ()
    message: str | None = None
    span = None
    body = [s for s in tree.body if not _trivial(s)]
    for i, stmt in enumerate(body):
        value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
        if isinstance(stmt, ast.Assign) and not all(isinstance(t, ast.Name) for t in stmt.targets):
            value = None
        if value is None:
            raise _Reject(f"statement {i + 1} is not allowed: only calls of craft, get_info, view_inventory, finish "
                          "and launch_subagent (optionally assigned to a name, awaited or printed)")
        value = _unwrap(value)
        launches = _gather(value) if _is_gather(value) else None
        name = _func(value) if launches is None else "launch_subagent"
        if name not in _PARAMS:
            raise _Reject(f"statement {i + 1} calls something other than craft, get_info, view_inventory, finish "
                          "or launch_subagent")
        if name in ("finish", "launch_subagent") and i != len(body) - 1:
            raise _Reject(f"{name} must be the last statement")
        if name == "launch_subagent":
            delegations = tuple(_delegation(call) for call in (launches or [value]))
            span = (offset(stmt.lineno, stmt.col_offset), offset(stmt.end_lineno, stmt.end_col_offset))
        elif name == "finish":
            message = _checked(name, _bind(value, name))["message"]
        else:
            args = _checked(name, _bind(value, name))
            source = ast.get_source_segment(dedented, value) or name
            calls.append(Call(name, args, source))
        if len(calls) + len(delegations) > max_calls:
            raise _Reject(f"at most {max_calls} calls per reply")
    if delegations:
        return Reply(kind="delegate", text=text, calls=tuple(calls), delegations=delegations, delegate_span=span)
    if message is not None:
        return Reply(kind="finish", text=text, calls=tuple(calls), message=message)
    if not calls:
        raise _Reject("the code calls nothing")
    return Reply(kind="act", text=text, calls=tuple(calls))


def _trivial(stmt: ast.stmt) -> bool:
    """``pass`` and bare string constants (docstrings) are ignored."""
    return isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                                          and isinstance(stmt.value.value, str))


def _unwrap(node: ast.expr) -> ast.expr:
    """``await x`` -> x; ``print(x)`` -> x (one level each, in either order)."""
    for _ in range(2):
        if isinstance(node, ast.Await):
            node = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
              and len(node.args) == 1 and not node.keywords):
            node = node.args[0]
    return node


def _func(node: ast.expr) -> str | None:
    return node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None


def _is_gather(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "gather"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio")


def _gather(node: ast.Call) -> list[ast.Call]:
    if node.keywords or not node.args:
        raise _Reject("asyncio.gather takes one or more launch_subagent(...) calls")
    calls = [_unwrap(a) for a in node.args]
    if not all(_func(c) == "launch_subagent" for c in calls):
        raise _Reject("asyncio.gather may only gather launch_subagent(...) calls")
    return calls


def _bind(call: ast.Call, name: str) -> dict[str, Any]:
    """The call's literal arguments by parameter name (``ast.literal_eval``: literals only)."""
    params = _PARAMS[name]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise _Reject(f"{name}: no *args or **kwargs")
    if len(call.args) > len(params):
        raise _Reject(f"{name} takes at most {len(params)} positional arguments")
    args: dict[str, Any] = {}
    for param, node in [*zip(params, call.args, strict=False), *((k.arg, k.value) for k in call.keywords)]:
        if param not in params or param in args:
            raise _Reject(f"{name}: unexpected or repeated argument {param!r}")
        try:
            args[param] = ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise _Reject(f"{name}: the argument {param!r} must be a literal (a string, number, list, tuple or "
                          "dict of literals)") from None
    if name == "launch_subagent" and len(call.args) == 2 and type(args["context"]) is int and "num_steps" not in args:
        args["num_steps"] = args.pop("context")  # launch_subagent(targets, num_steps): platoon's older signature
    missing = [p for p in params[: _REQUIRED[name]] if p not in args]
    if missing:
        raise _Reject(f"{name}: missing argument(s) {', '.join(missing)}")
    return args


def _counts(value: Any, what: str) -> dict[str, int]:
    if (not isinstance(value, dict) or not value
            or not all(isinstance(k, str) and k and type(n) is int and n > 0 for k, n in value.items())):
        raise _Reject(f"{what} must be a non-empty dict of item name -> positive int")
    return dict(value)


def _checked(name: str, args: dict[str, Any]) -> dict[str, Any]:
    if name == "craft":
        target = args["target"]
        if not (isinstance(target, (tuple, list)) and len(target) == 2 and isinstance(target[0], str)
                and target[0] and type(target[1]) is int and target[1] > 0):
            raise _Reject("craft: target must be a tuple (item name, positive int)")
        return {"ingredients": _counts(args["ingredients"], "craft: ingredients"), "target": (target[0], target[1])}
    if name == "get_info":
        items = args["items"]
        items = [items] if isinstance(items, str) else items
        if not (isinstance(items, (list, tuple)) and 0 < len(items) <= 32 and all(isinstance(i, str) for i in items)):
            raise _Reject("get_info: items must be a list of 1 to 32 item names")
        return {"items": list(items)}
    if name == "finish":
        if not isinstance(args["message"], str):
            raise _Reject("finish: message must be a string")
        return args
    return args  # view_inventory


def _delegation(call: ast.Call) -> Delegation:
    args = _bind(call, "launch_subagent")
    targets = _counts(args["targets"], "launch_subagent: targets")
    context = args.get("context", "")
    steps = args.get("num_steps")
    if not isinstance(context, str):
        raise _Reject("launch_subagent: context must be a string")
    if steps is not None and (type(steps) is not int or steps <= 0):
        raise _Reject("launch_subagent: num_steps must be a positive int")
    return Delegation(goal=textcraft_goal(targets, context), targets=targets, context=context, max_steps=steps)


def textcraft_goal(targets: Mapping[str, int], context: str = "") -> str:
    """A TextCraft child's goal text: ``Craft the following items: 2x a, 1x b`` (the released format) + context."""
    goal = "Craft the following items: " + ", ".join(f"{n}x {item}" for item, n in targets.items())
    return goal + (f"\n\nContext from the parent agent: {context}" if context else "")


def format_call(name: str, *args: Any) -> str:
    """A call in the TextCraft grammar with literal arguments (``json`` strings: double quotes), e.g.
    ``format_call("craft", {"a": 2}, ("b", 1))`` -> ``craft({"a": 2}, ("b", 1))``."""
    return f"{name}({', '.join(_literal(a) for a in args)})"


def _literal(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_literal(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


__all__ = [
    "ENV_CALLS",
    "Call",
    "Delegation",
    "Reply",
    "Role",
    "format_call",
    "invalid",
    "parse_textcraft",
    "parse_textworld",
    "textcraft_goal",
]

"""Reply grammars of recursive agents: TextWorld-Sync's tagged protocol and TextCraft's whitelisted call grammar.

Checked: every accepted form and its arguments; the delegation's character span (the DELEGATION role); malformed
and adversarial replies are invalid with a reason and never raise; code-like text is never run (builtins that run
code are booby-trapped while parsing, and side effects the code asks for never happen); a fuzz over random text.
"""

from __future__ import annotations

import ast
import builtins
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentjax.agents.grammar import (
    MAX_CALLS,
    Role,
    format_call,
    parse_textcraft,
    parse_textworld,
    textcraft_goal,
)


def py(code: str) -> str:
    return f"<python>\n{code}\n</python>"


# ------------------------------------------------------------------------------------------------ TextWorld-Sync


def test_textworld_action_finish_and_delegations():
    r = parse_textworld("I should look first. <action> go north </action>")
    assert r.kind == "act" and r.calls[0].args == {"command": "go north"} and r.delegate_span is None
    r = parse_textworld("<FINISH>the apple is sliced</FINISH>")
    assert r.kind == "finish" and r.message == "the apple is sliced"
    text = 'Plan. <delegate>{"goal": "slice the apple", "max_steps": 7}</delegate> ok'
    r = parse_textworld(text)
    assert r.kind == "delegate" and [(d.goal, d.max_steps) for d in r.delegations] == [("slice the apple", 7)]
    assert text[slice(*r.delegate_span)] == '<delegate>{"goal": "slice the apple", "max_steps": 7}</delegate>'
    assert r.role_spans() == ((*r.delegate_span, Role.DELEGATION),)
    r = parse_textworld('<delegate>{"delegations": [{"goal": "take knife"}, {"goal": "cook carrot"}]}</delegate>')
    assert [d.goal for d in r.delegations] == ["take knife", "cook carrot"] and r.delegations[0].max_steps is None
    r = parse_textworld("<action>open door</action> then <action>go east</action>")  # the first block counts
    assert r.calls[0].source == "open door"


@pytest.mark.parametrize("text", [
    "",
    "go north",
    "<action></action>",
    "<finish>  </finish>",
    "<action>go</action><finish>done</finish>",
    "<action>go</action><delegate>{\"goal\": \"x\"}</delegate>",
    "<delegate>not json</delegate>",
    "<delegate>{\"goal\": \"\"}</delegate>",
    "<delegate>{\"goal\": \"x\", \"max_steps\": 0}</delegate>",
    "<delegate>{\"goal\": \"x\", \"max_steps\": true}</delegate>",
    "<delegate>{\"goal\": \"x\", \"max_steps\": \"5\"}</delegate>",
    "<delegate>{\"delegations\": []}</delegate>",
    "<delegate>{\"delegations\": [\"take knife\"]}</delegate>",
    "<delegate>[{\"goal\": \"x\"}]</delegate>",
    "<delegate>" + "[" * 100_00 + "</delegate>",
    "<action>go" + " " * 20_000 + "</action>",
])
def test_textworld_malformed_replies_are_invalid(text):
    r = parse_textworld(text)
    assert r.kind == "invalid" and r.error and not r.valid


# ------------------------------------------------------------------------------------------------ TextCraft


def test_textcraft_calls_and_their_arguments():
    r = parse_textcraft("<thought>craft ore first</thought>\n" + py(
        '# comment\n"""a docstring"""\ncraft({"m0_ore": 2, "m1_ore": 1}, ("m2_i1", 4))\n'
        'x = get_info(["m2_i1"])\nprint(view_inventory())\ncraft(ingredients={"a": 1}, target=["b", 2])\npass'))
    assert r.kind == "act" and [c.name for c in r.calls] == ["craft", "get_info", "view_inventory", "craft"]
    assert r.calls[0].args == {"ingredients": {"m0_ore": 2, "m1_ore": 1}, "target": ("m2_i1", 4)}
    assert r.calls[0].source == 'craft({"m0_ore": 2, "m1_ore": 1}, ("m2_i1", 4))'
    assert r.calls[1].args == {"items": ["m2_i1"]} and r.calls[3].args["target"] == ("b", 2)
    r = parse_textcraft(py('craft({"a": 1}, ("b", 1))\nfinish("all crafted")'))
    assert r.kind == "finish" and r.message == "all crafted" and len(r.calls) == 1
    assert parse_textcraft("<python>finish(message='x')").kind == "finish"  # closing tag appended, as platoon does
    assert parse_textcraft("<python>\n    craft({'a': 1}, ('b', 1))\n    view_inventory()\n</python>").valid


def test_textcraft_delegations_and_the_delegation_span():
    text = py('craft({"a": 1}, ("b", 1))\nresults = await asyncio.gather(\n    launch_subagent({"c": 2}, "use b"),\n'
              '    launch_subagent(targets={"d": 1}, num_steps=9),\n)')
    r = parse_textcraft(text)
    assert r.kind == "delegate" and len(r.calls) == 1
    assert [(dict(d.targets), d.context, d.max_steps) for d in r.delegations] == [({"c": 2}, "use b", None),
                                                                                   ({"d": 1}, "", 9)]
    assert r.delegations[0].goal == textcraft_goal({"c": 2}, "use b")
    assert r.delegations[1].goal == "Craft the following items: 1x d"
    assert text[slice(*r.delegate_span)].startswith("results = await asyncio.gather(")
    assert text[slice(*r.delegate_span)].endswith(")") and "craft(" not in text[slice(*r.delegate_span)]
    r = parse_textcraft(py('await launch_subagent({"c": 2}, 12)'))  # platoon's older (targets, num_steps)
    assert r.delegations[0].max_steps == 12 and r.delegations[0].context == ""
    text = py('finish("é")') + py('await launch_subagent({"é_item": 1}, "naïve ünïcode")')
    text = py('view_inventory()  # ünïcode\nawait launch_subagent({"é_item": 1}, "naïve")')
    r = parse_textcraft(text)
    assert text[slice(*r.delegate_span)] == 'await launch_subagent({"é_item": 1}, "naïve")'
    text = "<python>\n    view_inventory()\n    await launch_subagent({'x': 1})\n</python>"
    r = parse_textcraft(text)
    assert text[slice(*r.delegate_span)] == "await launch_subagent({'x': 1})"


def test_format_call_round_trips():
    code = "\n".join([format_call("craft", {"a": 2, "b": 1}, ("c", 3)), format_call("get_info", ["a", "b"]),
                      format_call("launch_subagent", {"d": 4}, 'say "hi"')])
    r = parse_textcraft(py(code))
    assert r.calls[0].args == {"ingredients": {"a": 2, "b": 1}, "target": ("c", 3)}
    assert r.calls[1].args == {"items": ["a", "b"]} and r.delegations[0].context == 'say "hi"'


ADVERSARIAL = [
    "import os",
    "from os import system",
    "os.system('touch {path}')",
    "__import__('os').system('touch {path}')",
    "exec(\"open('{path}', 'w')\")",
    "eval(\"open('{path}', 'w')\")",
    "open('{path}', 'w')",
    "craft({{'a': __import__('os').system('touch {path}')}}, ('b', 1))",
    "craft({{'a': len('xx')}}, ('b', 1))",
    "craft(**{{'ingredients': {{'a': 1}}, 'target': ('b', 1)}})",
    "craft(*[{{'a': 1}}, ('b', 1)])",
    "craft({{'a': 1}}, ('b', 1)).__class__",
    "x = 1",
    "n = 2\ncraft({{'a': n}}, ('b', 1))",
    "craft({{'a': 1 + 1}}, ('b', 1))",
    "craft({{f'a{{1}}': 1}}, ('b', 1))",
    "for i in range(3):\n    craft({{'a': 1}}, ('b', 1))",
    "if True:\n    view_inventory()",
    "while True:\n    pass",
    "lambda: craft({{'a': 1}}, ('b', 1))",
    "[craft({{'a': 1}}, ('b', 1)) for _ in range(9)]",
    "def craft(a, b):\n    pass",
    "class X: pass",
    "with open('{path}') as f: pass",
    "del view_inventory",
    "global x",
    "asyncio.run(launch_subagent({{'a': 1}}))",
    "asyncio.gather(craft({{'a': 1}}, ('b', 1)))",
    "asyncio.gather()",
    "craft({{'a': 1}}, ('b', 1), 3)",
    "craft({{'a': 1}})",
    "craft({{'a': 1}}, ('b', 1), ingredients={{}})",
    "craft({{'a': 0}}, ('b', 1))",
    "craft({{'a': -1}}, ('b', 1))",
    "craft({{'a': True}}, ('b', 1))",
    "craft({{'a': 1.5}}, ('b', 1))",
    "craft({{}}, ('b', 1))",
    "craft({{'a': 1}}, ('b', 0))",
    "craft({{'a': 1}}, 'b')",
    "craft({{1: 1}}, ('b', 1))",
    "get_info([])",
    "get_info([1, 2])",
    "finish(3)",
    "finish('done')\nview_inventory()",
    "launch_subagent({{'a': 1}})\nview_inventory()",
    "await launch_subagent({{'a': 1}})\nawait launch_subagent({{'b': 1}})",
    "launch_subagent({{}})",
    "launch_subagent({{'a': 1}}, context=3)",
    "launch_subagent({{'a': 1}}, num_steps=-2)",
    "print(view_inventory(), 1)",
    "view_inventory(1)",
    "launch(1)",
    "craft(" + "(" * 400 + ")" * 400 + ")",
    "craft({{'a': " + "9" * 5000 + "}}, ('b', 1))",
    "x = [" * 300 + "]" * 300,
    "\0",
    "craft({{'a': 1}}, ('b', 1)",
    "  craft({{'a': 1}}, ('b', 1))\ncraft({{'a': 1}}, ('b', 1))",
    "",
    "'''only a docstring'''",
]


@pytest.mark.parametrize("code", ADVERSARIAL)
def test_adversarial_code_is_invalid_and_never_runs(code, tmp_path, monkeypatch):
    path = tmp_path / "pwned"
    text = py(code.format(path=path))

    ran = []
    code = code.format(path=path)
    dedented = code.strip()

    def spy(original):  # jaxtyping's runtime checks exec code of their own: only the reply's code is a finding
        def call(*args, **kwargs):
            source = args[0] if args else ""
            if isinstance(source, str) and dedented and dedented in source:
                flags = args[3] if len(args) > 3 else kwargs.get("flags", 0)
                if original is not compile_ or not flags & ast.PyCF_ONLY_AST:  # ast.parse: an AST, nothing run
                    ran.append(source)
            return original(*args, **kwargs)
        return call

    compile_ = builtins.compile
    for name in ("exec", "eval", "compile"):
        monkeypatch.setattr(builtins, name, spy(getattr(builtins, name)))
    monkeypatch.setattr(os, "system", lambda *a: ran.append(a))
    try:
        r = parse_textcraft(text)
    finally:
        monkeypatch.undo()
    assert not ran
    assert r.kind == "invalid" and r.error, (code, r)
    assert not path.exists()


def test_length_and_call_limits():
    assert parse_textcraft(py("view_inventory()\n" * MAX_CALLS)).valid
    assert not parse_textcraft(py("view_inventory()\n" * (MAX_CALLS + 1))).valid
    assert not parse_textcraft(py("view_inventory()" + " " * 20_000)).valid
    assert not parse_textcraft("craft({'a': 1}, ('b', 1))").valid  # no <python> block


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_random_text_never_raises(text):
    for reply in (parse_textcraft(text), parse_textcraft(py(text)), parse_textworld(text),
                  parse_textworld(f"<delegate>{text}</delegate>")):
        assert reply.kind in ("act", "delegate", "finish", "invalid")
        assert reply.valid or reply.error

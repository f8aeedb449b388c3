import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentjax.agents import (
    FALLBACK_CHARS,
    INVALID_PENALTY,
    MAX_ACTION_BYTES,
    Projected,
    normalize,
    project_action,
    project_mdp,
    project_sokoban,
    project_textcraft,
    project_webshop,
)

ADMISSIBLE = ("go to countertop 1", "take mug 1 from countertop 1", "look")
PROJECTIONS = (project_action, project_sokoban, project_webshop, project_textcraft)


def reply(action: str, think: str = "The mug is on the countertop.") -> str:
    return f"<think>{think}</think>\n<action>{action}</action>"


def test_invalid_penalty_is_the_methods_default():
    assert INVALID_PENALTY == 0.1


def test_well_formed_reply():
    assert project_action(reply("take mug 1 from countertop 1"), ADMISSIBLE) == Projected(
        "take mug 1 from countertop 1", True, "ok"
    )


def test_case_and_whitespace_are_normalised():
    p = project_action("<think>x</think>  <action>\n  Go To   CounterTop 1 \n</action>\n")
    assert p == Projected("go to countertop 1", True, "ok")
    # tags in any case; the admissible spelling is returned
    p = project_action("<THINK>x</Think><Action>GO TO countertop 1</ACTION>", ("Go To CounterTop 1",))
    assert p == Projected("Go To CounterTop 1", True, "ok")
    assert project_action(reply("Look Around"), lowercase=False).action == "Look Around"


def test_missing_action_sends_the_tail_of_the_reply():
    text = "<think>I should look around the room before acting.</think> I will look around the room now"
    p = project_action(text)
    assert p.valid is False and p.reason == "no_action"
    assert p.action == normalize(text[-FALLBACK_CHARS:]) == "will look around the room now"
    assert project_action("") == Projected("", False, "no_action")


def test_unclosed_action():
    p = project_action("<think>x</think><action>go to countertop 1")
    assert p.valid is False and p.reason == "unclosed_action"
    p = project_action("<think>x</think><action>go to countertop 1<action>")
    assert p.reason == "unclosed_action"


def test_multiple_actions_are_invalid_and_the_last_block_is_sent():
    p = project_action("<think>x</think><action>look</action><action>go to countertop 1</action>", ADMISSIBLE)
    assert p == Projected("go to countertop 1", False, "multiple_actions")
    # a stray extra tag is enough
    assert project_action(reply("look") + "</action>").reason == "multiple_actions"
    assert project_action("<think>x</think><action><action>look</action>").reason == "multiple_actions"
    assert project_action("<think>x</think><action><action>look</action>").action == "look"


def test_empty_action():
    assert project_action(reply("")) == Projected("", False, "empty_action")
    assert project_action(reply(" \n\t ")) == Projected("", False, "empty_action")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<action>look</action>", "missing_think"),
        ("<think>x<action>look</action>", "missing_think"),
        ("x</think><action>look</action>", "missing_think"),
        ("<think>a</think><think>b</think><action>look</action>", "malformed_think"),
        ("</think>x<think><action>look</action>", "malformed_think"),
        ("<action>look</action><think>x</think>", "malformed_think"),
        ("<think>x <action>look</action></think>", "malformed_think"),
    ],
)
def test_think_block_is_required(text, reason):
    p = project_action(text)
    assert p == Projected("look", False, reason)  # the action is still sent
    assert project_action(text, require_think=False) == Projected("look", True, "ok")


def test_chinese_characters_anywhere_make_the_reply_invalid():
    assert project_action(reply("look", think="我应该先看看")) == Projected("look", False, "chinese")
    assert project_action(reply("去 countertop 1")).reason == "chinese"
    assert project_action(reply("look", think="café, naïve, Ünïcode")).valid  # other non-ASCII is fine


def test_admissible_check_is_optional():
    p = project_action(reply("go to desk 1"), ADMISSIBLE)
    assert p == Projected("go to desk 1", True, "ok")
    assert project_action(reply("go to desk 1"), ADMISSIBLE, require_admissible=True) == Projected(
        "go to desk 1", False, "not_admissible"
    )
    assert project_action(reply("Look"), ADMISSIBLE, require_admissible=True) == Projected("look", True, "ok")
    assert project_action(reply("go to desk 1"), None, require_admissible=True).valid  # no list: no check
    # a format failure is reported before admissibility
    assert project_action("<action>go to desk 1</action>", ADMISSIBLE, require_admissible=True).reason == (
        "missing_think"
    )


@pytest.mark.parametrize(
    "action, expected", [("up", "up"), ("Up", "up"), (" DOWN. ", "down"), ("move left", "left"), ("right!", "right")]
)
def test_sokoban_directions(action, expected):
    assert project_sokoban(reply(action)) == Projected(expected, True, "ok")


@pytest.mark.parametrize("action", ["still", "left then up", "upward", "north"])
def test_sokoban_rejects_no_or_several_directions(action):
    p = project_sokoban(reply(action))
    assert p.valid is False and p.reason == "bad_format" and p.action == normalize(action)


def test_sokoban_structural_failures_keep_their_reason():
    assert project_sokoban("<action>Up</action>") == Projected("up", False, "missing_think")
    assert project_sokoban("I go up").reason == "no_action"


def test_webshop_actions():
    assert project_webshop(reply("search[ Red  Running Shoes ]")) == Projected("search[red running shoes]", True, "ok")
    admissible = ("search[<your query>]", "click[Buy Now]", "click[< Prev]")
    assert project_webshop(reply("click[buy now]"), admissible, require_admissible=True) == Projected(
        "click[Buy Now]", True, "ok"
    )
    assert project_webshop(reply("search[shoes]"), admissible, require_admissible=True).valid
    p = project_webshop(reply("search[shoes]"), ("click[buy now]",), require_admissible=True)
    assert p == Projected("search[shoes]", False, "not_admissible")
    p = project_webshop(reply("click[item 9]"), admissible, require_admissible=True)
    assert p == Projected("click[item 9]", False, "not_admissible")
    for bad in ("buy now", "search[]", "click [buy now]", "search[shoes] please"):
        p = project_webshop(reply(bad))
        assert p.valid is False and p.reason == "bad_format", bad
    assert project_webshop("<action>click[buy now]</action>").reason == "missing_think"


def test_mdp_labels():
    exits = ("north", "blue door", "gate")
    assert project_mdp("<action>Blue  Door</action>", exits, require_think=False) == Projected("blue door", True, "ok")
    assert project_mdp(reply("gate"), exits) == Projected("gate", True, "ok")
    assert project_mdp("<action>west</action>", exits, require_think=False) == Projected("west", False,
                                                                                           "not_admissible")
    assert project_mdp("north", exits, require_think=False) == Projected("north", False, "no_action")
    assert project_mdp("<action>gate</action>", exits).reason == "missing_think"


def test_textcraft_commands():
    for command in ("get 1 oak log", "craft 4 oak planks using 1 oak log", "inventory", "Get  2  Stick"):
        assert project_textcraft(reply(command)) == Projected(normalize(command), True, "ok")
    for bad in ("look around", "craft 4 oak planks", "get", "inventory now"):
        p = project_textcraft(reply(bad))
        assert p == Projected(normalize(bad), False, "bad_format"), bad


@pytest.mark.parametrize("project", PROJECTIONS)
def test_an_action_over_the_limit_is_invalid_and_sent_cut(project):
    """A block of 10,000 characters (here a valid command repeated, with one direction word) is ``too_long``: the
    env gets its first FALLBACK_CHARS characters; a structural failure keeps its own reason, the action is still
    cut; an action of exactly the limit is judged as usual."""
    long = "get 1 stick " + "x" * 10_000 + " up"
    p = project(reply(long))
    assert p.valid is False and p.reason == "too_long" and len(p.action) <= FALLBACK_CHARS
    assert long.startswith(p.action) or project is project_sokoban  # sokoban: no direction in the first 30 chars
    p = project(f"<action>{long}</action>")
    assert p.reason == "missing_think" and len(p.action) <= FALLBACK_CHARS
    fits = "get " + "a" * (MAX_ACTION_BYTES - 4)
    assert project_textcraft(reply(fits)) == Projected(fits, True, "ok")
    assert project_textcraft(reply(fits + "a")).reason == "too_long"
    wide = "get " + "\U0001f600" * ((MAX_ACTION_BYTES - 4) // 4 + 1)  # fewer characters than the limit, more bytes
    assert len(wide) < MAX_ACTION_BYTES and project_textcraft(reply(wide)).reason == "too_long"


_PIECES = st.sampled_from(
    ["<think>", "</think>", "<action>", "</action>", "<ACTION>", "</Think>", "up", "left", "search[", "click[", "]",
     "get 1 ", "craft", " using ", "inventory", "中", " ", "\n", "go to countertop 1", "<", ">", "/"]
)
_TEXTS = st.one_of(st.text(), st.lists(st.one_of(_PIECES, st.text(max_size=4)), max_size=30).map("".join))


@settings(max_examples=300, deadline=None)
@given(_TEXTS, st.booleans(), st.booleans())
def test_projection_never_raises(text, require_think, require_admissible):
    for project in PROJECTIONS:
        kwargs = dict(require_think=require_think)
        if project is not project_sokoban:
            kwargs["require_admissible"] = require_admissible
        p = project(text, ADMISSIBLE, **kwargs)
        assert isinstance(p.action, str) and len(p.action.encode("utf-8", "surrogatepass")) <= MAX_ACTION_BYTES
        assert p.valid == (p.reason == "ok")
        if "<action>" not in text.lower():
            assert p.valid is False and p.reason == "no_action"
        if p.valid:
            assert "<action>" in text.lower() and "</action>" in text.lower()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(exclude_characters="<", exclude_categories=["Cs"]), min_size=1))
def test_any_tagged_action_round_trips(action):
    p = project_action(reply(action))
    if not action.split():
        assert p.reason == "empty_action"
    elif any("\u4e00" <= c <= "\u9fff" for c in action):
        assert p.reason == "chinese"
    elif len(normalize(action).encode("utf-8", "surrogatepass")) > MAX_ACTION_BYTES:
        assert p.reason == "too_long"
    else:
        assert p == Projected(normalize(action), True, "ok")

"""Compact prompts (agentjax.agents.compact): one token per Sokoban cell with the real tokenizer, the observation
last, no history for fully observed envs, every env has a compact template, the collector and warm start use it."""

import pytest

from agentjax.agents.compact import COMPACT_TEMPLATES, ROW_END, SOKOBAN, sokoban_grid, templates
from agentjax.agents.prompts import TEMPLATES, build_messages, encode_prompt
from agentjax.models import load_tokenizer
from envs.sokoban.env import SokobanEnv


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


ROOMS = ("######\n#__O_#\n#_X__#\n#_P#_#\n#____#\n######", "######\n#√_S_#\n#_X__#\n#O_#_#\n#__X_#\n######")


@pytest.mark.parametrize("text", ROOMS)
def test_sokoban_grid_is_one_token_per_cell(tok, text):
    rows = text.split("\n")
    shown = sokoban_grid(text)
    ids = tok.encode(shown, add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert len(ids) == sum(len(r) for r in rows) + len(rows)  # 36 cells + 6 row ends
    expected = [p for r in rows for p in [" " + ("*" if c == "√" else c) for c in r] + [ROW_END]]
    assert pieces == expected
    # every cell symbol is the same token wherever it sits (no context-dependent merges)
    assert len({(p, i) for p, i in zip(pieces, ids, strict=True)}) == len(set(pieces))


def test_sokoban_prompt_ends_with_the_grid_and_is_short(tok):
    env = SokobanEnv()
    obs = env.reset(SokobanEnv.tasks("train")[0])
    messages = build_messages(SOKOBAN, obs, [], 0, 0)
    assert messages[0] == {"role": "system", "content": SOKOBAN.system}
    assert messages[-1]["content"].endswith(sokoban_grid(obs.text))
    compact = encode_prompt(tok, messages)
    verl = encode_prompt(tok, build_messages(TEMPLATES["sokoban"], obs, [], 0, 2))
    grid = tok.encode(sokoban_grid(obs.text), add_special_tokens=False)
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert compact[-len(tail) - len(grid):-len(tail)] == grid  # the grid sits right before the reply
    assert len(compact) < 130 < len(verl)


def test_every_env_has_a_compact_template():
    assert set(COMPACT_TEMPLATES) == set(TEMPLATES)
    assert templates("compact") is COMPACT_TEMPLATES and templates("verl-agent") is TEMPLATES
    with pytest.raises(ValueError, match="prompt style"):
        templates("long")


def test_text_env_template_shows_actions_then_observation():
    from envs.base import Obs
    obs = Obs("You are in the kitchen.", "k", ("go north", "open fridge"), "Your task is to: cook.")
    text = build_messages(COMPACT_TEMPLATES["alfworld"], obs, [("You wake up.", "look")], 1, 2)[-1]["content"]
    assert text.endswith("Actions: go north; open fridge.\nObservation: You are in the kitchen.")
    assert "Task: cook." in text and "'You wake up.'" in text

import dataclasses

import pytest

from agentjax.agents import (
    ALFWORLD,
    SOKOBAN,
    TEMPLATES,
    WEBSHOP,
    build_messages,
    build_prompt,
    encode_prompt,
    render_history,
    task_description,
)
from envs.base import Obs

HINT = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed "
    "within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for current step and present it "
    "within <action> </action> tags."
)

OBS0 = Obs(
    text="You are in the middle of a room. Looking quickly around you, you see a countertop 1 and a sinkbasin 1.\n\n"
    "Your task is to: put a clean mug in coffeemachine.",
    anchor="room",
    admissible=("go to countertop 1", "go to sinkbasin 1", "look"),
    instruction="Your task is to: put a clean mug in coffeemachine.",
)
OBS3 = Obs(
    text="You arrive at countertop 1. On the countertop 1, you see a mug 1.",
    anchor="countertop",
    admissible=("take mug 1 from countertop 1", "go to sinkbasin 1"),
    instruction="Your task is to: put a clean mug in coffeemachine.",
)
HISTORY = (
    ("o1", "go to sinkbasin 1"),
    ("You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing.", "look"),
    ("You are facing the sinkbasin 1.", "go to countertop 1"),
)


def test_alfworld_first_turn_exact():
    expected = (
        "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: put a clean mug in "
        "coffeemachine.\n"
        "Your current observation is: You are in the middle of a room. Looking quickly around you, you see a "
        "countertop 1 and a sinkbasin 1.\n\nYour task is to: put a clean mug in coffeemachine.\n"
        "Your admissible actions of the current situation are: ['go to countertop 1'\n 'go to sinkbasin 1'\n "
        "'look'].\n"
        "\n" + HINT
    )
    assert build_prompt(ALFWORLD, OBS0, (), step=0) == expected


def test_alfworld_step3_two_record_window_exact():
    expected = (
        "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: put a clean mug in "
        "coffeemachine.\n"
        "Prior to this step, you have already taken 3 step(s). Below are the most recent 2 observations and the "
        "corresponding actions you took: "
        "[Observation 2: 'You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing.', Action 2: 'look']\n"
        "[Observation 3: 'You are facing the sinkbasin 1.', Action 3: 'go to countertop 1']\n"
        "You are now at step 4 and your current observation is: You arrive at countertop 1. On the countertop 1, "
        "you see a mug 1.\n"
        "Your admissible actions of the current situation are: ['take mug 1 from countertop 1'\n "
        "'go to sinkbasin 1'].\n"
        "\n" + HINT
    )
    assert build_prompt(ALFWORLD, OBS3, HISTORY, step=3, history_length=2) == expected
    # the caller may pass only the window: same prompt
    assert build_prompt(ALFWORLD, OBS3, HISTORY[1:], step=3) == expected


@pytest.mark.parametrize("history_length", [1, 2, 3, 5, 10])
def test_history_is_truncated_to_the_last_records(history_length):
    step = 6
    history = [(f"obs number {j}", f"act number {j}") for j in range(1, step + 1)]
    prompt = build_prompt(ALFWORLD, OBS3, history, step=step, history_length=history_length)
    k = min(step, history_length)
    for j in range(1, step + 1):
        shown = j > step - k
        assert (f"[Observation {j}: 'obs number {j}', Action {j}: 'act number {j}']" in prompt) == shown
    assert f"the most recent {k} observations" in prompt
    assert "already taken 6 step(s)" in prompt and "You are now at step 7" in prompt


def test_short_episode_shows_every_record():
    prompt = build_prompt(ALFWORLD, OBS3, HISTORY[:1], step=1, history_length=2)
    assert "the most recent 1 observations and the corresponding actions you took: [Observation 1: 'o1', " in prompt
    assert "\n[Observation" not in prompt


def test_history_length_zero_uses_the_first_turn_template():
    assert build_prompt(ALFWORLD, OBS3, HISTORY, step=3, history_length=0) == build_prompt(ALFWORLD, OBS3, (), 0)


def test_render_history():
    assert render_history([("a", "b"), ("c", "d")], first_step=4) == (
        "[Observation 4: 'a', Action 4: 'b']\n[Observation 5: 'c', Action 5: 'd']"
    )
    assert render_history([], first_step=1) == ""


def test_build_prompt_rejects_inconsistent_arguments():
    with pytest.raises(ValueError, match="step must be"):
        build_prompt(ALFWORLD, OBS3, (), step=-1)
    with pytest.raises(ValueError, match="history_length must be"):
        build_prompt(ALFWORLD, OBS3, HISTORY, step=3, history_length=-1)
    with pytest.raises(ValueError, match="only 2 steps taken"):
        build_prompt(ALFWORLD, OBS3, HISTORY, step=2)
    with pytest.raises(ValueError, match="needs 2 records"):
        build_prompt(ALFWORLD, OBS3, HISTORY[:1], step=3)


def test_no_admissible_list_drops_the_block():
    obs = OBS3._replace(admissible=None)
    prompt = build_prompt(ALFWORLD, obs, (), 0)
    assert "admissible actions of the current situation" not in prompt
    assert "you see a mug 1.\n\nNow it's your turn" in prompt


def test_task_description_strips_the_prefix():
    assert task_description("Your task is to: put a mug in desk.") == "put a mug in desk."
    assert task_description("  your task is to:heat an egg ") == "heat an egg"
    assert task_description("i need a red shirt") == "i need a red shirt"
    assert build_prompt(ALFWORLD, OBS0, (), 0).count("Your task is to: put") == 2  # intro + ALFWorld's own obs


def test_braces_in_observations_are_literal():
    obs = OBS3._replace(text="a {weird} {0} observation", admissible=("say {x}",))
    prompt = build_prompt(ALFWORLD, obs, (("{}", "{step_count}"),), step=1)
    assert "a {weird} {0} observation" in prompt and "'say {x}'" in prompt
    assert "[Observation 1: '{}', Action 1: '{step_count}']" in prompt


def test_webshop_lists_one_action_per_line():
    obs = Obs(text="WebShop [SEP] Search", anchor="s", admissible=("search[<your query>]", "click[back to search]"),
              instruction="i need a long clip-in hair extension, and price lower than 40.00 dollars")
    prompt = build_prompt(WEBSHOP, obs, (), 0)
    assert prompt.startswith(
        "You are an expert autonomous agent operating in the WebShop e-commerce environment.\n"
        "Your task is to: i need a long clip-in hair extension, and price lower than 40.00 dollars\n"
        "Your current observation is: WebShop [SEP] Search\n"
        "Your admissible actions of the current situation are:\n[\n'search[<your query>]',\n'click[back to search]',"
        "\n].\n\nNow it's your turn to take one action for the current step.\n"
    )


def test_sokoban_shows_the_grid_on_its_own_lines():
    grid = "######\n#_P__#\n#_X_O#\n######"
    obs = Obs(text=grid, anchor=grid, admissible=None, instruction="Push every box onto a target.")
    prompt = build_prompt(SOKOBAN, obs, ((grid, "up"),), step=1)
    assert f"Action 1: 'up']\nYou are now at step 2 and your current observation is:\n{grid}\n" in prompt
    assert 'Your admissible actions are ["up", "down", "left", "right"].\n\nNow it\'s your turn' in prompt
    assert "- Box on Target (`√`)" in prompt


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_template_formats(name):
    template = TEMPLATES[name]
    assert template.name == name
    for step, history in ((0, ()), (3, HISTORY)):
        prompt = build_prompt(template, OBS3, history, step)
        assert OBS3.text in prompt and template.action_hint in prompt
        assert "<think> </think>" in prompt and "<action> </action>" in prompt
        assert prompt == prompt.strip() and "observaitons" not in prompt and " \n" not in prompt
        assert "{" not in prompt and "}" not in prompt  # every placeholder filled
        if step:
            assert "[Observation 3: 'You are facing the sinkbasin 1.', Action 3: 'go to countertop 1']" in prompt


def test_templates_are_read_only_data():
    assert set(TEMPLATES) == {"alfworld", "sokoban", "webshop", "textcraft", "textcraft_synth", "textworld",
                              "textworld_sync", "mdp"}
    with pytest.raises(TypeError):
        TEMPLATES["new"] = ALFWORLD  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ALFWORLD.first_turn = ""  # type: ignore[misc]


def test_every_environment_has_a_template_and_a_projector():
    from agentjax.rollout.collect import PROJECTORS
    from envs.alfworld import AlfWorldEnv
    from envs.mdp import MDPEnv
    from envs.sokoban import SokobanEnv
    from envs.textcraft import TextCraftEnv, TextCraftSynthEnv
    from envs.textworld import TextWorldCookingEnv
    from envs.textworld_sync import TextWorldSyncEnv
    from envs.webshop import WebShopEnv

    for env in (AlfWorldEnv, SokobanEnv, TextCraftEnv, TextCraftSynthEnv, TextWorldCookingEnv, TextWorldSyncEnv,
                WebShopEnv, MDPEnv):
        assert env.name in TEMPLATES and env.name in PROJECTORS, env.name


def test_build_messages():
    messages = build_messages(ALFWORLD, OBS3, HISTORY, 3)
    assert messages == [dict(role="user", content=build_prompt(ALFWORLD, OBS3, HISTORY, 3))]
    with_system = build_messages(dataclasses.replace(ALFWORLD, system="Be brief."), OBS0, (), 0)
    assert [m["role"] for m in with_system] == ["system", "user"] and with_system[0]["content"] == "Be brief."


@pytest.fixture(scope="module")
def tokenizer():
    from agentjax.models.tokenizer import load_tokenizer

    return load_tokenizer()


def test_encode_prompt_with_the_qwen_chat_template(tokenizer):
    from agentjax.models.tokenizer import IM_START_ID

    messages = build_messages(ALFWORLD, OBS3, HISTORY, 3)
    ids = encode_prompt(tokenizer, messages)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    assert ids[0] == IM_START_ID
    generation_prompt = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert generation_prompt[0] == IM_START_ID and len(generation_prompt) == 3
    assert ids[-3:] == generation_prompt
    text = tokenizer.decode(ids)
    assert text == tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are Qwen")  # Qwen2.5's default system prompt (no system)
    assert f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n" in text


def test_encode_prompt_reads_a_batch_encoding_answer():
    class DictTokenizer:
        def apply_chat_template(self, conversation, **kwargs):
            assert kwargs["add_generation_prompt"] and kwargs["tokenize"]
            return {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]}

    assert encode_prompt(DictTokenizer(), [dict(role="user", content="hi")]) == [1, 2, 3]

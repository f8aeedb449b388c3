"""The pre-registered settings (envs/mdp/settings.py) are the pre-registration's selected configs, and the env
builds them by name."""

import dataclasses
import json
import os

import pytest

from envs.mdp import SETTINGS, MDPConfig, MDPEnv, setting

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREREGISTRATION = os.path.join(ROOT, "experiments", "credit_testbed", "results", "preregistration.json")


def test_the_settings_equal_the_preregistration():
    with open(PREREGISTRATION) as f:
        selected = {name.lower(): entry["selected"]["config"] for name, entry in json.load(f)["settings"].items()}
    assert set(SETTINGS) == set(selected) == {"s1", "s2", "s3"}
    for name, config in SETTINGS.items():
        assert dataclasses.asdict(config) == selected[name], name
        assert MDPConfig(**selected[name]) == config


def test_the_env_takes_a_setting_by_name():
    for name, config in SETTINGS.items():
        env = MDPEnv(setting=name.upper())
        assert env.config == config and env.max_steps == config.step_cap
    assert setting("s2").step_cap == 14
    with pytest.raises(ValueError, match="unknown mdp setting 's4'"):
        MDPEnv(setting="s4")
    with pytest.raises(ValueError, match="not both"):
        MDPEnv(MDPConfig(), setting="s1")


def test_a_seed_offset_plays_other_members_of_the_family():
    from envs.mdp import mdp_of

    env, plain = MDPEnv(setting="s2", seed_offset=8), MDPEnv(setting="s2")
    task, member = MDPEnv.tasks("train")[1], MDPEnv.tasks("train")[9]
    assert env.mdp_seed(task) == 9 and env.model_of(task) is mdp_of(member, env.config) is plain.model_of(member)
    assert env.model_of(task) is not plain.model_of(task)
    assert env.reset(task).text == plain.reset(member).text and env.observations(task) == plain.observations(member)
    assert env.oracle() == plain.oracle()  # the optimal action of the member it plays
    snapshot = env.snapshot()
    env.step(env.oracle())
    assert env.restore(snapshot).text == plain.observations(member)[plain.model.start].text
    with pytest.raises(ValueError, match="seed_offset must be an int >= 0"):
        MDPEnv(setting="s2", seed_offset=-1)

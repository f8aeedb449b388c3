"""ALFWorld on the real engine: text, admissible commands, won and the hand-coded expert identical to ALFWorld's own
``AlfredTWEnv``, snapshot validation, invalid commands, the step limit, manifests. The planner and oracle tests
(walkthroughs and the planner win every task type, restore + oracle reproduces an uninterrupted episode) are in
test_alfworld_oracle.py, so that ``make test``'s two workers share the ALFWorld games.

Needs ``$ALFWORLD_DATA`` (``make test`` unpacks ``$AGENTJAX_DATA/alfworld/*.tar.xz`` into ``.data/alfworld``); a
missing data folder fails these tests, it does not skip them."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import random

import pytest

from envs.alfworld import TASK_TYPES, AlfWorldEnv, ReplayMismatch, task_params
from envs.alfworld.tasks import alfworld_root
from tests.envs.alfworld_common import JUNK, official_env, play


@pytest.fixture(scope="module")
def env() -> AlfWorldEnv:
    return AlfWorldEnv()

# -- data and manifests --------------------------------------------------------------------------------------------
def test_missing_data_is_a_clear_error(monkeypatch, tmp_path, unseen):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA.*alfworld-download"):
        AlfWorldEnv().reset(unseen[0])
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="json_2.1.1.*ALFWORLD_DATA"):
        AlfWorldEnv().reset(unseen[0])
    (tmp_path / "json_2.1.1").mkdir()
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA should contain json_2.1.1/valid_unseen/"):
        AlfWorldEnv().reset(unseen[0])
    assert len(AlfWorldEnv.tasks("valid_seen")) == 140  # the manifest itself is committed: no data needed


def test_manifests_and_task_types(unseen):
    counts = {s: len(AlfWorldEnv.tasks(s)) for s in ("train", "valid_seen", "valid_unseen", "valid_train")}
    assert counts == {"train": 3553, "valid_seen": 140, "valid_unseen": 134, "valid_train": 200}
    by_type = {t: sum(task.meta["task_type"] == t for task in unseen) for t in TASK_TYPES}
    assert by_type == {  # data/README.md: 24 put / 31 clean / 23 heat / 21 cool / 18 examine / 17 put-two
        "pick_and_place_simple": 24,
        "pick_clean_then_place_in_recep": 31,
        "pick_heat_then_place_in_recep": 23,
        "pick_cool_then_place_in_recep": 21,
        "look_at_obj_in_light": 18,
        "pick_two_obj_and_place": 17,
    }
    root = alfworld_root()
    for split in counts:
        tasks = AlfWorldEnv.tasks(split)
        ids = [t.task_id for t in tasks]
        assert ids == sorted(set(ids)) and all(i.startswith(f"json_2.1.1/{split}/") for i in ids)
        assert {t.env for t in tasks} == {"alfworld"} and {t.split for t in tasks} == {split}
        assert all((root / i).is_file() for i in ids), f"{split}: a manifest game is missing under {root}"
        assert AlfWorldEnv.tasks(split) == tasks  # stable


def test_manifest_is_what_the_archives_hold():
    from envs.alfworld.make_manifest import split_games

    archives = pathlib.Path(os.environ.get("AGENTJAX_DATA", "../shared/data")) / "alfworld"
    for split in ("valid_seen", "valid_unseen"):
        games = split_games(archives / f"json_2.1.1_{split}.tar.xz", split)
        assert [(t.task_id, t.meta["task_type"]) for t in AlfWorldEnv.tasks(split)] == games


def test_task_params_from_folder_names_hand_checked():
    assert task_params("look_at_obj_in_light-AlarmClock-None-DeskLamp-308") == {
        "task_type": "look_at_obj_in_light",
        "pddl_params": {
            "object_target": "AlarmClock",
            "mrecep_target": "",
            "parent_target": "",
            "toggle_target": "DeskLamp",
            "object_sliced": False,
        },
    }
    params = task_params("pick_heat_then_place_in_recep-Egg-None-Fridge-10")["pddl_params"]
    assert (params["object_target"], params["parent_target"], params["toggle_target"]) == ("Egg", "Fridge", "")
    with pytest.raises(ValueError, match="not an ALFWorld task folder"):
        task_params("trial_T20190908_222917_366542")


# -- fidelity to ALFWorld's own AlfredTWEnv ------------------------------------------------------------------------
@pytest.mark.slow  # end to end, minutes of CI time: `make test-slow` (README, "Tests")
def test_text_admissible_won_and_handcoded_expert_match_alfworlds_own_env(sample, tmp_path):
    """Lock-step with ``AlfredTWEnv`` on the last three task types (the planner test below takes the first three):
    random commands (invalid ones and ``help`` too), then mostly the expert's; every observation, admissible list
    (less ``help``), won, done, reward and hand-coded expert command is the same (both experts draw from the same
    seed when they fall back to a random command). All 134 valid_unseen games agree the same way (a one-off run)."""
    tasks = {t.task_id: t for t in (sample[task_type][0] for task_type in TASK_TYPES[3:])}
    official = official_env(tmp_path, list(tasks))
    ours = AlfWorldEnv(max_steps=200, expert="handcoded")
    rng = random.Random(1)
    try:
        for _ in range(len(tasks)):
            texts, infos = official.reset()
            game = str(pathlib.Path(infos["extra.gamefile"][0]).relative_to(tmp_path))
            obs = ours.reset(tasks.pop(game))
            for i in range(40):
                assert obs.text == texts[0], (game, i)
                assert obs.admissible == tuple(c for c in infos["admissible_commands"][0] if c != "help")
                assert ours._expert_plan == infos["extra.expert_plan"][0], (game, i)
                if i < 6 or rng.random() < 0.15:
                    command = rng.choice([*obs.admissible, "help", *JUNK])
                else:
                    command = infos["extra.expert_plan"][0][0]
                random.seed(i)
                texts, _, dones, infos = official.step([command])
                random.seed(i)
                obs, reward, done, info = ours.step(command)
                assert (info["won"], done, reward) == (infos["won"][0], dones[0], 10.0 * infos["won"][0])
                if done:
                    break
            assert obs.text == texts[0]
        assert not tasks
    finally:
        official.close()


def test_memoised_translation_changes_nothing(sample, monkeypatch):
    """Resets share fast-downward's PDDL-to-SAS translation (env.py); an episode is the same without it."""
    import fast_downward

    import envs.alfworld.env as alfworld_env

    task = sample["pick_heat_then_place_in_recep"][0]

    def episode(env: AlfWorldEnv) -> list:
        rng = random.Random(5)
        obs = env.reset(task)
        results = [obs]
        while not env.done:
            command = rng.choice(obs.admissible) if env.steps < 4 else env.oracle()
            results.append(env.step(command))
            obs = results[-1][0]
        return results

    memoised = AlfWorldEnv()
    first = episode(memoised)
    hits = fast_downward.pddl2sas.cache_info().hits
    assert episode(memoised) == first and fast_downward.pddl2sas.cache_info().hits >= hits + 2
    monkeypatch.setattr(fast_downward, "pddl2sas", fast_downward.pddl2sas.__wrapped__)
    monkeypatch.setattr(alfworld_env, "_memoise_translation", lambda: None)
    assert episode(AlfWorldEnv()) == first


# -- snapshots -------------------------------------------------------------------------------------------------------
def test_restore_validates_the_replay(unseen, env):
    env.reset(unseen[0])
    play(env, env.walkthrough()[:2])
    snap = env.snapshot()
    with pytest.raises(ReplayMismatch, match="the snapshot recorded"):
        env.restore(dataclasses.replace(snap, text="You arrive at nowhere."))
    with pytest.raises(ReplayMismatch):
        env.restore(dataclasses.replace(snap, actions=snap.actions[:1]))
    with pytest.raises(ReplayMismatch, match="replay won after"):
        env.restore(dataclasses.replace(snap, actions=(*env.walkthrough(), "look")))
    assert env.restore(snap).text == snap.text and (env.steps, env.done) == (2, False)
    play(env, env.walkthrough()[2:])
    final = env.snapshot()
    assert final.done and env.restore(final).text == final.text and (env.steps, env.done) == (len(final.actions), True)
    env.restore(snap)
    assert not env.done and env.snapshot() == snap


# -- invalid commands and the step limit -----------------------------------------------------------------------------
def test_invalid_commands_do_not_crash_or_change_the_state(unseen, env):
    task = next(t for t in unseen if t.meta["task_type"] == "pick_and_place_simple")
    start = env.reset(task)
    for command in JUNK + ["help"]:
        obs, reward, done, info = env.step(command)
        assert (reward, done, info) == (0.0, False, {"won": False, "truncated": False, "valid": False})
        assert obs.admissible == start.admissible and obs.instruction == start.instruction
        if command != "help":
            assert obs.text == obs.anchor == "Nothing happens."
    assert "look" in env.step("help")[0].text.lower()  # the engine's help text; help is not admissible
    walkthrough = env.walkthrough()
    obs, _, _, info = env.step(f"  {walkthrough[0]} ")  # the engine strips commands: valid
    assert info["valid"] and obs.text.startswith("You ")
    *_, (_, reward, done, info) = play(env, walkthrough[1:])
    assert done and info["won"] and reward == 10.0
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("look")
    env.reset(task)
    with pytest.raises(TypeError):
        env.step(None)


def test_step_limit_truncates_at_50(unseen):
    env = AlfWorldEnv()
    env.reset(unseen[5])
    results = play(env, ["look"] * 50)
    assert [d for _, _, d, _ in results] == [False] * 49 + [True]
    assert results[-1][3] == {"won": False, "truncated": True, "valid": True}
    assert env.snapshot().done
    with pytest.raises(RuntimeError):
        env.oracle()


def test_constructor_checks():
    with pytest.raises(ValueError, match="expert"):
        AlfWorldEnv(expert="oracle")
    with pytest.raises(ValueError, match="unknown split"):
        AlfWorldEnv.tasks("test")
    with pytest.raises(RuntimeError, match="before reset"):
        AlfWorldEnv().snapshot()


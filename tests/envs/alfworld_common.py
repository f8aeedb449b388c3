"""Shared pieces of the ALFWorld tests (test_alfworld.py, test_alfworld_oracle.py; their fixtures are in conftest.py):
the sample size, the slow-planner filter, random prefixes, and ALFWorld's own ``AlfredTWEnv`` on linked games."""

from __future__ import annotations

import json
import pathlib
import random

from envs.alfworld import AlfWorldEnv, task_params
from envs.alfworld.tasks import alfworld_root
from envs.base import Task

JUNK = [
    "",
    "   ",
    "jump",
    "go to moon 1",
    "take everything",
    "put",
    "GO TO DESK 1",
    "go to desk 1 please",
    "💥",
    "x" * 500,
    "look\nlook",
    "open",
]
PER_TYPE = 2  # valid_unseen games per task type in the win tests


def slow_planner(task: Task) -> bool:
    """pick_two_obj_and_place in a kitchen (ALFRED scenes 1-30): the planner's first replans take 20-65 s there
    (a blind search over many objects), too slow for CI; the other valid_unseen games replanned in under 4 s here."""
    scene = int(task.task_id.split("/")[2].rsplit("-", 1)[1])
    return task.meta["task_type"] == "pick_two_obj_and_place" and scene <= 30


def play(env: AlfWorldEnv, commands) -> list[tuple]:
    return [env.step(c) for c in commands]


def random_prefix(env: AlfWorldEnv, rng: random.Random, n: int) -> None:
    """``n`` steps of random admissible commands, with an invalid one now and then."""
    for _ in range(n):
        if env.done:
            return
        obs = env._obs()
        env.step(rng.choice(JUNK) if rng.random() < 0.2 else rng.choice(obs.admissible))


def link_games(root: pathlib.Path, games: list[str]) -> None:
    """Links ``games`` into ``root`` with the ``traj_data.json`` (task_type, pddl_params) that ALFWorld's loader and
    hand-coded expert read."""
    for game in games:
        folder = root / pathlib.Path(game).parent
        folder.mkdir(parents=True)
        (folder / "game.tw-pddl").symlink_to(alfworld_root() / game)
        (folder / "traj_data.json").write_text(json.dumps(task_params(folder.parent.name)))


def official_env(root: pathlib.Path, games: list[str]):
    """ALFWorld's ``AlfredTWEnv`` (batch of 1, DAgger training mode, so that it computes ``expert_plan``) over
    ``games`` linked into ``root``.

    Its expert is the hand-coded one whatever ``expert_type`` says: ``init_env`` builds ``AlfredExpert(expert_type)``,
    which passes the type as the wrapped env and keeps the default ``expert_type="handcoded"``."""
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    link_games(root, games)
    config = {
        "env": {
            "goal_desc_human_anns_prob": 0,
            "task_types": [1, 2, 3, 4, 5, 6],
            "domain_randomization": False,
            "expert_type": "planner",
        },
        "dataset": {"data_path": str(root), "num_train_games": -1},
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": 1000}},
    }
    return AlfredTWEnv(config, train_eval="train").init_env(batch_size=1)

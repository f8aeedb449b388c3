"""ALFWorld fixtures shared by test_alfworld.py and test_alfworld_oracle.py (module-scoped: each file loads its own).
A test module that defines its own ``sample`` or ``env`` fixture (test_textworld*.py) overrides these."""

from __future__ import annotations

import random

import pytest

from envs.alfworld import TASK_TYPES, AlfWorldEnv
from envs.base import Task
from tests.envs.alfworld_common import PER_TYPE, slow_planner


@pytest.fixture(scope="module")
def unseen() -> list[Task]:
    return AlfWorldEnv.tasks("valid_unseen")


@pytest.fixture(scope="module")
def sample(unseen) -> dict[str, list[Task]]:
    """``PER_TYPE`` fixed valid_unseen games of each task type (seeded; not ``slow_planner`` games)."""
    rng = random.Random(0)
    pools = {t: [task for task in unseen if task.meta["task_type"] == t and not slow_planner(task)] for t in TASK_TYPES}
    return {t: rng.sample(pool, PER_TYPE) for t, pool in pools.items()}

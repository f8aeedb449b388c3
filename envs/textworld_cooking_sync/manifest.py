"""The fixed manifest of TextWorld-Sync on tw-cooking: 1,500 train / 200 valid / 1,400 test tasks (SERA App. C.3).

Train: 900 Medium, 150 Hard, 450 Extreme. Valid: 50 per difficulty. Test: 350 per difficulty. Within a block of
one split and difficulty, task ``i`` belongs to family ``FAMILIES[i % 7]`` (so every family appears in every block)
and has seed ``SPLIT_SEED[split] + i``; a task is rebuilt at reset from ``(family, difficulty, seed)``
(generate.py), so the manifest is a list of ids and seeds, not stored worlds. Seeds of different splits lie in
disjoint ranges, so no world is shared between splits.
"""

from __future__ import annotations

import functools

from envs.base import Task
from envs.textworld_cooking_sync.generate import DIFFICULTIES, FAMILIES, LEVELS

ENV = "textworld_cooking_sync"
SPLIT_SIZES: dict[str, dict[str, int]] = {
    "train": {"medium": 900, "hard": 150, "extreme": 450},
    "valid": {d: 50 for d in DIFFICULTIES},
    "test": {d: 350 for d in DIFFICULTIES},
}
SPLIT_SEED = {"train": 0, "valid": 1_000_000, "test": 2_000_000}


def task(split: str, difficulty: str, index: int) -> Task:
    """Task ``index`` of the ``(split, difficulty)`` block."""
    family = FAMILIES[index % len(FAMILIES)]
    meta = {"family": family, "difficulty": difficulty, "max_steps": LEVELS[difficulty].max_steps}
    return Task(
        env=ENV,
        task_id=f"{ENV}.{split}.{difficulty}.{index:04d}",
        split=split,
        seed=SPLIT_SEED[split] + index,
        meta=meta,
    )


@functools.cache
def _tasks(split: str) -> tuple[Task, ...]:
    return tuple(task(split, d, i) for d, n in SPLIT_SIZES[split].items() for i in range(n))


def tasks(split: str) -> list[Task]:
    """The split's tasks in a stable order (difficulty blocks, then index)."""
    if split not in SPLIT_SIZES:
        raise ValueError(f"{ENV}: unknown split {split!r}; splits are {tuple(SPLIT_SIZES)}")
    return list(_tasks(split))

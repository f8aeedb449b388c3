"""The released TextWorld-Sync tasks: 1,500 train / 200 validation / 1,400 test rows of SERA's files.

The files (``$AGENTJAX_DATA/textworld_sync``, else ``../shared/data/textworld_sync``: :func:`envs.base.data_root`;
their provenance is that folder's README) are read in place, decompressed with :mod:`lzma`:

=============  ==========================================  =====  ===========================================
split          file                                        rows   SERA's name
=============  ==========================================  =====  ===========================================
``train``      ``training/textworld_train.jsonl.xz``       1,500  fold ``train`` (no easy tasks)
``validation`` ``validation/textworld_dev.jsonl.xz``         200  fold ``dev`` (task ids keep ``dev``)
``test``       ``eval/textworld_test.jsonl.xz``            1,400  the evaluation manifest's tasks
=============  ==========================================  =====  ===========================================

SERA's training runtime reads the two JSONL files and its evaluator the test *manifest*
(``eval/textworld_multidish_test_1400_v9.json.xz``: the same tasks with ``game_params`` as a JSON string and dishes,
parallelism and family under ``generation_properties``); here every split is read from its JSONL file, whose rows
hold the same fields, and :func:`manifest_tasks` reads a manifest for the cross-check in the tests.

A :class:`~envs.base.Task` per row: ``task_id`` and ``seed`` of the row, ``split`` as above, ``meta`` =
``family``, ``difficulty``, ``view`` (structured / coarse), ``description`` (the row's ``task_description``: the
root agent's goal), ``dishes``, ``game_params`` (a dict), ``parallelism`` and ``budget`` (the task's own
``parallelism.shared_environment_max_steps``).

Order: the rows of a file come grouped by difficulty and family; :func:`tasks` interleaves them, one task of each
(difficulty, family) cell in turn (cells in order of first appearance, rows of a cell in file order), so that every
prefix of a split (an evaluation on its first N tasks) spreads over the cells. The set of tasks is the file's.
"""

from __future__ import annotations

import functools
import itertools
import json
import lzma
from typing import Any

from envs.base import Task, data_root

ENV = "textworld_sync"
FILES = {"train": "training/textworld_train.jsonl.xz", "validation": "validation/textworld_dev.jsonl.xz",
         "test": "eval/textworld_test.jsonl.xz"}
MANIFESTS = {"train": "training/textworld_multidish_train_1500_v9.json.xz",
             "validation": "validation/textworld_multidish_validation_200_v9.json.xz",
             "test": "eval/textworld_multidish_test_1400_v9.json.xz"}
SPLIT_SIZES = {"train": 1500, "validation": 200, "test": 1400}
FAMILIES = ("multi_dish_fork_join", "critical_path", "load_balanced", "resource_constrained", "dependency_gate",
            "conflict", "hierarchical")
DIFFICULTIES = ("easy", "medium", "hard", "extreme")
_HINT = " (the released TextWorld-Sync files: `agentjax data --only textworld_sync`)"


def _check_split(split: str) -> None:
    if split not in FILES:
        raise ValueError(f"unknown textworld_sync split {split!r}; splits are {list(FILES)}")


@functools.lru_cache(maxsize=3)
def rows(split: str) -> tuple[dict[str, Any], ...]:
    """The raw rows of a split's JSONL file, in file order (cached; callers must not mutate them)."""
    _check_split(split)
    path = data_root("textworld_sync", hint=_HINT) / FILES[split]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing{_HINT}")
    with lzma.open(path, "rt", encoding="utf-8") as f:
        out = tuple(json.loads(line) for line in f if line.strip())
    if len(out) != SPLIT_SIZES[split]:
        raise ValueError(f"{path} holds {len(out)} rows, expected {SPLIT_SIZES[split]}")
    return out


def task_from_row(row: dict[str, Any], split: str) -> Task:
    """The Task of one JSONL row (module docstring)."""
    params = row["game_params"]
    params = json.loads(params) if isinstance(params, str) else dict(params)
    parallelism = dict(row.get("parallelism") or {})
    meta = {"family": row["task_family"], "difficulty": row["difficulty"], "view": row.get("task_view", "structured"),
            "description": row["task_description"], "dishes": row["dishes"], "game_params": params,
            "parallelism": parallelism, "budget": int(parallelism.get("shared_environment_max_steps", 100))}
    return Task(env=ENV, task_id=str(row["task_id"]), split=split, seed=int(row["seed"]), meta=meta)


def interleave(items: list[Task]) -> list[Task]:
    """One task of each (difficulty, family) cell in turn (module docstring)."""
    cells: dict[tuple[str, str], list[Task]] = {}
    for t in items:
        cells.setdefault((t.meta["difficulty"], t.meta["family"]), []).append(t)
    return [t for group in itertools.zip_longest(*cells.values()) for t in group if t is not None]


@functools.lru_cache(maxsize=3)
def _tasks(split: str) -> tuple[Task, ...]:
    return tuple(interleave([task_from_row(r, split) for r in rows(split)]))


def tasks(split: str) -> list[Task]:
    """The tasks of a split, interleaved over the (difficulty, family) cells (module docstring)."""
    return list(_tasks(split))


def manifest_tasks(split: str) -> list[dict[str, Any]]:
    """The ``tasks`` of a split's evaluator manifest (SERA's ``TaskSpec`` rows), in file order."""
    _check_split(split)
    path = data_root("textworld_sync", hint=_HINT) / MANIFESTS[split]
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)["tasks"]

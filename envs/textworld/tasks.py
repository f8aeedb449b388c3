"""TextWorld CookingWorld's splits: the committed game manifest, the difficulty levels, the game cache's paths.

The games are those of ``tw-make tw-cooking`` (textworld 1.7.0, ``textworld.challenges.tw_cooking``, the generator
of the First TextWorld Problems competition, FTWP), made by :mod:`envs.textworld.generate`. Levels (``LEVELS``;
games per split and level in ``GAMES_PER_LEVEL``: 50 train / 10 valid / 20 test, 480 in all):

=====  ======  ====  ==  ====  ====  ===  =====  ====================================================================
level  recipe  take  go  open  cook  cut  score  modelled on
=====  ======  ====  ==  ====  ====  ===  =====  ====================================================================
1      1       1     1               x    4      GATA's level 1 (Adhikari et al. 2020): 1 ingredient, 1 room, cut
2      1       1     1         x     x    5      GATA's level 2: 1 ingredient, 1 room, cook and cut
3      1       1     9   x                3      GATA's level 3: 1 ingredient, 9 rooms; here doors / containers shut
4      3       3     6   x     x     x    11     GATA's level 4: 3 ingredients, 6 rooms, cook and cut
5      2       1     6   x     x     x    7      FTWP's ``take`` < ``recipe``: one ingredient starts in the inventory
6      3       3     12  x     x     x    11     FTWP's largest houses (12 rooms)
=====  ======  ====  ==  ====  ====  ===  =====  ====================================================================

(``score`` is the game's max score; the GATA columns are recipe size, rooms, cut / cook and max score; ``open`` and
``take`` are our choice.) The manifest split is also textworld's ``--split``: train games use the training foods and
preparations, valid and test games add foods and preparations no training game has. Seeds are
``SEED_BASE[split] + 1000 * level + i``, ``--recipe-seed 0``. No ``--drop`` (limited inventory): textworld stores no
walkthrough for those games.

``manifest.json`` (next to this file) fixes every game: id, split, level, seed, settings, max score, walkthrough
length and the SHA-256 of its ``.z8`` and ``.json`` files (``python -m envs.textworld.generate --write-manifest
--root EMPTY_DIR`` rebuilds it by generating every game). ``Task.task_id`` is the game id
``tw-cooking-<split>-<skills>-s<seed>`` (skills spelled as in textworld's own game uuids); ``Task.meta`` is the rest
of the entry, so a task alone rebuilds and checks its game on any machine.

Cache: ``$TEXTWORLD_GAMES`` (default ``$XDG_CACHE_HOME/agentjax/textworld``, i.e. ``~/.cache/agentjax/textworld``:
generated files, shared by every checkout of a user), one folder a game, ``<root>/<task_id>/game.z8`` with
``game.json`` next to it (textworld reads both), about 0.55 MB a game.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

from envs.base import Task

ENV_NAME = "textworld"
SPLITS = ("train", "valid", "test")
MANIFEST = pathlib.Path(__file__).with_name("manifest.json")
CACHE_VARIABLE = "TEXTWORLD_GAMES"
TEXTWORLD_VERSION = "1.7.0"  # the version the manifest's checksums come from
SKILLS = ("recipe", "take", "cook", "cut", "open", "go")  # textworld's SKILLS order (its game uuids), less drop


class GenerationError(RuntimeError):
    """A game could not be generated, or is not the game the manifest records."""


@dataclasses.dataclass(frozen=True)
class Level:
    """``tw-make tw-cooking`` settings of a difficulty level."""

    recipe: int  # ingredients in the recipe
    take: int  # ingredients to find (the others start in the inventory)
    go: int  # rooms: 1, 6, 9 or 12
    open: bool  # doors and containers start closed
    cook: bool  # ingredients must be cooked (fried / roasted / grilled)
    cut: bool  # ingredients must be cut (chopped / sliced / diced)


LEVELS: Mapping[int, Level] = {
    1: Level(recipe=1, take=1, go=1, open=False, cook=False, cut=True),
    2: Level(recipe=1, take=1, go=1, open=False, cook=True, cut=True),
    3: Level(recipe=1, take=1, go=9, open=True, cook=False, cut=False),
    4: Level(recipe=3, take=3, go=6, open=True, cook=True, cut=True),
    5: Level(recipe=2, take=1, go=6, open=True, cook=True, cut=True),
    6: Level(recipe=3, take=3, go=12, open=True, cook=True, cut=True),
}
GAMES_PER_LEVEL: Mapping[str, int] = {"train": 50, "valid": 10, "test": 20}
SEED_BASE: Mapping[str, int] = {"train": 0, "valid": 100_000, "test": 200_000}


def game_id(split: str, level: Level, seed: int) -> str:
    """``tw-cooking-<split>-<skills>-s<seed>``, e.g. ``tw-cooking-train-recipe1+take1+cut+go1-s1000``."""
    values = dataclasses.asdict(level)
    skills = "+".join(f"{k}{'' if values[k] is True else values[k]}" for k in SKILLS if values[k])
    return f"tw-cooking-{split}-{skills}-s{seed}"


def planned_entries(split: str) -> list[dict[str, Any]]:
    """A split's entries as ``LEVELS`` / ``GAMES_PER_LEVEL`` / ``SEED_BASE`` define them (without checksums)."""
    entries = []
    for number, level in LEVELS.items():
        for i in range(GAMES_PER_LEVEL[split]):
            seed = SEED_BASE[split] + 1000 * number + i
            settings = dataclasses.asdict(level)
            entries.append(dict(id=game_id(split, level, seed), split=split, seed=seed, level=number, **settings,
                                recipe_seed=0))
    return entries


def make_task(entry: Mapping[str, Any]) -> Task:
    """The task of a manifest entry: ``meta`` is the entry less ``id``, ``split`` and ``seed``."""
    meta = {k: v for k, v in entry.items() if k not in ("id", "split", "seed")}
    return Task(env=ENV_NAME, task_id=entry["id"], split=entry["split"], seed=int(entry["seed"]), meta=meta)


def task_entry(task: Task) -> dict[str, Any]:
    """The manifest entry of a task (the inverse of :func:`make_task`)."""
    if task.env != ENV_NAME or "recipe" not in task.meta:
        raise ValueError(f"{task.task_id!r} is not a TextWorld CookingWorld task (take them from tasks(split))")
    return dict(id=task.task_id, split=task.split, seed=task.seed, **task.meta)


@functools.lru_cache(maxsize=1)
def _manifest() -> Mapping[str, Any]:
    with open(MANIFEST) as f:
        return json.load(f)


@functools.lru_cache(maxsize=len(SPLITS))
def _tasks(split: str) -> tuple[Task, ...]:
    return tuple(make_task(entry) for entry in _manifest()["splits"][split])


def split_tasks(split: str) -> list[Task]:
    """The fixed manifest of a split, in its committed order (level, then seed)."""
    if split not in SPLITS:
        raise ValueError(f"{ENV_NAME}: unknown split {split!r}; splits are {SPLITS}")
    return list(_tasks(split))


def games_root(root: str | os.PathLike | None = None) -> pathlib.Path:
    """``root``, else ``$TEXTWORLD_GAMES``, else ``$XDG_CACHE_HOME/agentjax/textworld`` (``~/.cache/...``)."""
    if root is not None:
        return pathlib.Path(root).expanduser()
    if os.environ.get(CACHE_VARIABLE):
        return pathlib.Path(os.environ[CACHE_VARIABLE]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(cache).expanduser() / "agentjax" / "textworld"


def game_file(task: Task, root: str | os.PathLike | None = None) -> pathlib.Path:
    """Where a task's ``.z8`` lives (its ``.json`` next to it); it may not exist yet."""
    return games_root(root) / task.task_id / "game.z8"


def sha256(path: pathlib.Path) -> str:
    """SHA-256 of a game file; a ``.json`` game description is hashed in a canonical form (:func:`canonical_json`),
    so that the same game hashes alike in every checkout, virtual environment and Python build."""
    data = path.read_bytes()
    if path.suffix == ".json":
        data = canonical_json(data)
    return hashlib.sha256(data).hexdigest()


def canonical_json(data: bytes) -> bytes:
    """A game's ``.json`` with what varies between installs of the same textworld made uniform.

    - The absolute path of textworld's grammar folder (``KB.text_grammars_path``), which depends on where textworld
      was installed when the game was made (a cache is shared by checkouts and virtual environments): every
      absolute path into a ``textworld`` package folder becomes ``<textworld>/...``.
    - The order of ``grammar.names_to_exclude``, which textworld writes from a set of strings that holds ``None``:
      ``hash(None)`` is the address of ``None`` before Python 3.12 (so it moves with the interpreter build and with
      address-space randomisation) and a constant since, and the set's order follows it. The list is sorted
      (``None`` first); the game itself does not depend on it (textworld reads it back into a set, and the ``.z8``
      is identical byte for byte).
    Keys are sorted and the separators fixed, so the form does not depend on how the file was formatted."""
    game = _relative_paths(json.loads(data.decode()))
    names = game.get("grammar", {}).get("names_to_exclude")
    if isinstance(names, list):
        game["grammar"]["names_to_exclude"] = sorted(names, key=lambda n: (n is not None, n or ""))
    return json.dumps(game, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _relative_paths(value: Any) -> Any:
    """``value`` with every absolute path into a ``textworld`` package folder (the last ``/textworld/`` of the
    path: the package, not a folder above it) as ``<textworld>/...``."""
    if isinstance(value, dict):
        return {k: _relative_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative_paths(v) for v in value]
    if isinstance(value, str) and value.startswith("/") and (cut := value.rfind("/textworld/")) >= 0:
        return "<textworld>" + value[cut + len("/textworld"):]
    return value


def verify_game(entry: Mapping[str, Any], z8: pathlib.Path) -> None:
    """Raises :class:`GenerationError` unless both files' SHA-256 are the entry's (an entry without them passes)."""
    for suffix in ("z8", "json"):
        want = entry.get(f"{suffix}_sha256")
        path = z8.with_suffix(f".{suffix}")
        if want and (got := sha256(path)) != want:
            import textworld

            raise GenerationError(
                f"{path} is not the game the manifest records for {entry['id']} (SHA-256 {got[:12]}..., expected "
                f"{want[:12]}...). The manifest comes from textworld {TEXTWORLD_VERSION} on Python 3.11 with "
                f"PYTHONHASHSEED=0; this is textworld {textworld.__version__} on Python "
                f"{sys.version_info.major}.{sys.version_info.minor}. Delete {z8.parent} to regenerate it, or rebuild "
                "the manifest with `python -m envs.textworld.generate --write-manifest`."
            )

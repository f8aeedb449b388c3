"""TextWorld-Sync on tw-cooking: its task generator and fixed manifest (envs/textworld_cooking_sync/generate.py,
manifest.py). The rest of the engine's tests are in test_textworld_cooking_sync.py."""

from __future__ import annotations

import collections

import pytest

from envs.textworld_cooking_sync import (
    DIFFICULTIES,
    FAMILIES,
    LEVELS,
    SPLIT_SIZES,
    TextWorldCookingSyncEnv,
    generate,
    solvable,
)

SAMPLE = [(f, d, s) for f in FAMILIES for d in DIFFICULTIES for s in (0, 1)]  # 56 worlds: every family x difficulty


# -- generator and manifest --------------------------------------------------------------------------------------------
def test_manifest_sizes_and_ids():
    for split, sizes in SPLIT_SIZES.items():
        tasks = TextWorldCookingSyncEnv.tasks(split)
        assert collections.Counter(t.meta["difficulty"] for t in tasks) == sizes
        assert len({t.task_id for t in tasks}) == len(tasks)
        for d in sizes:
            families = collections.Counter(t.meta["family"] for t in tasks if t.meta["difficulty"] == d)
            assert set(families) == set(FAMILIES) and max(families.values()) - min(families.values()) <= 1
    assert [len(TextWorldCookingSyncEnv.tasks(s)) for s in ("train", "valid", "test")] == [1500, 200, 1400]
    assert SPLIT_SIZES["train"] == {"medium": 900, "hard": 150, "extreme": 450}
    seeds = [{(t.meta["family"], t.meta["difficulty"], t.seed) for t in TextWorldCookingSyncEnv.tasks(s)}
             for s in SPLIT_SIZES]
    assert not (seeds[0] & seeds[1]) and not (seeds[0] & seeds[2]) and not (seeds[1] & seeds[2])
    with pytest.raises(ValueError, match="split"):
        TextWorldCookingSyncEnv.tasks("val")


def test_generation_is_deterministic_and_scales_with_difficulty():
    for family, difficulty, seed in SAMPLE[::3]:
        assert generate(family, difficulty, seed) == generate(family, difficulty, seed)
    assert generate("parallel", "hard", 0) != generate("parallel", "hard", 1)
    for family, difficulty, seed in SAMPLE:
        s = generate(family, difficulty, seed)
        level = LEVELS[difficulty]
        assert solvable(s) and solvable(s, s.start_room), (family, difficulty, seed)
        assert len(s.rooms) == level.rooms
        if family != "imbalanced":
            assert level.dishes[0] <= len(s.dishes) <= level.dishes[1]
            assert all(level.ingredients[0] <= len(d.ingredients) <= level.ingredients[1] for d in s.dishes)
        foods = [i.food for d in s.dishes for i in d.ingredients]
        assert len(foods) == len(set(foods))  # disjoint recipes
        keys = [i for i in s.items.values() if i.kind == "key"]
        locked = [x for x in [*s.doors.values(), *s.furniture.values()] if x.state == "locked"]
        assert len(keys) == len(locked)
        if family == "parallel":
            assert not keys
        if family in ("sequential", "dag", "bottleneck", "nested") or (difficulty != "easy" and family != "parallel"):
            assert keys, (family, difficulty, seed)
        if family == "shared_tools":
            assert all(i.cooking != "raw" and i.cutting != "uncut" for d in s.dishes for i in d.ingredients)
            assert s.room_of(s.items["knife"]) != "kitchen" or s.items["knife"].where[0] == "in"
        if family == "imbalanced":
            sizes = sorted(len(d.ingredients) for d in s.dishes)
            assert sizes[-1] >= 3 and sizes[:-1] == [1] * (len(sizes) - 1)
        if difficulty == "easy":  # no closed doors (some may be locked)
            assert all(d.state != "closed" for d in s.doors.values())
    for diff_a, diff_b in zip(DIFFICULTIES, DIFFICULTIES[1:], strict=False):

        def locks(d):
            return sum(sum(i.kind == "key" for i in generate(f, d, 0).items.values()) for f in FAMILIES)

        assert locks(diff_a) < locks(diff_b)
    with pytest.raises(ValueError, match="families"):
        generate("chaos", "easy", 0)
    with pytest.raises(ValueError, match="difficulties"):
        generate("parallel", "impossible", 0)

"""The shared TextCraft-Synth inventory of a recursive-agent tree: the engine's rules, the stated count, atomicity."""

from __future__ import annotations

import threading
import time

import pytest

from envs.base import Task
from envs.textcraft import TextCraftSynthEnv
from envs.textcraft.shared import SharedCraft, crafting_depth


def hand(targets: dict, inventory: dict) -> Task:
    meta = {"target_items": targets, "initial_inventory": inventory, "max_steps": 50}
    return Task(env="textcraft_synth", task_id="hand", split="test", seed=0, meta=meta)


@pytest.fixture(scope="module")
def book():
    return TextCraftSynthEnv().book


def one_step_recipe(book):
    """An item made from base items only, its recipe."""
    for item, recipes in sorted(book.recipes.items()):
        r = recipes[0]
        if all(s.name not in book.recipes for s in r.inputs):
            return item, r
    raise AssertionError("no one-step recipe")


def test_craft_follows_the_engine_and_checks_the_stated_count(book):
    item, recipe = one_step_recipe(book)
    inputs = {s.name: 2 * s.count for s in recipe.inputs}
    world = SharedCraft(TextCraftSynthEnv(), hand({item: recipe.count}, dict(inputs)))
    assert not world.won
    text, ok = world.craft({s.name: s.count for s in recipe.inputs}, (item, recipe.count + 1))
    assert not ok and "make" in text and world.inventory() == dict(sorted(inputs.items()))  # undone
    text, ok = world.craft({s.name: s.count for s in recipe.inputs}, (item, recipe.count))
    assert ok and text == f"Crafted {recipe.count} {item}" and world.won
    assert world.counts([item, "nothing"]) == {item: recipe.count, "nothing": 0}
    text, ok = world.craft({s.name: 3 * s.count for s in recipe.inputs}, (item, 3 * recipe.count))
    assert not ok and world.transitions == 1  # not enough left
    assert not world.craft({}, (item, 1))[1]
    info = world.recipe_info([item, recipe.inputs[0].name])
    assert info[0]["can_craft"] and info[0]["crafting_depth"] == 1 and info[0]["in_inventory"] == recipe.count
    assert info[0]["recipes"] == [{"ingredients": {s.name: s.count for s in recipe.inputs},
                                   "result_count": recipe.count}]
    assert info[1]["is_base"] and info[1]["crafting_depth"] == 0
    snap = world.snapshot()
    world.craft({s.name: s.count for s in recipe.inputs}, (item, recipe.count))
    world.restore(snap)
    assert world.counts([item]) == {item: recipe.count}


def test_crafting_depth_is_the_longest_chain(book):
    memo: dict[str, int] = {}
    deep = max(book.recipes, key=lambda x: crafting_depth(book, x, memo))
    d = crafting_depth(book, deep)
    assert d >= 3
    assert d == 1 + max(crafting_depth(book, s.name) for s in book.recipes[deep][0].inputs)


def test_concurrent_crafts_are_atomic(book):
    """Eight threads race for ingredients that suffice for 50 crafts: exactly 50 succeed, nothing is lost or made
    twice, and no count ever goes negative (the engine would raise)."""
    item, recipe = one_step_recipe(book)
    inputs = {s.name: 50 * s.count for s in recipe.inputs}
    env = TextCraftSynthEnv()
    world = SharedCraft(env, hand({item: 1}, dict(inputs)))
    results, errors, inside, most = [], [], [0], [0]
    execute = env._execute

    def slow_execute(command):  # the engine call, widened so that overlapping calls would be seen
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(1e-4)
        try:
            return execute(command)
        finally:
            inside[0] -= 1

    env._execute = slow_execute

    def worker():
        try:
            for _ in range(20):
                results.append(world.craft({s.name: s.count for s in recipe.inputs}, (item, recipe.count))[1])
                world.inventory()
        except Exception as error:  # noqa: BLE001 (surfaced below)
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and most[0] == 1  # one engine call at a time
    assert sum(results) == 50 == world.transitions and len(results) == 160
    assert world.inventory() == {item: 50 * recipe.count}

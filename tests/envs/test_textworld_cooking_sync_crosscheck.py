"""TextWorld-Sync on tw-cooking: its rules checked against TextWorld itself on generated single-dish tw-cooking
games (envs/textworld_cooking_sync/twcheck.py): walkthroughs, random walks against the logic engine, feedback text
against the compiled game. The rest of the engine's tests are in test_textworld_cooking_sync.py."""

from __future__ import annotations

import pytest


# -- the cross-check against TextWorld --------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tw_games():
    """Two tw-cooking games, generated once per session: --recipe 2 --take 2 --go 6 and --recipe 3 --take 3 --go 9
    (with --open --cook --cut; seeds picked so both exercise chop/slice/dice and stove/oven, the second the BBQ)."""
    from envs.textworld_cooking_sync.twcheck import cooking_game

    return [cooking_game(1), cooking_game(3, recipe=3, take=3, go=9)]


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_textworld_walkthrough_wins_in_the_equivalent_sync_world(tw_games):
    from envs.textworld_cooking_sync.twcheck import compare

    verbs = set()
    for game in tw_games:
        report = compare(game)
        assert report.mismatches == [], report.mismatches
        assert report.won == (True, True) and report.score == report.max_score
        assert report.max_score[0] == report.max_score[1] == game.max_score
        verbs |= report.verbs
    assert {"go", "open", "take", "cook", "prepare", "eat", "drop", "examine", "inventory"} <= verbs
    assert len(verbs & {"chop", "slice", "dice"}) >= 2


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_random_walks_agree_with_textworld(tw_games):
    """Random admissible commands (burning, wrong cuts, eating ingredients included) from the start and from the
    middle of the walkthrough: same admissible lists, executability, score and won/lost at every step."""
    from envs.textworld_cooking_sync.twcheck import compare

    verbs, lost = set(), 0
    for k, game in enumerate(tw_games):
        walkthrough = game.metadata["walkthrough"]
        for seed in range(3):
            prefix = walkthrough[: len(walkthrough) * seed // 3]
            report = compare(game, prefix, random_steps=40, seed=10 * k + seed)
            assert report.mismatches == [], report.mismatches
            verbs |= report.verbs
            lost += report.lost[0]
    assert {"close", "put", "eat", "drop"} <= verbs and lost >= 1


@pytest.mark.slow  # for CI time: `make test-slow` (README, "Tests")
def test_feedback_texts_equal_the_compiled_game(tw_games, tmp_path):
    """The Inform 7 game itself (compiled .z8): the feedback of take/drop/put/insert/open/close/eat/cook/cut/prepare/
    inventory and of the cookbook is TextWorld's, character for character (whitespace aside)."""
    from envs.textworld_cooking_sync.twcheck import compare_text, compile_game

    game = tw_games[1]
    story = compile_game(game, str(tmp_path / "game.z8"))
    report = compare_text(game, story)
    assert report.mismatches == [] and report.won == (True, True)
    walk = compare_text(game, story, game.metadata["walkthrough"][:6], random_steps=40, seed=5)
    assert walk.mismatches == [], walk.mismatches
    assert {"take", "cook", "prepare", "eat", "examine", "inventory"} <= report.verbs | walk.verbs

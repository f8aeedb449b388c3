"""SERA's rubric-guided search at inference: each delegated child runs as N candidate subtrees, the best committed.

METHODS.md "SERA" 9 and the released test-time-scaling evaluator's semantics (GitHub ``OliverLeeXZ/SERA``,
``TestTimeScale/README.md``). With ``run_trees(..., search=SearchConfig(...))`` (it needs ``rubrics``):

- A delegating reply's children are resolved **one at a time**, in order (``Status.QUEUED`` until their turn): the
  next one starts from the state the previous one committed, not from the pre-delegation state.
- A child's turn: it begins on its tree's world (its first message, its start state), its rubric is written from
  the parent's context (batched with every other rubric of the turn), and ``candidates`` candidate trees are opened —
  each an isolated clone of the whole world (``world.fork``) whose root replays the child's start
  (``Status.SEARCHING`` while they run, in the same batched policy calls as every other node). Candidates delegate
  with search too (nested candidates count against the same cap).
- When every candidate's root has stopped, each is graded with the child's frozen rubric (one batched greedy call
  for all groups ready in a turn); the highest valid final score wins, ties the first; an unparsable rubric or no
  valid grade falls back to candidate 0 (the reason is kept). The winner's whole world replaces the tree's world in
  place (``world.adopt``) and its record — replies, finish message, status, end state — becomes the child's; its
  subtree stays in the candidate tree (:attr:`SearchGroup.trees`).
- ``fork_cap`` bounds the candidates created per root task (nested ones and discarded ones counted); a delegation
  past it creates none: the child stops at once with a message asking the parent to do that subtask itself.

Root success is always the environment's verdict, never a grade. Candidates are labelled by the env's offline judge
like any child — diagnostics only (``search/chosen_verified`` against ``search/any_verified``), never a selection
input. The grader is the policy, or another one
(``grader=``: the untrained-policy control of the paper's Table 4).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agentjax.agents.tree import Node, Status, Tree, TreeWorld

NOT_RUN = "not run: the search's fork cap is spent; do this subtask yourself"


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """Rubric-guided search (module docstring); the released defaults."""

    candidates: int = 2  # N candidate subtrees per delegated child
    fork_cap: int = 32  # candidates created per root task, nested and discarded ones included

    def __post_init__(self):
        if self.candidates < 1 or self.fork_cap < 0:
            raise ValueError(f"SearchConfig: candidates >= 1 and fork_cap >= 0, got {self}")


@dataclasses.dataclass
class SearchGroup:
    """One searched child: its candidate trees and the selection."""

    tree: int  # slot of the tree holding the child (a main tree or a candidate tree)
    main: int  # slot of the main tree (the root task) whose cap it counts against
    child: Node
    trees: list[Tree]  # candidate trees; their roots replay the child
    worlds: list[TreeWorld]
    chosen: int = -1  # the committed candidate (-1: not yet)
    scores: tuple[float | None, ...] = ()  # each candidate's final score (None: not graded)
    reason: str = ""  # why candidate 0 was taken without a comparison ("" when the scores decided)

    @property
    def roots(self) -> list[Node]:
        return [t.root for t in self.trees]

    @property
    def ready(self) -> bool:
        return self.chosen < 0 and all(r.status.stopped for r in self.roots)


def open_search(t: int, main: int, tree: Tree, world: TreeWorld, child: Node, config: SearchConfig,
                used: dict[int, int]) -> tuple[SearchGroup, list[tuple[Tree, TreeWorld]]] | None:
    """Candidate trees for ``child`` (already begun on ``world``) if the main tree's cap allows; ``used`` counts the
    candidates created per main tree. Returns the group and the new (tree, world) pairs to run, or None."""
    if used.get(main, 0) + config.candidates > config.fork_cap:
        return None
    used[main] = used.get(main, 0) + config.candidates
    pairs = []
    for i in range(config.candidates):
        candidate = Tree(tree.task, tree.group, tree.index, tree.task_index, tree.limits,
                         child_reward=tree.child_reward, fork=(main, child.id, i), origin_path=tree.path(child),
                         search=True)
        root = candidate.add_root(child.goal, depth=child.depth, budget=child.budget)
        root.intro, root.start_state = child.intro, child.start_state
        pairs.append((candidate, world.fork(child)))
    child.status = Status.SEARCHING
    return SearchGroup(t, main, child, [c for c, _ in pairs], [w for _, w in pairs]), pairs


def select(group: SearchGroup) -> None:
    """The best valid final score, ties the first; candidate 0 when the rubric or every grade failed."""
    scores = tuple(r.grade.final_score if r.grade is not None else r.score for r in group.roots)  # score: 0 unfinished
    group.scores = scores
    if group.child.rubric is None:
        group.chosen, group.reason = 0, "the rubric did not parse"
    elif all(s is None for s in scores):
        group.chosen, group.reason = 0, "no candidate's grade parsed"
    else:
        group.chosen = int(np.argmax([-np.inf if s is None else s for s in scores]))


def commit(group: SearchGroup, world: TreeWorld) -> None:
    """The chosen candidate's world and record become the child's (module docstring)."""
    winner = group.roots[group.chosen]
    world.adopt(group.worlds[group.chosen])
    child = group.child
    child.turns, child.finish_message = list(winner.turns), winner.finish_message
    child.end_state, child.status = winner.end_state, winner.status
    child.grade, child.score = winner.grade, winner.score


def search_stats(groups: list[SearchGroup], skipped: int) -> dict[str, float]:
    """``search/`` metrics: groups, candidates, how often a later candidate won, fallbacks, children not run, and
    against the verifier's labels of the candidates (diagnostics, never used to select): how often the committed
    candidate was verified, and how often any candidate was (what a perfect grader would reach)."""
    done = [g for g in groups if g.chosen >= 0]
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0  # noqa: E731
    return {"search/groups": float(len(groups)), "search/candidates": float(sum(len(g.trees) for g in groups)),
            "search/committed": float(len(done)), "search/later_won": mean([g.chosen > 0 for g in done]),
            "search/fallbacks": float(sum(bool(g.reason) for g in done)), "search/not_run": float(skipped),
            "search/chosen_verified": mean([bool(g.roots[g.chosen].label) for g in done]),
            "search/any_verified": mean([any(bool(r.label) for r in g.roots) for g in done])}


__all__ = ["NOT_RUN", "SearchConfig", "SearchGroup", "commit", "open_search", "search_stats", "select"]

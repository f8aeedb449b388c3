"""Does SERA's grader read the child? Its grades of held-out children against the verifier, against chance.

The flat runs' warm start is checked by :mod:`agentjax.train.probe` (agreement with the oracle's action). A SERA
policy has a second role to check before RL: the grader whose scores become its children's execution rewards. A
grader that passes whatever finishes (or fails everything) gives a reward that does not depend on what the child
did. :func:`grader_agreement` measures it on children whose outcome is known and mixed: on held-out tasks (the
run's eval split's first ones) the env's planner plays a tree per way its children may play
(:func:`~agentjax.train.tree_warmstart.labelled_trees`): a planner tree, whose children do their subtasks; an
early-finish tree, whose delegated children finish after ``id % 3`` of the planner's turns and mostly fail; and,
where the run's grader is asked about children that did not finish (TextWorld-Sync, as its judge), a stalled
tree, whose children idle after those turns until their turns or the world run out. The probed policy writes each
child's rubric (the run's :class:`~agentjax.rollout.tree_rubrics.RubricConfig`: temperature 1, constrained where
the run is) and grades each child it is asked about with it at temperature 0, exactly as in training; the verifier
(TextCraft-Synth's program check, TextWorld-Sync's judge) labels every child.

Reported over the graded children with a label and a grade that parsed: ``pass_rate`` on the verifier's
successes, ``fail_rate`` on its failures, ``balanced_accuracy`` (their mean; 0.5 for any grader that ignores the
child, whatever it says, since it gives every child the same flag distribution), ``agreement`` and ``majority``
(the larger label share: what a constant grader reaches), ``auc`` of the final score against the label (ties
count one half; 0.5 for a constant score), binomial standard errors, the counts, each failure tree's fail rate
(``early_finish/fail_rate``, ``stall/fail_rate``), and the rubric and grade calls that failed to parse. The
stalled tree is there because the early-finish failures are short and the planner's successes long, so a grader
keyed on the trajectory's length passes the probe without it (the failure-grades warm start's did, and passed the
policy's own failed children that ran out of turns). The check in the training distribution is a run's saved
trees' grades against the judge (``experiments/sera/run.py``'s grade table).

That check found a tiny grader passing the policy's children that finished late (10 of 12 that finished after
more than 3 turns, 7 of them judge failures: ``experiments/sera/results/sync_grades.md``), which the trees above
cannot tell from a grader that reads the child: each kind of their children stops its own way. :func:`late_finish`
grades two more trees per task whose children, after ``id % 3`` planner turns, idle (``late_finish``) or act on
their goal in ways the world rejects (``busy_finish``, as the policy's own failures that passed did), then finish at
turn :data:`~agentjax.train.tree_warmstart.LATE_TURNS`: failures (mostly) that stop as late as the planner's
children. Their fail rates, and balanced accuracies with the main pass rate, are reported apart
(``late_finish/...``, ``busy_finish/...``), so the main numbers stay comparable with earlier probes.

:func:`planner_fit` checks the other role on the same held-out tasks: how likely the policy is to reproduce the
planner's reply at each turn of its trees (the tree runs' counterpart of :mod:`agentjax.train.probe`'s agreement
with the oracle), so a grader recipe that costs the acting policy shows up before RL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from agentjax.train.runconfig import RunConfig

GRADER_TASKS = 16  # held-out tasks (the eval split's first ones); a teacher tree per kind of child each


def graded_children(run: RunConfig, grader: Any, tokenizer: Any, tasks: Sequence[Any], key: jax.Array, *,
                    trees: Sequence[str] | None = None
                    ) -> tuple[list[tuple[bool, bool, float, str]], dict[str, float]]:
    """``(verifier label, grade's success flag, grade's final score, tree)`` of every labelled, graded child of the
    planner and failure trees of ``tasks``, or of the ``trees`` named (``tree``: how its children played,
    ``tree_warmstart.CHILDREN``; the stalled tree where the run's grader is asked about unfinished children), and
    the summed rubric counters (``rubric/...``, ``grade/...``). A task whose planner tree does not fit is skipped
    (logged), as in the warm start."""
    from agentjax.rollout.tree_collect import tree_stats
    from agentjax.train.tree_warmstart import labelled_trees

    out: list[tuple[bool, bool, float, str]] = []
    counts: dict[str, float] = {}
    for children, rollouts in labelled_trees(run, tasks, tokenizer, stall=True, grader=grader, key=key, trees=trees):
        stats = tree_stats(rollouts)
        for name in ("rubric/requests", "rubric/failures", "grade/requests", "grade/failures", "grade/unfinished"):
            counts[name] = counts.get(name, 0.0) + float(stats.get(name, 0.0))
        for tree in rollouts.trees:
            for node in tree.nodes[1:]:
                if node.label is not None and node.grade is not None:
                    out.append((bool(node.label), bool(node.grade.success), float(node.grade.final_score), children))
    return out, counts


LATE_TREES = ("late_finish", "busy_finish")  # the late-finish checks' trees (tree_warmstart.CHILDREN)


def late_finish(run: RunConfig, grader: Any, tokenizer: Any, tasks: Sequence[Any], key: jax.Array,
                pass_rate: tuple[float, float], trees: Sequence[str] = LATE_TREES) -> dict[str, float]:
    """The late-finish checks (module docstring) of ``grader`` on the ``trees`` of ``tasks`` (:data:`LATE_TREES`),
    per tree: ``<tree>/children``, ``/failures``, ``/fail_rate`` (± ``/fail_rate_se``) on the verifier's failures,
    and ``/balanced_accuracy`` (± ``_se``): its mean with ``pass_rate`` (the main probe's pass rate on successes,
    ± its SE), the balanced accuracy of a grader whose failures finish as late as its successes. 0.5 for a grader
    that passes every late finish."""
    out: dict[str, float] = {}
    for tree in trees:
        children, _ = graded_children(run, grader, tokenizer, tasks, key, trees=(tree,))
        failed = [c for c in children if not c[0]]
        rate, se = _rate(sum(1 for c in failed if not c[1]), len(failed))
        out |= {f"{tree}/children": float(len(children)), f"{tree}/failures": float(len(failed)),
                f"{tree}/fail_rate": rate, f"{tree}/fail_rate_se": se,
                f"{tree}/balanced_accuracy": (pass_rate[0] + rate) / 2,
                f"{tree}/balanced_accuracy_se": math.hypot(pass_rate[1], se) / 2}
    return out


def _rate(hits: int, n: int) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p = hits / n
    return p, math.sqrt(p * (1 - p) / n)


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """P(a success's score > a failure's score), ties one half (Mann-Whitney); NaN without both labels."""
    pos, neg = score[label], score[~label]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return float(greater + 0.5 * ties)


def summarize(children: Sequence[tuple[Any, ...]]) -> dict[str, float]:
    """The probe's numbers (module docstring) from ``(label, success flag, final score, ...)`` tuples; with a fourth
    field (the tree), also each tree's ``<tree>/children`` and ``<tree>/fail_rate`` on its failures."""
    label = np.array([c[0] for c in children], bool)
    passed = np.array([c[1] for c in children], bool)
    score = np.array([c[2] for c in children], np.float64)
    n, n_pos = len(children), int(label.sum())
    pass_rate, pass_se = _rate(int((passed & label).sum()), n_pos)
    fail_rate, fail_se = _rate(int((~passed & ~label).sum()), n - n_pos)
    agreement, agreement_se = _rate(int((passed == label).sum()), n)
    return {"children": float(n), "successes": float(n_pos), "failures": float(n - n_pos),
            "pass_rate": pass_rate, "pass_rate_se": pass_se, "fail_rate": fail_rate, "fail_rate_se": fail_se,
            "balanced_accuracy": (pass_rate + fail_rate) / 2, "balanced_accuracy_se": math.hypot(pass_se, fail_se) / 2,
            "agreement": agreement, "agreement_se": agreement_se,
            "majority": max(n_pos, n - n_pos) / n if n else float("nan"), "auc": auc(score, label),
            **_per_tree(children)}


def _per_tree(children: Sequence[tuple[Any, ...]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for tree in sorted({c[3] for c in children if len(c) > 3}):
        mine = [c for c in children if c[3:4] == (tree,)]
        failed = [c for c in mine if not c[0]]
        out |= {f"{tree}/children": float(len(mine)), f"{tree}/failures": float(len(failed)),
                f"{tree}/fail_rate": _rate(sum(1 for c in failed if not c[1]), len(failed))[0]}
    return out


def grader_agreement(run: RunConfig, model: Any, tokenizer: Any, *, tasks: int = GRADER_TASKS,
                     seed: int = 0) -> dict[str, Any]:
    """The grader probe of ``model`` under ``run``'s tree and rubric settings on the first ``tasks`` tasks of the
    run's eval split, with its late-finish checks (module docstring). ``run`` must be a SERA run
    (``run.rubric_collect``)."""
    from agentjax.models import Sampler

    if run.rubric_collect is None:
        raise ValueError("grader probe: the run writes no rubrics (a SERA method, e.g. --method sera, has a grader)")
    held_out = run.spec.tasks(run.evaluation_split)[:tasks]
    grader, key = Sampler(model, tokenizer), jax.random.key(seed)
    children, counts = graded_children(run, grader, tokenizer, held_out, key)
    result = {"tasks": float(len(held_out)), "trees": probe_trees(run), **summarize(children), **counts}
    return result | late_finish(run, grader, tokenizer, held_out, key, (result["pass_rate"], result["pass_rate_se"]))


def probe_trees(run: RunConfig) -> list[str]:
    """The teacher trees the probe of ``run`` plays per task (module docstring)."""
    from agentjax.train.tree_warmstart import failure_children

    return ["planner", *failure_children(run, stall=True)]


def planner_fit(run: RunConfig, model: Any, tokenizer: Any, *, tasks: int = GRADER_TASKS,
                batch_size: int = 16) -> dict[str, float]:
    """How well ``model`` acts like the env's planner on held-out trees: the planner trees of the first ``tasks``
    tasks of ``run``'s eval split (the warm start's recipe on unseen tasks), scored turn by turn under teacher
    forcing (the run's prompts, its constrained choices where ``collect.masked_logp``). Per reply kind (``act``,
    ``delegate``, ``finish``, ... and ``all``): ``<kind>/turns``, ``<kind>/nll`` (mean NLL of a turn's reply,
    nats) and ``<kind>/p_reply`` (mean probability of the planner's whole reply: the rate at which temperature-1
    sampling reproduces it, turn by turn); the same for the root's turns and the children's (``root/<kind>/...``,
    ``child/<kind>/...``); and ``root/p_finish``, ``child/p_finish``: the mean probability of the finish reply at
    the turns where the planner did not finish (a policy that stops early puts its mass there; over
    ``<where>/p_finish_turns`` turns, those whose admissible replies hold the finish). A grader phase that costs
    the acting policy shows up here."""
    import functools

    from flax import nnx

    from agentjax.rollout.tree_rubrics import scripted_output
    from agentjax.train.config import LossConfig
    from agentjax.train.tree_warmstart import reply_encoder, teacher_trees, turn_row
    from agentjax.train.tree_worlds import world_factory
    from agentjax.train.update import forward_rows
    from agentjax.train.warmstart import pack_demos

    config = run.tree_collect
    stops = config.sampling.stop_token_ids
    rows: list[tuple[str, str, Any]] = []  # (the reply's kind, or "finish?": the finish in its place; where; row)
    encoded, make_world = reply_encoder(tokenizer), world_factory(run.env, run.env_kwargs)
    for task in run.spec.tasks(run.evaluation_split)[:tasks]:
        try:
            rollouts, admissible = teacher_trees(run, [task], tokenizer)
        except ValueError:  # no planner tree that fits (as in the warm start)
            continue
        finish = make_world(task).finish_reply()
        scripted = scripted_output(tokenizer, [finish], config.max_response_tokens, stops[0] if stops else None)
        finish_ids = scripted.tokens_bt[0, :int(scripted.length_b[0])].tolist()  # as the collector records a reply
        for tree in rollouts.trees:
            for node in tree.nodes:
                where = "root" if node.depth == 0 else "child"
                for turn in node.turns:
                    rows.append((turn.reply.kind, where, turn_row(run, encoded, tree, node, turn, admissible)))
                    offered = not config.masked_logp or finish in admissible[(tree.group, node.id, turn.step)]
                    if turn.reply.kind != "finish" and offered:
                        rows.append(("finish?", where,
                                     turn_row(run, encoded, tree, node, turn, admissible, finish_ids)))
    if not rows:
        raise ValueError("planner fit: no held-out planner tree fits the run's limits")
    loss = LossConfig(logprob_chunk=run.train.loss.logprob_chunk, logprob_remat=run.train.loss.logprob_remat)
    graphdef, params = nnx.split(model, nnx.Param)

    @functools.partial(jax.jit, static_argnames=("graphdef",))
    def reply_logp(graphdef, params, batch):
        logp, _, _ = forward_rows(graphdef, params, batch, loss=loss, with_entropy=False)
        return (logp * batch.response_mask).sum(axis=1)

    ro = run.train.rollout
    total = np.zeros(len(rows))
    for start in range(0, len(rows), batch_size):
        chunk = [row for _, _, row in rows[start:start + batch_size]]
        padded = chunk + [chunk[-1]] * (batch_size - len(chunk))  # one compiled shape
        batch = pack_demos(padded, ro.prompt_len, ro.response_len, run.collect.max_allowed)
        total[start:start + len(chunk)] = np.asarray(reply_logp(graphdef, params, batch))[:len(chunk)]
    kinds = np.array([kind for kind, _, _ in rows])
    depth = np.array([where for _, where, _ in rows])
    out: dict[str, float] = {}
    for where in ("", "root/", "child/"):
        at = np.ones(len(rows), bool) if not where else depth == where[:-1]
        for kind in ("all", *sorted(set(kinds[at]) - {"finish?"})):
            pick = total[at & (kinds != "finish?") & ((kinds == kind) | (kind == "all"))]
            out |= {f"{where}{kind}/turns": float(len(pick)), f"{where}{kind}/nll": float(-pick.mean()),
                    f"{where}{kind}/p_reply": float(np.exp(pick).mean())}
        if where:
            pick = total[at & (kinds == "finish?")]
            out |= {f"{where}p_finish_turns": float(len(pick)),
                    f"{where}p_finish": float(np.exp(pick).mean()) if len(pick) else float("nan")}
    return out


def describe(probe: dict[str, float]) -> str:
    """One line for logs and reports."""
    return (f"grader on {int(probe['children'])} held-out children ({int(probe['successes'])} verified successes): "
            f"passes {probe['pass_rate']:.2f} of successes, fails {probe['fail_rate']:.2f} of failures, balanced "
            f"accuracy {probe['balanced_accuracy']:.3f} ± {probe['balanced_accuracy_se']:.3f} (chance 0.5), AUC "
            f"{probe['auc']:.3f}")


__all__ = ["GRADER_TASKS", "LATE_TREES", "auc", "describe", "grader_agreement", "graded_children", "late_finish",
           "planner_fit", "probe_trees", "summarize"]

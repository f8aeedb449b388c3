"""The tiny experiment's report: eval success ± standard error, gains, paired differences, updates to threshold.

Reads only the runs' files (``metrics.jsonl`` and the per-episode eval outcomes ``eval/<update>.json`` that the
loop writes), so ``python experiments/crbc/run.py --report-only`` rebuilds the table from the runs.

Statistics (every run of a seed evaluates the same episodes with the same sampling streams at every eval point,
and runs of different methods with the same seed share them too: common random numbers, :mod:`agentjax.train.eval`):

- per run: success ``p`` at each eval point over its ``N`` episodes (eval tasks × eval seeds);
- per method, over training seeds ``s = 1..S``: the mean of ``p_s`` and its standard error ``std_s(p_s) / √S``
  (``S`` seeds; the episode noise is inside the seed-to-seed spread);
- gain = final − initial per seed (paired episode by episode), mean ± SE over seeds; ``z`` = mean / SE;
- the paired difference to :data:`BASELINE`: per seed, the mean over the same episodes of the two methods'
  final outcomes' difference (each run's last evaluation), then mean ± SE over seeds;
- a pair needs one starting policy: with ``same_start`` a seed enters the paired columns only when both runs
  started from the same policy (:func:`started_alike`: their ``initial_policy.json`` records, else their first
  evaluations' outcomes); a warm start rebuilt on another machine is another policy (agentjax.train.warmstart),
  and its runs are listed as unpaired instead;
- updates to threshold: the first eval update at which the method's seed-mean eval success reaches the threshold
  (default GraphGPO's final seed-mean success, the paper's comparison: "CRBC reaches GraphGPO's final reward in
  about half the updates"); ``—`` if never.

A difference is called out as within noise when ``|mean| < 2·SE``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentjax.train.metrics import read_metrics

BASELINE = "grpo"
# A batch's training success in metrics.jsonl: a flat run's episodes, a tree run's roots (agentjax.train.tree_loop).
TRAIN_SUCCESS = ("rollout/success_rate", "tree/root_success")
THRESHOLD_METHOD = "graphgpo"


def eval_outcomes(out_dir: str, series: str = "") -> dict[int, np.ndarray]:
    """``{update: [tasks, seeds] 0/1}`` of a run's evaluations (``eval/<update>.json``; a second series such as
    ``held_out``: ``eval/<series>/<update>.json``)."""
    folder = os.path.join(out_dir, "eval", series)
    out = {}
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            if name.endswith(".json") and name[:-5].isdigit():
                with open(os.path.join(folder, name)) as f:
                    out[int(name[:-5])] = np.asarray(json.load(f)["outcomes"], np.float64)
    return dict(sorted(out.items()))


def episode_gain(out_dir: str, series: str = "") -> dict[str, Any]:
    """One run's eval curve and its gain over the first evaluation, paired episode by episode: ``{"success":
    {update: rate}, "first", "last" (updates), "gain", "gain_se" (over the episodes), "episodes"}``."""
    outcomes = eval_outcomes(out_dir, series)
    if not outcomes:
        raise FileNotFoundError(f"{out_dir} has no evaluations (eval/<update>.json)")
    first, last = min(outcomes), max(outcomes)
    diff = (outcomes[last] - outcomes[first]).ravel()
    se = float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else float("nan")
    return dict(success={s: float(o.mean()) for s, o in outcomes.items()}, first=first, last=last,
                gain=float(diff.mean()), gain_se=se, episodes=int(diff.size))


def started_alike(a_dir: str, b_dir: str) -> bool:
    """Whether two runs of one seed started RL from the same policy: their ``initial_policy.json`` records agree
    (the warm start's weights hash) where both have one, else their evaluations before the first update (update 0,
    the same episodes and sampling streams) have identical outcomes, as the same policy's do."""
    records = []
    for d in (a_dir, b_dir):
        path = os.path.join(d, "initial_policy.json")
        if os.path.exists(path):
            with open(path) as f:
                records.append(json.load(f))
    unhashed = any(r.get("source") == "warm_start" and not r.get("weights_sha256") for r in records)
    if len(records) == 2 and not unhashed:
        return {k: v for k, v in records[0].items() if k != "built_with"} == {
            k: v for k, v in records[1].items() if k != "built_with"}
    a, b = eval_outcomes(a_dir).get(0), eval_outcomes(b_dir).get(0)
    return a is not None and b is not None and a.shape == b.shape and bool(np.array_equal(a, b))


def _ms(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, np.float64)
    se = float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else float("nan")
    mean = float(a.mean()) if a.size else float("nan")
    return {"mean": mean, "se": se, "z": mean / se if se and np.isfinite(se) else float("nan"), "n": float(a.size)}


def summarise(runs: Mapping[tuple[str, int], Any], threshold: float | None = None,
              baselines: Mapping[str, str] | None = None, threshold_method: str = THRESHOLD_METHOD,
              series: str = "", same_start: bool = False) -> dict[str, dict]:
    """Per method: initial / final / best eval success, gain, paired difference to the baseline, mean training
    success and its paired difference, updates to the threshold, and the curves (module docstring).
    ``baselines``: each label's baseline (default: :data:`BASELINE` for every label); ``series``: the evaluation
    series (:func:`eval_outcomes`); ``same_start``: pair a seed only where both runs started alike (module
    docstring), listing the others in ``unpaired_seeds``."""
    outcomes = {k: eval_outcomes(r.out_dir, series) for k, r in runs.items()}
    outcomes = {k: v for k, v in outcomes.items() if v}
    train = {k: {x["step"]: next(x[key] for key in TRAIN_SUCCESS if key in x) for x in read_metrics(r.out_dir)
                 if any(key in x for key in TRAIN_SUCCESS)}
             for k, r in runs.items() if k in outcomes}
    labels = list(dict.fromkeys(label for label, _ in outcomes))
    table: dict[str, dict] = {}
    for label in labels:
        seeds = sorted(s for lab, s in outcomes if lab == label)
        per = {s: outcomes[(label, s)] for s in seeds}
        last = {s: max(per[s]) for s in seeds}
        finals = [per[s][last[s]].mean() for s in seeds]
        initials = [per[s][0].mean() for s in seeds if 0 in per[s]]
        gains = [(per[s][last[s]] - per[s][0]).mean() for s in seeds if 0 in per[s]]
        bests = [max(o.mean() for u, o in per[s].items() if u > 0) for s in seeds if len(per[s]) > 1]
        steps = sorted(set.intersection(*(set(per[s]) for s in seeds)))
        curve = {u: float(np.mean([per[s][u].mean() for s in seeds])) for u in steps}
        curve_se = {u: _ms([per[s][u].mean() for s in seeds])["se"] for u in steps}
        train_curve = {u: float(np.mean([train[(label, s)][u] for s in seeds if u in train[(label, s)]]))
                       for u in sorted(set.union(*(set(train[(label, s)]) for s in seeds)))}
        table[label] = {
            "seeds": seeds, "episodes": int(per[seeds[0]][last[seeds[0]]].size), "updates": last[seeds[0]],
            "initial": _ms(initials), "final": _ms(finals), "best": _ms(bests), "gain": _ms(gains),
            "train_mean": _ms([float(np.mean(list(train[(label, s)].values()))) for s in seeds]),
            "curve": curve, "curve_se": curve_se, "train_curve": train_curve,
        }
    baselines = dict(baselines) if baselines is not None else {label: BASELINE for label in table}
    for label in table:
        baseline = baselines.get(label)
        if baseline is None or baseline == label or baseline not in table:
            continue
        common = [s for s in table[label]["seeds"] if s in table[baseline]["seeds"]]
        if same_start:
            unpaired = [s for s in common if not started_alike(runs[(label, s)].out_dir, runs[(baseline, s)].out_dir)]
            common = [s for s in common if s not in unpaired]
            table[label]["unpaired_seeds"] = unpaired
        diffs, tdiffs = [], []
        for s in common:
            mine, base = outcomes[(label, s)], outcomes[(baseline, s)]
            # final vs final: each run's last evaluation (the same episodes), also where the runs' lengths differ
            # (an interaction-matched run's extra updates, a tree run counting batches)
            final, base_final = mine[max(mine)], base[max(base)]
            if final.shape == base_final.shape:
                diffs.append(float((final - base_final).mean()))
            tm, tb = train[(label, s)], train[(baseline, s)]
            tdiffs.append(float(np.mean([tm[k] - tb[k] for k in sorted(set(tm) & set(tb))])))
        table[label]["baseline"] = baseline
        table[label]["final_minus_base"] = _ms(diffs)
        table[label]["train_minus_base"] = _ms(tdiffs)
    if threshold is None and threshold_method in table:
        threshold = table[threshold_method]["final"]["mean"]
    for r in table.values():
        reached = [u for u, v in r["curve"].items() if u > 0 and threshold is not None and v >= threshold - 1e-12]
        r["updates_to_threshold"] = reached[0] if reached else None
        r["threshold"] = threshold
    return table


def _fmt(ms: Mapping[str, float] | None, signed: bool = False) -> str:
    if ms is None or not np.isfinite(ms["mean"]):
        return "—"
    text = f"{ms['mean']:+.3f}" if signed else f"{ms['mean']:.3f}"
    return text + (f" ± {ms['se']:.3f}" if np.isfinite(ms["se"]) else "")


def _noise(ms: Mapping[str, float] | None) -> str:
    if ms is None or not np.isfinite(ms.get("se", np.nan)):
        return ""
    return " (noise)" if abs(ms["mean"]) < 2 * ms["se"] else ""


def markdown(table: Mapping[str, dict], header: str, baseline: str = BASELINE,
             threshold_method: str | None = THRESHOLD_METHOD) -> str:
    """The table; without ``threshold_method`` (a series that falls, e.g. held-out rooms) no updates-to column."""
    last = f" updates to {threshold_method}'s final |" if threshold_method else ""
    rows = [f"| method | seeds | initial | final | best | gain (final − initial) | gain / SE | final − {baseline} "
            f"(paired) | train success | train − {baseline} (paired) |{last}",
            "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if threshold_method else "")]
    for label, r in table.items():
        z = r["gain"]["z"]
        reached = r["updates_to_threshold"] if r["updates_to_threshold"] is not None else "—"
        rows.append(
            f"| {label} | {len(r['seeds'])} | {_fmt(r['initial'])} | {_fmt(r['final'])} | {_fmt(r['best'])} "
            f"| {_fmt(r['gain'], True)}{_noise(r['gain'])} | {z:.1f} | "
            f"{_fmt(r.get('final_minus_base'), True)}{_noise(r.get('final_minus_base'))} | {_fmt(r['train_mean'])} | "
            f"{_fmt(r.get('train_minus_base'), True)}{_noise(r.get('train_minus_base'))} |"
            + (f" {reached} |" if threshold_method else ""))
    unpaired = [f"{label} seed {s}" for label, r in table.items() for s in r.get("unpaired_seeds", [])]
    note = ("\nLeft out of the paired columns (the run and its base started from different policies, e.g. a warm "
            f"start rebuilt on another machine): {', '.join(unpaired)}.\n" if unpaired else "")
    return header + "\n".join(rows) + "\n" + note


def plot(table: Mapping[str, dict], path: str, held_out: Mapping[str, dict] | None = None,
         title: str = "eval success (held-out rooms, ± SE over seeds)") -> None:
    """The eval curves (± SE over seeds), the held-out series' curves when given, and the training batches'
    success."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(table, title)] + ([(held_out, "held-out rooms (± SE over seeds)")] if held_out else [])
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(5.5 * (len(panels) + 1), 4))
    for ax, (tab, _) in zip(axes, panels, strict=False):
        for label, r in tab.items():
            steps = list(r["curve"])
            mean = np.array([r["curve"][u] for u in steps])
            se = np.nan_to_num(np.array([r["curve_se"][u] for u in steps]))
            ax.plot(steps, mean, marker="o", label=label)
            ax.fill_between(steps, mean - se, mean + se, alpha=0.15)
    for label, r in table.items():
        tsteps = list(r["train_curve"])
        axes[-1].plot(tsteps, [r["train_curve"][u] for u in tsteps], label=label)
    for ax, title in zip(axes, [t for _, t in panels] + ["training success (batch)"], strict=True):
        ax.set_xlabel("update")
        ax.set_ylabel("success rate")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(runs: Mapping[tuple[str, int], Any], results: str, name: str, header: str,
                 baselines: Mapping[str, str] | None = None, baseline_column: str = BASELINE,
                 threshold_method: str = THRESHOLD_METHOD, held_out_header: str | None = None,
                 title: str = "eval success (held-out rooms, ± SE over seeds)", same_start: bool = False) -> dict:
    """``<name>_results.md`` / ``.json`` and ``<name>_curves.png`` in ``results``; returns the table.
    ``baselines`` / ``baseline_column``: each label's paired baseline and the column's name (default GRPO).
    ``held_out_header``: also tabulate the runs' held-out series (``eval/held_out/``) under this header
    (``.json``: ``held_out``); ``same_start``: pair only runs that started alike (:func:`summarise`)."""
    table = summarise(runs, baselines=baselines, threshold_method=threshold_method, same_start=same_start)
    held_out = summarise(runs, baselines=baselines, threshold_method="", series="held_out",
                         same_start=same_start) if held_out_header is not None else {}
    os.makedirs(results, exist_ok=True)
    text = markdown(table, header, baseline_column, threshold_method)
    if held_out:
        text += "\n" + markdown(held_out, held_out_header, baseline_column, None)
    with open(os.path.join(results, f"{name}_results.md"), "w") as f:
        f.write(text)
    some = next(iter(runs.values()))
    with open(os.path.join(results, f"{name}_results.json"), "w") as f:
        json.dump({"config": some.to_dict(), "results": table} | ({"held_out": held_out} if held_out else {}), f,
                  indent=1, default=float)
    plot(table, os.path.join(results, f"{name}_curves.png"), held_out=held_out, title=title)
    print(text)
    return table


__all__ = ["BASELINE", "THRESHOLD_METHOD", "eval_outcomes", "markdown", "started_alike", "summarise", "write_report"]

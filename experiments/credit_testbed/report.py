"""The credit-testbed tables and curves, one per setting, from each run's compact record.

Records (:class:`experiments.crbc.report.RunRecord`, read by :func:`experiments.crbc.report.gather`: from the run
folder, else from the committed ``results/<setting>_results.json``) keep the run's ``exact/`` and ``credit/``
metrics at every evaluation and, as ``check/`` metrics at the last update, its final sampled check
(``eval_<update>.json``: :data:`~experiments.credit_testbed.presets.CHECK_SEEDS` sampled episodes per MDP beside
the exact success of the same checkpoint).

Per arm, over training seeds (mean ± standard error ``std / √S``):

- exact success (``exact/success``: the policy's exact success probability from the start state, mean over the
  run's 4 MDPs; no sampling noise) before the first update and after the last, and the gain;
- the paired difference of the final exact success to GRPO's on the same seed (the same MDPs and initial policy)
  and, for a SERO arm, to its base method's;
- updates to :data:`~experiments.credit_testbed.presets.THRESHOLD`: the first evaluation at which the run's exact
  success reaches it. A run that never does is censored: it counts as its last update (so the mean is a lower
  bound wherever a run is censored; ``c/S`` says how many were); the paired differences use the same values;
- credit accuracy: ``credit/pearson`` and ``credit/sign_agreement`` of the update's batch against the behaviour
  policy's exact ``A^π`` (:mod:`agentjax.train.exact`), averaged over the run's evaluation points;
- the final check: sampled success on 256 episodes minus the exact success of the same checkpoint, and how many
  runs lie beyond 2 and 3 binomial standard errors (≈ 5% and 0.3% of runs by chance alone).

A difference is marked "(noise)" when ``|mean| < 2 SE``. Each table's header gives the ceiling: the optimal
policy's exact success on the seeds' MDPs (below 1 where the MDPs slip), and how many seeds' MDPs allow the
threshold at all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentjax.train.runconfig import RunConfig
from envs.mdp import MDPEnv
from envs.mdp.solve import optimal
from experiments.crbc.report import RunRecord, gather, load_results, record_to_json, results_path
from experiments.credit_testbed.presets import POOL, THRESHOLD, arm_of

METRICS = ("exact/success", "exact/value", "credit/pearson", "credit/sign_agreement", "credit/exact_rows")
CHECK = ("check/sampled", "check/sampled_se", "check/exact", "check/episodes")
BASELINE = "grpo"
COMMAND = "python experiments/credit_testbed/run.py"
SETTING_TEXT = {
    "s1": "S1, a long horizon (a safe path of 17 steps, 34-step cap; the uniform policy succeeds 7.5% of the time)",
    "s2": "S2, converging paths with slips (14-step cap; the uniform policy succeeds 33% of the time)",
    "s3": "S3, a lock (5 states that each need one right action, 20-step cap; the uniform policy succeeds 0.44% "
          "of the time)",
}

Key = tuple[str, int]  # (arm label, seed)


# -- records --------------------------------------------------------------------------------------------------------
def with_check(record: RunRecord, run: RunConfig) -> RunRecord:
    """``record`` with the run's final sampled check (``eval_<updates>.json``) as ``check/`` metrics at its step;
    unchanged where the run folder has none (a record from the results JSON has them already)."""
    path = os.path.join(run.out_dir, f"eval_{run.updates}.json")
    if not os.path.exists(path):
        return record
    with open(path) as f:
        check = json.load(f)
    step = int(check["step"])
    episodes = int(np.asarray(check["outcomes"]).size)
    values = {"check/sampled": check["success_rate"], "check/sampled_se": check["success_se"],
              "check/exact": check["exact"]["success"], "check/episodes": episodes}
    metrics = dict(record.metrics) | {k: {step: float(v)} for k, v in values.items()}
    return RunRecord(eval=record.eval, held_out=record.held_out, train_success=record.train_success,
                     initial_policy=record.initial_policy, metrics=metrics, steps=record.steps, source=record.source)


def records_of(runs: Mapping[Key, RunConfig], json_path: str) -> dict[Key, RunRecord]:
    """``{(label, seed): record}`` (module docstring) of the finished runs, each from its run folder (where it has
    reached its last update; a run still training is left out), else from ``json_path``."""
    records = gather(runs, json_path, METRICS)
    return {k: with_check(r, runs[k]) if r.source != json_path else r for k, r in records.items()
            if r.source == json_path or r.steps >= runs[k].updates}


def optimal_success(setting: str, seeds: list[int]) -> dict[int, float]:
    """``{seed: the optimal policy's exact success from the start, mean over the seed's POOL MDPs}`` (the ceiling
    of every arm: with slips, below 1)."""
    tasks = MDPEnv.tasks("train")[:POOL]
    out = {}
    for seed in seeds:
        env = MDPEnv(setting=setting, seed_offset=POOL * seed)  # the seed's MDPs, as arm_run gives them
        values = []
        for task in tasks:
            model = env.model_of(task)
            values.append(float(optimal(model).success_hs[model.max_steps, model.start]))
        out[seed] = float(np.mean(values))
    return out


# -- statistics -----------------------------------------------------------------------------------------------------
def _ms(values: list[float]) -> dict[str, float]:
    a = np.asarray([v for v in values if np.isfinite(v)], np.float64)
    mean = float(a.mean()) if a.size else float("nan")
    se = float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else float("nan")
    return {"mean": mean, "se": se, "n": int(a.size)}


def curve(record: RunRecord, key: str = "exact/success") -> dict[int, float]:
    """``{update: value}`` of a metric over the run's evaluations."""
    return dict(sorted(record.metrics.get(key, {}).items()))


def updates_to(record: RunRecord, threshold: float = THRESHOLD) -> tuple[int, bool]:
    """``(update, censored)``: the first evaluation whose exact success reaches ``threshold``; a run that never
    does gives its last evaluated update and ``censored=True``."""
    c = curve(record)
    reached = [u for u, v in c.items() if u > 0 and v >= threshold]
    return (reached[0], False) if reached else (max(c), True)


def run_stats(record: RunRecord) -> dict[str, Any]:
    """One run's numbers (module docstring)."""
    c = curve(record)
    first, last = min(c), max(c)
    to, censored = updates_to(record)
    check = {k.split("/")[1]: next(iter(record.metrics[k].values())) for k in CHECK if k in record.metrics}
    z = float("nan")
    if check:
        se = np.sqrt(max(check["exact"] * (1 - check["exact"]), 1e-12) / check["episodes"])
        z = (check["sampled"] - check["exact"]) / se
    return {"initial": c[first], "final": c[last], "gain": c[last] - c[first], "updates_to": to, "censored": censored,
            "pearson": float(np.nanmean(list(curve(record, "credit/pearson").values()) or [np.nan])),
            "sign": float(np.nanmean(list(curve(record, "credit/sign_agreement").values()) or [np.nan])),
            "check_diff": check["sampled"] - check["exact"] if check else float("nan"), "check_z": z,
            "updates": last}


def summarise(records: Mapping[Key, RunRecord]) -> dict[str, dict]:
    """Per arm: means ± SE over seeds of :func:`run_stats`, the paired differences to GRPO and to the base method,
    and the mean curves (exact success, credit Pearson and sign agreement, ± SE over seeds)."""
    stats = {k: run_stats(r) for k, r in records.items()}
    labels = list(dict.fromkeys(label for label, _ in records))
    table: dict[str, dict] = {}
    for label in labels:
        seeds = sorted(s for lab, s in records if lab == label)
        per = [stats[(label, s)] for s in seeds]
        row: dict[str, Any] = {"seeds": seeds, "updates": max(p["updates"] for p in per)}
        for name in ("initial", "final", "gain", "updates_to", "pearson", "sign", "check_diff"):
            row[name] = _ms([p[name] for p in per])
        row["censored"] = sum(p["censored"] for p in per)
        z = np.abs([p["check_z"] for p in per if np.isfinite(p["check_z"])])
        row["check_beyond"] = {"2": int((z > 2).sum()), "3": int((z > 3).sum()), "runs": int(z.size)}
        for key in ("exact/success", "credit/pearson", "credit/sign_agreement"):
            curves = [curve(records[(label, s)], key) for s in seeds]
            steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            row.setdefault("curves", {})[key] = {u: _ms([c[u] for c in curves]) for u in steps}
        for column, base in (("vs_grpo", BASELINE), ("vs_base", arm_of(label).base)):
            if base is None or base == label or base not in labels:
                continue
            common = [s for s in seeds if (base, s) in stats]
            row[column] = {"base": base, "final": _ms([stats[(label, s)]["final"] - stats[(base, s)]["final"]
                                                       for s in common]),
                           "updates_to": _ms([stats[(label, s)]["updates_to"] - stats[(base, s)]["updates_to"]
                                              for s in common])}
        table[label] = row
    return table


# -- the table and the figure ---------------------------------------------------------------------------------------
def _fmt(ms: Mapping[str, float] | None, signed: bool = False, digits: int = 3) -> str:
    if ms is None or not np.isfinite(ms["mean"]):
        return "—"
    text = f"{ms['mean']:+.{digits}f}" if signed else f"{ms['mean']:.{digits}f}"
    text += f" ± {ms['se']:.{digits}f}" if np.isfinite(ms["se"]) else ""
    return text + (" (noise)" if signed and np.isfinite(ms["se"]) and abs(ms["mean"]) < 2 * ms["se"] else "")


def markdown(table: Mapping[str, dict], header: str) -> str:
    """The setting's table (module docstring); the paired columns against GRPO or the base method only where some
    arm has them, the final check's table only where some run has a check."""
    pairs = [(column, name) for column, name in (("vs_grpo", "GRPO"), ("vs_base", "base"))
             if any(column in r for r in table.values())]
    head = (["arm", "seeds", "exact success, initial", "final", "gain"]
            + [f"final − {name} (paired)" for _, name in pairs] + [f"updates to {THRESHOLD:g} (censored)"]
            + [f"− {name} (paired)" for _, name in pairs] + ["credit Pearson", "sign agreement"])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, r in table.items():
        cells = [label, str(len(r["seeds"])), _fmt(r["initial"]), _fmt(r["final"]), _fmt(r["gain"], True)]
        cells += [_fmt(r.get(column, {}).get("final"), True) for column, _ in pairs]
        cells += [f"{_fmt(r['updates_to'], digits=1)} ({r['censored']}/{len(r['seeds'])})"]
        cells += [_fmt(r.get(column, {}).get("updates_to"), True, 1) for column, _ in pairs]
        cells += [_fmt(r["pearson"], True), _fmt(r["sign"])]
        rows.append("| " + " | ".join(cells) + " |")
    text = header + "\n".join(rows) + "\n"
    if not any(r["check_beyond"]["runs"] for r in table.values()):
        return text
    check = ["", "The final sampled check (the last checkpoint, 256 sampled episodes: 64 per MDP) against the exact "
             "success of the same checkpoint: the mean difference over seeds, and the runs whose difference exceeds "
             "2 and 3 binomial standard errors:", "",
             "| arm | sampled − exact | runs beyond 2 SE | beyond 3 SE |", "|---|---|---|---|"]
    for label, r in table.items():
        beyond = r["check_beyond"]
        check.append(f"| {label} | {_fmt(r['check_diff'], True)} | {beyond['2']}/{beyond['runs']} | "
                     f"{beyond['3']}/{beyond['runs']} |")
    return text + "\n".join(check) + "\n"


def plot(table: Mapping[str, dict], path: str, title: str) -> None:
    """Three panels against updates: exact success, the batch's credit Pearson and sign agreement (± SE)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("exact/success", "exact success (pool MDPs)"), ("credit/pearson", "credit accuracy: Pearson"),
              ("credit/sign_agreement", "credit accuracy: sign agreement"))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for ax, (key, name) in zip(axes, panels, strict=True):
        for label, r in table.items():
            c = r["curves"].get(key, {})
            steps = sorted(int(u) for u in c)
            if not steps:
                continue
            mean = np.array([c[u]["mean"] for u in steps])
            se = np.nan_to_num(np.array([c[u]["se"] for u in steps], np.float64))
            style = "--" if "+" in label else "-"
            ax.plot(steps, mean, style, marker="o", markersize=3, label=label)
            ax.fill_between(steps, mean - se, mean + se, alpha=0.12)
        if key == "exact/success":
            ax.axhline(THRESHOLD, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("update")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _json_keys(table: Mapping[str, dict]) -> dict:
    """``table`` with its curves' update keys as strings (JSON)."""
    return json.loads(json.dumps(table, default=float))


def _curves_from_json(table: dict) -> dict:
    for row in table.values():
        for key, c in row.get("curves", {}).items():
            row["curves"][key] = {int(u): v for u, v in c.items()}
    return table


def write(records: Mapping[Key, RunRecord], setting: str, results: str, *, config: Mapping[str, Any] | None = None,
          command: str | None = None) -> dict:
    """``<setting>_results.md`` / ``.json`` and ``<setting>_curves.png`` in ``results``; returns the table."""
    path = results_path(results, setting)
    stored = load_results(path)
    if not records:
        raise FileNotFoundError(f"{setting}: no run has evaluations and {path} stores none")
    table = summarise(records)
    command = command or f"{COMMAND} --settings {setting}"
    some = next(iter(records.values()))
    updates = max(r["updates"] for r in table.values())
    seeds = sorted({seed for _, seed in records})
    ceiling = optimal_success(setting, seeds) if setting in SETTING_TEXT else {}
    reach = (f"The optimal policy's exact success on these MDPs (the ceiling): {np.mean(list(ceiling.values())):.3f} "
             f"over seeds ({min(ceiling.values()):.3f} to {max(ceiling.values()):.3f}); "
             f"{sum(v >= THRESHOLD for v in ceiling.values())} of {len(ceiling)} seeds' MDPs allow {THRESHOLD:g} at "
             "all. " if ceiling else "")
    header = (f"### {SETTING_TEXT.get(setting, setting)}\n\n"
              f"{reach}{updates} updates from random init, the exact evaluation every "
              f"{min(u for u in curve(some) if u > 0)} updates; mean ± SE over training seeds (each seed its own 4 "
              f"MDPs and initial policy, shared by every arm); \"(noise)\" marks |mean| < 2 SE. Made by "
              f"`{command}`; `{command} --report-only` rebuilds it from `{setting}_results.json`.\n\n")
    os.makedirs(results, exist_ok=True)
    text = markdown(table, header)
    with open(os.path.join(results, f"{setting}_results.md"), "w") as f:
        f.write(text)
    runs = [record_to_json(k, r) for k, r in records.items()]
    for entry in runs:  # the compact record: the sampled in-run evaluation and the batches' success are not used
        entry.pop("held_out", None)
        entry.pop("train_success", None)
    data = {"config": dict(config if config is not None else stored.get("config", {})), "runs": runs,
            "optimal_success": {str(k): v for k, v in ceiling.items()}, "results": _json_keys(table)}
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(
            f" {json.dumps(k)}: " + ("[\n" + ",\n".join("  " + json.dumps(e) for e in v) + "\n ]" if k == "runs"
                                     else json.dumps(v, indent=1).replace("\n", "\n "))
            for k, v in data.items()) + "\n}\n")
    plot(table, os.path.join(results, f"{setting}_curves.png"), SETTING_TEXT.get(setting, setting))
    print(text, flush=True)
    return table


def report(runs: Mapping[Key, RunConfig], setting: str, results: str, *, command: str | None = None) -> dict:
    """The table of ``setting``'s runs (``{(label, seed): run}``), from their folders or the results JSON."""
    path = results_path(results, setting)
    records = records_of(runs, path)
    config = None
    if any(r.source != path for r in records.values()):
        some = next(iter(runs.values())).to_dict()
        some["env_kwargs"].pop("seed_offset", None)
        some["out_dir"] = None
        config = some
    return write(records, setting, results, config=config, command=command)


def stored_table(results: str, setting: str) -> dict:
    """The table stored in ``results/<setting>_results.json`` (its curves' keys back to updates)."""
    return _curves_from_json(load_results(results_path(results, setting)).get("results", {}))


__all__ = ["curve", "markdown", "plot", "records_of", "report", "run_stats", "stored_table", "summarise",
           "updates_to", "with_check", "write"]

"""Results tables of the tiny experiments (CRBC, SERO, SERA): per-run records, statistics, markdown and curves.

A report never needs a run's checkpoints, only a small record of each run, so a table can be rebuilt where the
runs are absent (a fresh clone: run folders are not kept in git)::

    runs {(label, seed): RunConfig}
      -- gather -->  records {(label, seed): RunRecord}     (from each run's folder, else from <name>_results.json)
      -- summarise / markdown / plot -->  <name>_results.md, <name>_curves.png
    write_report(records, ...) also writes <name>_results.json: the config, the records and the computed table.

:func:`gather` reads a run's record from its folder when the folder has evaluations, and otherwise takes the record
of the same ``(label, seed)`` from the committed ``<name>_results.json``; so ``run.py ... --report-only`` rebuilds
every table from git alone, and seeds run locally add to or replace exactly those records.

A record (:class:`RunRecord`), what the loop writes to a run's folder, reduced:

- ``eval``: ``{update: [tasks, seeds] outcomes}`` of the evaluations (``eval/<update>.json``);
- ``held_out``: the same for a second series evaluated beside it (``eval/held_out/<update>.json``), or empty;
- ``train_success``: ``{step: success}`` of the training batches (``metrics.jsonl``: :data:`TRAIN_SUCCESS`);
- ``initial_policy``: what RL started from (``initial_policy.json``: the warm start's key and weights hash), or None;
- ``metrics``: ``{key: {step: value}}``, the extra ``metrics.jsonl`` series a report asks for (``metric_keys``;
  a key ending in ``/`` takes every metric under that prefix), e.g. SERO's ``sero/roots_attempted``;
- ``steps``: the last step in ``metrics.jsonl`` (whether a run finished: ``steps >= run.updates``).

In ``<name>_results.json`` the records are the list ``"runs"``, one object each with ``label`` and ``seed``; an
evaluation's outcomes are written as one string of task rows, ``"0110 1000 ..."`` (a task's eval seeds in a row),
where they are all 0 or 1, else as nested lists. A table made before records were kept has no ``"runs"``: it is
rendered again from the statistics stored beside (``"results"``, ``"held_out"``) and cannot gain seeds.

Statistics (every run of a seed evaluates the same episodes with the same sampling streams at every eval point,
and runs of different methods with the same seed share them too: common random numbers, :mod:`agentjax.train.eval`):

- per run: success ``p`` at each eval point over its ``N`` episodes (eval tasks × eval seeds);
- per method, over training seeds ``s = 1..S``: the mean of ``p_s`` and its standard error ``std_s(p_s) / √S``
  (``S`` seeds; the episode noise is inside the seed-to-seed spread);
- gain = final − initial per seed (paired episode by episode), mean ± SE over seeds; ``z`` = mean / SE;
- the paired difference to :data:`BASELINE`: per seed, the mean over the same episodes of the two methods'
  final outcomes' difference (each run's last evaluation), then mean ± SE over seeds;
- a pair needs one starting policy: with ``same_start`` a seed enters the paired columns only when both runs
  started from the same policy (:func:`started_alike`: their initial-policy records, else their first
  evaluations' outcomes); a warm start built with other float rounding (another CPU) is another policy
  (:mod:`agentjax.train.warmstart`), and its runs are listed as unpaired instead;
- updates to threshold: the first eval update at which the method's seed-mean eval success reaches the threshold
  (default GraphGPO's final seed-mean success, the paper's comparison: "CRBC reaches GraphGPO's final reward in
  about half the updates"); ``—`` if never.

A difference is called out as within noise when ``|mean| < 2·SE``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from agentjax.train.metrics import read_metrics

BASELINE = "grpo"
# A batch's training success in metrics.jsonl: a flat run's episodes, a tree run's roots (agentjax.train.trees).
TRAIN_SUCCESS = ("rollout/success_rate", "tree/root_success")
THRESHOLD_METHOD = "graphgpo"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

Key = tuple[str, int]  # (label, training seed)


@dataclasses.dataclass(frozen=True, eq=False)
class RunRecord:
    """What a report reads of one run (module docstring); compared by identity (its fields hold arrays)."""

    eval: dict[int, np.ndarray]  # {update: [tasks, seeds] outcomes}, sorted by update
    held_out: dict[int, np.ndarray]  # the held-out series, the same form; {} without one
    train_success: dict[int, float]  # {step: training batch success}
    initial_policy: dict[str, Any] | None = None  # initial_policy.json
    metrics: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)  # {key: {step: value}}
    steps: int = 0  # the last step in metrics.jsonl
    source: str = ""  # where it was read: the run folder, or the results JSON (not written)

    def series(self, name: str = "") -> dict[int, np.ndarray]:
        """The evaluation series ``name``: ``""`` (the main one) or ``"held_out"``."""
        return self.held_out if name == "held_out" else self.eval


def results_path(results: str, name: str) -> str:
    """``<results>/<name>_results.json``: the table's compact JSON."""
    return os.path.join(results, f"{name}_results.json")


# -- reading runs -----------------------------------------------------------------------------------------------------
def gather(runs: Mapping[Key, Any], json_path: str, metric_keys: Iterable[str] = ()) -> dict[Key, RunRecord]:
    """``{(label, seed): record}`` of ``runs`` (``{(label, seed): run}``, anything with an ``out_dir``), in their
    order: each from its run folder when the folder has evaluations (``eval/<update>.json``), otherwise the record
    of the same ``(label, seed)`` in the results JSON ``json_path`` (what :func:`write_report` wrote), otherwise
    left out. ``metric_keys``: the extra ``metrics.jsonl`` series to keep (a key ending in ``/``: every metric
    under that prefix); a record from the JSON has those it was written with."""
    keys = tuple(metric_keys)
    stored = stored_records(json_path)
    out: dict[Key, RunRecord] = {}
    for key, run in runs.items():
        record = read_record(run.out_dir, keys)
        if record is None:
            record = stored.get(key)
        if record is not None:
            out[key] = record
    return out


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


def _wanted(key: str, metric_keys: tuple[str, ...]) -> bool:
    return any(key.startswith(k) if k.endswith("/") else key == k for k in metric_keys)


def read_record(out_dir: str, metric_keys: Iterable[str] = ()) -> RunRecord | None:
    """The record of the run in ``out_dir`` (module docstring); None where it has no evaluations."""
    outcomes = eval_outcomes(out_dir)
    if not outcomes:
        return None
    keys = tuple(metric_keys)
    train: dict[int, float] = {}
    metrics: dict[str, dict[int, float]] = {}
    steps = 0
    path = os.path.join(out_dir, "metrics.jsonl")
    for line in read_metrics(path) if os.path.exists(path) else []:
        step = int(line["step"])
        steps = max(steps, step)
        found = next((line[k] for k in TRAIN_SUCCESS if k in line), None)
        if found is not None:
            train[step] = float(found)
        for k, v in line.items():
            if keys and k not in ("step", "time") and _wanted(k, keys):
                metrics.setdefault(k, {})[step] = float(v)
    policy = None
    if os.path.exists(os.path.join(out_dir, "initial_policy.json")):
        with open(os.path.join(out_dir, "initial_policy.json")) as f:
            policy = json.load(f)
    return RunRecord(eval=outcomes, held_out=eval_outcomes(out_dir, "held_out"), train_success=train,
                     initial_policy=policy, metrics={k: metrics[k] for k in sorted(metrics)}, steps=steps,
                     source=out_dir)


def _as_records(runs: Mapping[Key, Any]) -> dict[Key, RunRecord]:
    """Records as they are; a run (anything with an ``out_dir``) read from its folder (left out without
    evaluations)."""
    out = {}
    for key, value in runs.items():
        record = value if isinstance(value, RunRecord) else read_record(value.out_dir)
        if record is not None:
            out[key] = record
    return out


# -- the results JSON -------------------------------------------------------------------------------------------------
def _encode_outcomes(o: np.ndarray) -> str | list:
    if o.ndim == 2 and np.isin(o, (0.0, 1.0)).all():
        return " ".join("".join("1" if x else "0" for x in row) for row in o)
    return o.tolist()


def _decode_outcomes(value: str | list) -> np.ndarray:
    if isinstance(value, str):
        return np.asarray([[float(c) for c in row] for row in value.split()], np.float64)
    return np.asarray(value, np.float64)


def record_to_json(key: Key, record: RunRecord) -> dict[str, Any]:
    """One entry of the results JSON's ``"runs"`` (module docstring)."""
    label, seed = key
    return {"label": label, "seed": seed, "steps": record.steps, "initial_policy": record.initial_policy,
            "eval": {str(u): _encode_outcomes(o) for u, o in record.eval.items()},
            "held_out": {str(u): _encode_outcomes(o) for u, o in record.held_out.items()},
            "train_success": {str(s): v for s, v in record.train_success.items()},
            "metrics": {k: {str(s): v for s, v in series.items()} for k, series in record.metrics.items()}}


def record_from_json(entry: Mapping[str, Any], source: str = "") -> tuple[Key, RunRecord]:
    def steps(d):
        return {int(k): v for k, v in d.items()}

    record = RunRecord(
        eval=dict(sorted((int(u), _decode_outcomes(o)) for u, o in entry["eval"].items())),
        held_out=dict(sorted((int(u), _decode_outcomes(o)) for u, o in entry.get("held_out", {}).items())),
        train_success=steps(entry.get("train_success", {})), initial_policy=entry.get("initial_policy"),
        metrics={k: steps(v) for k, v in entry.get("metrics", {}).items()}, steps=int(entry.get("steps", 0)),
        source=source)
    return (entry["label"], int(entry["seed"])), record


def load_results(json_path: str) -> dict[str, Any]:
    """The results JSON at ``json_path`` as written (``{}`` where there is none)."""
    if not os.path.exists(json_path):
        return {}
    with open(json_path) as f:
        return json.load(f)


def stored_records(json_path: str) -> dict[Key, RunRecord]:
    """The records in the results JSON at ``json_path`` (``{}`` where it has none)."""
    return dict(record_from_json(e, json_path) for e in load_results(json_path).get("runs", []))


def stored_table(json_path: str, part: str = "results") -> dict[str, dict]:
    """The computed table stored in the results JSON (``part``: ``"results"`` or ``"held_out"``), its curves' keys
    back to updates; ``{}`` where there is none."""
    table = load_results(json_path).get(part, {})
    for row in table.values():
        for name in ("curve", "curve_se", "train_curve"):
            row[name] = {int(u): v for u, v in row.get(name, {}).items()}
    return table


def _portable(value: Any) -> Any:
    """``value`` with paths inside the repository written relative to its root (a JSON the same on every clone)."""
    if isinstance(value, str) and value.startswith(ROOT + os.sep):
        return os.path.relpath(value, ROOT)
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_portable(v) for v in value]
    return value


def _dump(data: Mapping[str, Any]) -> str:
    """The results JSON's text: one line per record field (a record's arrays stay on their line), the rest indented
    by one."""
    def block(value: Any) -> str:
        return json.dumps(value, indent=1, default=float).replace("\n", "\n ")

    parts = []
    for name, value in data.items():
        if name == "runs":
            entries = [",\n".join(f"   {json.dumps(k)}: {json.dumps(v, default=float)}" for k, v in e.items())
                       for e in value]
            text = "[\n" + ",\n".join("  {\n" + e + "\n  }" for e in entries) + "\n ]" if entries else "[]"
        else:
            text = block(value)
        parts.append(f" {json.dumps(name)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


# -- statistics -------------------------------------------------------------------------------------------------------
def episode_gain(run: RunRecord | str, series: str = "") -> dict[str, Any]:
    """One run's eval curve and its gain over the first evaluation, paired episode by episode: ``{"success":
    {update: rate}, "first", "last" (updates), "gain", "gain_se" (over the episodes), "episodes"}``. ``run``: a
    record or a run folder."""
    outcomes = run.series(series) if isinstance(run, RunRecord) else eval_outcomes(run, series)
    if not outcomes:
        raise FileNotFoundError(f"{run if isinstance(run, str) else 'the record'} has no evaluations "
                                "(eval/<update>.json)")
    first, last = min(outcomes), max(outcomes)
    diff = (outcomes[last] - outcomes[first]).ravel()
    se = float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else float("nan")
    return dict(success={s: float(o.mean()) for s, o in outcomes.items()}, first=first, last=last,
                gain=float(diff.mean()), gain_se=se, episodes=int(diff.size))


def started_alike(a: RunRecord, b: RunRecord) -> bool:
    """Whether two runs of one seed started RL from the same policy: their initial-policy records agree (the warm
    start's weights hash; where it was built is ignored) where both have one, else their evaluations before the
    first update (update 0, the same episodes and sampling streams) have identical outcomes, as the same policy's
    do."""
    records = [r.initial_policy for r in (a, b) if r.initial_policy is not None]
    unhashed = any(r.get("source") == "warm_start" and not r.get("weights_sha256") for r in records)
    if len(records) == 2 and not unhashed:
        return {k: v for k, v in records[0].items() if k != "built_with"} == {
            k: v for k, v in records[1].items() if k != "built_with"}
    x, y = a.eval.get(0), b.eval.get(0)
    return x is not None and y is not None and x.shape == y.shape and bool(np.array_equal(x, y))


def _ms(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, np.float64)
    se = float(a.std(ddof=1) / np.sqrt(a.size)) if a.size > 1 else float("nan")
    mean = float(a.mean()) if a.size else float("nan")
    return {"mean": mean, "se": se, "z": mean / se if se and np.isfinite(se) else float("nan"), "n": float(a.size)}


def summarise(records: Mapping[Key, Any], threshold: float | None = None,
              baselines: Mapping[str, str] | None = None, threshold_method: str = THRESHOLD_METHOD,
              series: str = "", same_start: bool = False) -> dict[str, dict]:
    """Per method: initial / final / best eval success, gain, paired difference to the baseline, mean training
    success and its paired difference, updates to the threshold, and the curves (module docstring).
    ``records``: ``{(label, seed): RunRecord}`` (a run with an ``out_dir`` instead is read from its folder);
    ``baselines``: each label's baseline (default: :data:`BASELINE` for every label); ``series``: the evaluation
    series (``""`` or ``"held_out"``); ``same_start``: pair a seed only where both runs started alike (module
    docstring), listing the others in ``unpaired_seeds``."""
    records = _as_records(records)
    outcomes = {k: r.series(series) for k, r in records.items()}
    outcomes = {k: v for k, v in outcomes.items() if v}
    train = {k: records[k].train_success for k in outcomes}
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
            unpaired = [s for s in common if not started_alike(records[(label, s)], records[(baseline, s)])]
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


# -- the table and the figure -----------------------------------------------------------------------------------------
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
            f"start built on another CPU): {', '.join(unpaired)}.\n" if unpaired else "")
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
            se = np.nan_to_num(np.array([r["curve_se"][u] for u in steps], np.float64))
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
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


def write_report(records: Mapping[Key, Any], results: str, name: str, header: str, *,
                 config: Mapping[str, Any] | None = None, baselines: Mapping[str, str] | None = None,
                 baseline_column: str = BASELINE, threshold_method: str = THRESHOLD_METHOD,
                 held_out_header: str | None = None, title: str = "eval success (held-out rooms, ± SE over seeds)",
                 same_start: bool = False, extra: Mapping[str, Any] | None = None) -> dict:
    """``<name>_results.md`` / ``.json`` and ``<name>_curves.png`` in ``results``; returns the table.

    ``records``: ``{(label, seed): RunRecord}`` (:func:`gather`); runs (with an ``out_dir``) instead are gathered
    here, with the results JSON as the fallback. Without any record, a table the JSON stores is rendered again from
    its statistics (a table made before records were kept). ``config``: the setting, stored in the JSON (default:
    the first run's ``to_dict()`` where runs are given; a JSON's own where every record came from it).
    ``baselines`` / ``baseline_column``: each label's paired baseline and the column's name (default GRPO).
    ``held_out_header``: also tabulate the held-out series under this header (``.json``: ``held_out``);
    ``same_start``: pair only runs that started alike (:func:`summarise`); ``extra``: further tables computed from
    the same records, stored in the JSON beside (e.g. SERO's ``"branches"``)."""
    path = results_path(results, name)
    if any(not isinstance(v, RunRecord) for v in records.values()):
        if config is None and records:
            config = next(iter(records.values())).to_dict()
        records = gather(records, path)
    stored = load_results(path)
    if not records and "results" in stored:  # a table without records: its stored statistics
        table, held_out = stored_table(path), stored_table(path, "held_out") if held_out_header is not None else {}
        print(f"{name}: no run records; the table is rendered from the statistics stored in {path}")
    elif not records:
        raise FileNotFoundError(f"{name}: no run has evaluations and {path} stores no table")
    else:
        table = summarise(records, baselines=baselines, threshold_method=threshold_method, same_start=same_start)
        held_out = summarise(records, baselines=baselines, threshold_method="", series="held_out",
                             same_start=same_start) if held_out_header is not None else {}
    if "config" in stored and (config is None or all(r.source == path for r in records.values())):
        config = stored["config"]  # nothing new was run: the config that made the stored runs
    os.makedirs(results, exist_ok=True)
    text = markdown(table, header, baseline_column, threshold_method)
    if held_out:
        text += "\n" + markdown(held_out, held_out_header, baseline_column, None)
    with open(os.path.join(results, f"{name}_results.md"), "w") as f:
        f.write(text)
    data = {"config": _portable(dict(config or {}))}
    if records:
        data["runs"] = [record_to_json(k, r) for k, r in records.items()]
    data |= {"results": table} | ({"held_out": held_out} if held_out else {}) | dict(extra or {})
    with open(path, "w") as f:
        f.write(_dump(data))
    plot(table, os.path.join(results, f"{name}_curves.png"), held_out=held_out, title=title)
    print(text)
    return table


__all__ = ["BASELINE", "THRESHOLD_METHOD", "TRAIN_SUCCESS", "RunRecord", "episode_gain", "eval_outcomes", "gather",
           "load_results", "markdown", "plot", "read_record", "record_from_json", "record_to_json", "results_path",
           "started_alike", "stored_records", "stored_table", "summarise", "write_report"]

"""Pre-registration of the credit testbed's three settings, chosen by exact computation alone before any learning
run: ``python experiments/credit_testbed/preregister.py`` (``--quick``: a few seeds, for the tests).

The settings, the candidate grids and the selection rules are fixed here, before any number is computed; every
candidate is an :class:`envs.mdp.MDPConfig` with a few dozen states, so a tiny policy can plausibly learn it in
about a hundred updates. Random success is the uniform policy's exact success probability from the start state
(:func:`envs.mdp.random_success`), over the MDP seeds ``0 .. n−1`` of the train split (n = 64); the median over
seeds decides.

S1 — long horizon (does credit survive many steps?). Candidates: depth 8–16 with doomed rooms, dead ends or
  loops. Rule: among the candidates whose median random success lies in [2%, 20%], the longest safe path
  (``depth + 1 + lock``); ties go to the median closest to 6.3% (the geometric middle of the band) in log.
S2 — converging paths with slips (does the credit mechanism matter?). Candidates: width 2–3 (episodes meet in
  the same rooms), a slippery shortcut (``shortcut = 3``, ``slip = 0.3``) and/or slips in the rooms (``noise``),
  dead ends or loops. Rule: among the candidates whose median random success lies in [10%, 60%] (groups with
  mixed outcomes), the largest spread ``max_m − min_m`` of the methods' mean credit accuracy (Pearson) under the
  uniform policy, over the six competitors GRPO, RLOO, GiGPO, HGPO, GraphGPO, CRBC; ties to fewer states.
  Credit accuracy (:mod:`experiments.credit_testbed.rollouts`, :func:`agentjax.credit.accuracy.credit_accuracy`):
  per batch of G = 8 groups × R = 8 rollouts (one group per MDP seed, batch b on seeds 8b .. 8b+7, 32 batches),
  the visit-weighted Pearson correlation and sign agreement of each method's per-step advantage with the exact
  ``A^π`` (β = 0.98) over the decision rows; mean ± standard error over the batches (disjoint seed sets).
  PPO's GAE with the exact critic ``V^π`` is reported as an upper reference, not a competitor.
S3 — a lock (can a method learn what random play almost never sees?). Candidates: a chain of 3–6 lock states,
  each with one right action, after a few layers of rooms. Rule: among the candidates whose median random
  success is at most 0.5%, the highest median (the mildest lock within the bound); ties to fewer states.

Outputs: ``results/preregistration.json`` (per setting: ``selected``, the chosen candidate with its full
MDPConfig, per-seed random success and its other numbers; ``runners_up``, the next two eligible candidates in
the rule's order; ``candidates``, all of them) and ``results/preregistration.md`` (the tables).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence

import numpy as np

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from envs.mdp import BETA, MDPConfig, generate_mdp, random_success  # noqa: E402
from experiments.credit_testbed.rollouts import (  # noqa: E402
    DIAGNOSTICS,
    METHODS,
    REFERENCE,
    batch_accuracy,
    collect,
    summarise,
)

COMMAND = "python experiments/credit_testbed/preregister.py"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
S1_BAND = (0.02, 0.20)
S1_TARGET = math.sqrt(S1_BAND[0] * S1_BAND[1])
S2_BAND = (0.10, 0.60)
S3_MAX = 0.005

_C = MDPConfig
S1_CANDIDATES = (
    _C(depth=8, doomed=0.34),
    _C(depth=12, dead_ends=0.1),
    _C(depth=12, dead_ends=0.12, loops=0.1),
    _C(depth=12, doomed=0.34),
    _C(depth=16, dead_ends=0.12),
    _C(depth=16, dead_ends=0.1, loops=0.1),
)
S2_CANDIDATES = (
    _C(depth=6, width=2, dead_ends=0.15, shortcut=3, slip=0.3),
    _C(depth=6, width=2, dead_ends=0.15, noise=0.2),
    _C(depth=6, width=2, dead_ends=0.15, shortcut=3, slip=0.3, noise=0.2),
    _C(depth=6, width=3, dead_ends=0.15, shortcut=3, slip=0.3, noise=0.2),
    _C(depth=6, width=2, dead_ends=0.15, shortcut=3, slip=0.3, noise=0.4),
    _C(depth=6, width=2, dead_ends=0.1, loops=0.15, shortcut=3, slip=0.3, noise=0.2),
)
S3_CANDIDATES = (
    _C(depth=4, lock=4),
    _C(depth=4, lock=5),
    _C(depth=4, lock=6),
    _C(depth=6, dead_ends=0.1, lock=4),
    _C(depth=6, doomed=0.34, lock=3),
    _C(depth=6, doomed=0.34, lock=4),
)
CANDIDATES = {"S1": S1_CANDIDATES, "S2": S2_CANDIDATES, "S3": S3_CANDIDATES}

PURPOSE = {
    "S1": "long horizon: the uniform policy succeeds now and then, many steps from the start",
    "S2": "converging paths with slips: the setting where the methods' credit accuracy differs most",
    "S3": "a lock: the uniform policy almost never reaches the goal",
}
RULES = {
    "S1": f"median random success in [{S1_BAND[0]:.0%}, {S1_BAND[1]:.0%}]; the longest safe path (depth + 1 + lock); "
          f"ties: median closest to {S1_TARGET:.1%} in log",
    "S2": f"median random success in [{S2_BAND[0]:.0%}, {S2_BAND[1]:.0%}]; the largest spread (max − min) of the mean "
          f"credit accuracy (Pearson) under the uniform policy over {', '.join(METHODS)}; ties: fewer states",
    "S3": f"median random success <= {S3_MAX:.1%}; the highest median; ties: fewer states",
}


@dataclasses.dataclass(frozen=True)
class Prereg:
    """How much is computed; :meth:`quick` is the tests' run."""

    success_seeds: int = 64  # MDP seeds 0 .. n−1 for random success
    credit_batches: int = 32  # batches of S2's credit accuracy
    groups: int = 8  # G groups per batch, one MDP seed each
    rollouts: int = 8  # R rollouts per group
    sample_seed: int = 0  # action draws and slips
    beta: float = BETA
    out: str = RESULTS

    @classmethod
    def quick(cls, out: str) -> Prereg:
        return cls(success_seeds=8, credit_batches=2, groups=4, rollouts=4, out=out)


def describe(config: MDPConfig) -> str:
    """Depth, width and the other knobs that differ from ``MDPConfig()``: ``"depth=16 width=3 dead_ends=0.1"``."""
    default = MDPConfig()
    return " ".join(f"{f.name}={getattr(config, f.name)}" for f in dataclasses.fields(config)
                    if f.name in ("depth", "width") or getattr(config, f.name) != getattr(default, f.name))


def success_numbers(config: MDPConfig, seeds: Sequence[int]) -> dict:
    """The uniform policy's exact success over ``seeds``: per seed and its summary; the model's size."""
    per_seed = random_success(config, seeds)
    states = [generate_mdp(int(s), config).num_states for s in seeds]
    return dict(
        random_success_median=float(np.median(per_seed)), random_success_mean=float(per_seed.mean()),
        random_success_q10=float(np.quantile(per_seed, 0.1)), random_success_q90=float(np.quantile(per_seed, 0.9)),
        random_success_per_seed=per_seed.tolist(), states_mean=float(np.mean(states)), states_max=int(max(states)),
        step_cap=config.step_cap, safe_path=config.safe_path,
    )


def credit_numbers(config: MDPConfig, prereg: Prereg, max_steps: int) -> dict:
    """Each method's credit accuracy under the uniform policy (module docstring, S2), mean ± SE over batches."""
    per_batch = []
    for b in range(prereg.credit_batches):
        seeds = list(range(b * prereg.groups, (b + 1) * prereg.groups))
        rollouts = collect(config, seeds, prereg.rollouts, sample_seed=prereg.sample_seed, max_steps=max_steps)
        per_batch.append(batch_accuracy(rollouts, beta=prereg.beta))
    accuracy = summarise(per_batch)
    means = [accuracy[m]["pearson"] for m in METHODS]
    best = int(np.argmax(means))
    return dict(accuracy=accuracy, spread=float(max(means) - min(means)), best=METHODS[best],
                worst=METHODS[int(np.argmin(means))], best_minus_grpo=float(means[best] - accuracy["GRPO"]["pearson"]))


# -- the rules ---------------------------------------------------------------------------------------------------------
def _in(band: tuple[float, float], x: float) -> bool:
    return band[0] <= x <= band[1]


def rank(setting: str, rows: Sequence[dict]) -> list[dict]:
    """The candidates of a setting, the rule's choice first, then the other eligible ones in the rule's order,
    then the ineligible ones; each row gets ``eligible``."""
    for row in rows:
        med = row["random_success_median"]
        row["eligible"] = {"S1": _in(S1_BAND, med), "S2": _in(S2_BAND, med), "S3": med <= S3_MAX}[setting]
    key = {
        "S1": lambda r: (-r["safe_path"], abs(math.log(max(r["random_success_median"], 1e-300) / S1_TARGET))),
        "S2": lambda r: (-r["spread"], r["states_mean"]),
        "S3": lambda r: (-r["random_success_median"], r["states_mean"]),
    }[setting]
    return sorted([r for r in rows if r["eligible"]], key=key) + [r for r in rows if not r["eligible"]]


def run(prereg: Prereg, log=print) -> dict:
    """Every candidate's numbers and the three selections (module docstring)."""
    start = time.perf_counter()
    seeds = list(range(prereg.success_seeds))
    t_pad = max(c.step_cap for c in S2_CANDIDATES)  # one compiled shape for every S2 candidate
    settings = {}
    for setting, candidates in CANDIDATES.items():
        rows = []
        for i, config in enumerate(candidates):
            row = dict(id=f"{setting}.{i + 1}", name=describe(config), config=dataclasses.asdict(config),
                       **success_numbers(config, seeds))
            if setting == "S2" and _in(S2_BAND, row["random_success_median"]):
                row.update(credit_numbers(config, prereg, t_pad))
            elif setting == "S2":
                row.update(accuracy=None, spread=float("nan"), best=None, worst=None, best_minus_grpo=float("nan"))
            log(f"{row['id']} {row['name']:62s} random success median {row['random_success_median']:.4f}"
                + (f"  spread {row['spread']:.3f}" if setting == "S2" else "")
                + f"  [{time.perf_counter() - start:.0f} s]")
            rows.append(row)
        ranked = rank(setting, rows)
        selected = ranked[0] if ranked and ranked[0]["eligible"] else None
        settings[setting] = dict(
            purpose=PURPOSE[setting], rule=RULES[setting],
            selected=selected, runners_up=[r for r in ranked[1:] if r["eligible"]][:2], candidates=ranked,
        )
    return dict(
        command=COMMAND + (" --quick" if prereg.success_seeds < Prereg().success_seeds else ""),
        beta=prereg.beta, success_seeds=seeds,
        credit=dict(batches=prereg.credit_batches, groups=prereg.groups, rollouts=prereg.rollouts,
                    sample_seed=prereg.sample_seed, max_steps=t_pad, policy="uniform",
                    seeds_of_batch="b * groups .. (b + 1) * groups - 1",
                    methods=list(METHODS), reference=REFERENCE, diagnostics=list(DIAGNOSTICS)),
        settings=settings, runtime_s=round(time.perf_counter() - start, 1),
    )


# -- output ------------------------------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.2f}%" if x >= 0.001 else f"{100 * x:.3f}%"


def _pm(row: Mapping | None, metric: str) -> str:
    if row is None or row.get(metric) is None or not np.isfinite(row[metric]):
        return "–"
    fmt = "+.3f" if metric == "pearson" else ".3f"
    se = row.get(f"{metric}_se")
    return f"{row[metric]:{fmt}} ± {se:.3f}" if se is not None and np.isfinite(se) else f"{row[metric]:{fmt}}"


def markdown(result: Mapping) -> str:
    """The tables of ``preregistration.md``."""
    s = result["settings"]
    lines = ["# Credit testbed: pre-registration", "",
             f"Command: `{result['command']}` ({result['runtime_s']:.0f} s). Random success: the uniform policy's "
             f"exact success probability, median over MDP seeds 0..{len(result['success_seeds']) - 1}. Credit "
             f"accuracy: {result['credit']['batches']} batches of {result['credit']['groups']} groups × "
             f"{result['credit']['rollouts']} rollouts under the uniform policy, Pearson and sign agreement with the "
             f"exact A^π (β = {result['beta']}) over decision rows, mean ± SE over batches.", "",
             "## Selected", "", "| setting | purpose | candidate (depth, width, other knobs set) | states | H | "
             "random success (median [q10, q90]) |", "|---|---|---|---|---|---|"]
    for name, st in s.items():
        row = st["selected"]
        if row is None:
            lines.append(f"| {name} | {st['purpose']} | none satisfies the rule | | | |")
            continue
        lines.append(f"| {name} | {st['purpose']} | {row['id']} `{row['name']}` | {row['states_mean']:.0f} | "
                     f"{row['step_cap']} | "
                     f"{_pct(row['random_success_median'])} [{_pct(row['random_success_q10'])}, "
                     f"{_pct(row['random_success_q90'])}] |")
    lines += ["", "Full settings:", "", "```python"]
    lines += [f"{name} = {MDPConfig(**st['selected']['config'])!r}" for name, st in s.items() if st["selected"]]
    lines += ["```"]
    for name, st in s.items():
        lines += ["", f"## {name}: {st['purpose']}", "", f"Rule: {st['rule']}.", "",
                  f"Selected: {_label(st['selected'])}; runners-up: "
                  + (", ".join(_label(r) for r in st["runners_up"]) or "none") + ".", ""]
        head = "| id | candidate | eligible | states | safe path | H | random success median | q10 | q90 |"
        extra = " spread | best | worst | best − GRPO |" if name == "S2" else ""
        lines += [head + extra, "|" + "---|" * (9 + (4 if name == "S2" else 0))]
        for r in st["candidates"]:
            mark = "**" if st["selected"] is not None and r["id"] == st["selected"]["id"] else ""
            cells = (f"| {mark}{r['id']}{mark} | `{r['name']}` | {'yes' if r['eligible'] else 'no'} | "
                     f"{r['states_mean']:.0f} | "
                     f"{r['safe_path']} | {r['step_cap']} | {_pct(r['random_success_median'])} | "
                     f"{_pct(r['random_success_q10'])} | {_pct(r['random_success_q90'])} |")
            if name == "S2":
                spread, gain = (f"{r[k]:.3f}" if np.isfinite(r[k]) else "–" for k in ("spread", "best_minus_grpo"))
                cells += f" {spread} | {r['best'] or '–'} | {r['worst'] or '–'} | {gain} |"
            lines.append(cells)
        if name == "S2":
            lines += _accuracy_tables(st["candidates"], result["credit"])
    return "\n".join(lines) + "\n"


def _label(row: Mapping | None) -> str:
    return "none" if row is None else f"{row['id']} `{row['name']}`"


def _accuracy_tables(rows: Sequence[Mapping], credit: Mapping) -> list[str]:
    names = [*credit["methods"], credit["reference"], *credit["diagnostics"]]
    scored = [r for r in rows if r["accuracy"] is not None]
    out = []
    for metric, title in (("pearson", "Pearson"), ("sign_agreement", "sign agreement")):
        out += ["", f"Credit accuracy ({title}) under the uniform policy, mean ± SE over batches "
                f"({credit['reference']} is an upper reference; the last two rows are step terms alone):", "",
                "| method | " + " | ".join(r["id"] for r in scored) + " |",
                "|---|" + "---|" * len(scored)]
        for m in names:
            out.append(f"| {m} | " + " | ".join(_pm(r["accuracy"].get(m), metric) for r in scored) + " |")
    return out


def _clean(x):
    """JSON-safe: NaN and infinities become null, numpy scalars plain numbers."""
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write(result: Mapping, out: str) -> tuple[str, str]:
    """``preregistration.json`` and ``preregistration.md`` in ``out``; returns their paths."""
    os.makedirs(out, exist_ok=True)
    paths = os.path.join(out, "preregistration.json"), os.path.join(out, "preregistration.md")
    with open(paths[0], "w") as f:
        json.dump(_clean(result), f, indent=1, allow_nan=False)
        f.write("\n")
    with open(paths[1], "w") as f:
        f.write(markdown(result))
    return paths


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seeds and batches (tests)")
    parser.add_argument("--out", default=None, help=f"output folder (default {os.path.relpath(RESULTS)})")
    args = parser.parse_args(argv)
    prereg = Prereg.quick(args.out or RESULTS) if args.quick else Prereg(out=args.out or RESULTS)
    print("Candidates and rules are fixed before any number is computed:")
    for setting, rule in RULES.items():
        print(f"  {setting} ({PURPOSE[setting]}): {len(CANDIDATES[setting])} candidates; rule: {rule}")
        for config in CANDIDATES[setting]:
            print(f"      {describe(config)}")
    result = run(prereg)
    paths = write(result, prereg.out)
    print(markdown(result))
    print(f"wrote {paths[0]} and {paths[1]}")
    return result


if __name__ == "__main__":
    main()

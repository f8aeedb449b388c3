"""Benchmark: SERO's oracle branch as a share of a trainer update, per environment.

For each environment the real trainer (:func:`agentjax.train.trainer.train`) runs ``--updates`` updates of its
tiny preset (:func:`agentjax.train.presets.tiny`, GRPO, a random-init policy: no warm start, no evaluation, no
checkpoints) with ``TrainConfig.sero = SeroConfig()`` (λ_O 0.1, uniform roots, the remaining budget), each env in
its own child process under ``--env-timeout``. From ``metrics.jsonl``, over the updates after the first (which
compiles), medians of:

- the update: ``time/total`` = collect (generate, prompt, env, with SERO's per-turn snapshots) + credit + the
  branch + the optimizer step (``time/update``, which includes the auxiliary loss L_O on the oracle rows);
- the branch (``time/sero``, :meth:`agentjax.train.sero.SeroBranch.branch`) and its split: ``restore`` (snapshots
  into the branch slots, validation), ``oracle`` (the env's oracle + the env steps of the branches), ``prompt``
  (prompts, replies, constrained choices), ``score`` (one batched forward of the behaviour policy over the oracle
  batch, blocked on), ``other`` (root selection, packing the oracle batch, weights and gates, metrics);
- the branch's share of the update (``branch / total``, both from the same updates) and the branch against the
  update without it (``branch / (total - branch)``);
- the reference for L_O (on by default; ``--no-reference`` skips it): before each optimizer step the child runs the
  same step on a copy of the same state with the same batch and key but *without* the oracle rows (timed, then
  dropped; its seconds are taken off the loop's clock). ``with L_O / without`` is L_O's cost inside the optimizer
  step, which is SERO's too but not the branch's; ``(branch + L_O) / update`` is SERO's whole per-update cost;
- environment steps: the branch's (``sero/env_steps``) against the primary rollouts' (``rollout/num_turns``), and
  the seconds per step of each (oracle + branch step vs the primary env step alone);
- the scored oracle rows: real (``sero/oracle_steps``) against the fixed capacity the forward computes.

Compiles: on CPU the update and the scorer compile once per prompt width (``compact_rows``), so a later update with
a new width compiles again. The child counts the seconds spent tracing, lowering and compiling (``jax.monitoring``)
in each update, in its branch, in its optimizer step and in the reference step; every figure is reported as
measured and without those seconds (``no compiles``: the steady state of a run that has seen its widths).

The sizes where they differ from the tiny preset are set to fit a shared 2-core CPU (``GROUPS``, ``CAPS``,
``--groups``, ``--caps``; each env's settings are in the JSON): fewer groups (8 rollouts each, as the preset) keep
the ratio of one root per group to 8 rollouts per group while cutting both sides (with one group, though, the
oracle rows fill a micro-batch of L_O less well than with the preset's 4, which inflates L_O's share); TextCraft's
step cap is cut to 10 (its oracle wins in a few steps). WebShop collects with ``truncation="left"`` (``COLLECT``):
its tiny preset's 2,048 prompt tokens stop a random policy's run. ``alfworld`` at its preset cap of 50 steps (the
paper's budget) is the *ALFWorld-shaped* measurement; the target is a branch < 25% of the update there
(``TARGET``; met when both the measured share and the one without compiles are below it).

Data: WebShop and TextCraft read ``$AGENTJAX_DATA`` (default ``../shared/data``); ALFWorld reads ``$ALFWORLD_DATA``,
else ``.data/alfworld`` when it is there, else the train archive of ``$AGENTJAX_DATA/alfworld`` is unpacked into a
temporary folder for the run (removed at the end). An env whose data is missing is skipped with the reason printed.

Usage (the four envs take the better part of an hour on 2 CPU cores, ALFWorld most of it)::

    .venv/bin/python experiments/bench/sero.py [--envs sokoban,textcraft,webshop,alfworld] [--updates 3]
        [--groups webshop=2,alfworld=1] [--caps textcraft=10] [--env-timeout 1100] [--no-reference] [--merge]
        [--workers 2] [--oracle-timeout 10] [--alfworld-expert planner|handcoded]

``--merge`` keeps the rows of the envs (and variants) not run now from the existing JSON (each row has its own date
and load), so the envs can be measured one invocation at a time.

Variants (each its own row and target verdict): ``--workers N`` steps the envs in N worker processes (default: in
the trainer's process); ``--oracle-timeout S`` bounds each oracle call of the branch (``SeroConfig.oracle_timeout``,
needs workers: ALFWorld's planner is a blind search without a time limit, 0.1 s to minutes per plan, and a branch
past the bound ends ``timeout``, counted and not trained on); ``--alfworld-expert handcoded`` uses ALFWorld's
hand-coded expert instead of the planner. Variants are separate runs whose roots need not be the same ones (with one
root an update, a variant's share rests on the few roots it drew): compare them over several timed updates.

Prints two tables and writes ``experiments/bench/results/sero.json``. Absolute seconds on a shared 2-core machine
are noisy; quote the shares (both sides from the same updates).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "sero.json"
ENVS = ("sokoban", "textcraft", "webshop", "alfworld")
TARGET = 0.25  # branch / update on ALFWorld-shaped branches
TARGET_ENV = "alfworld"
# Sizes that fit a shared 2-core CPU (the preset's where absent): groups per update and step caps.
GROUPS = {"textcraft": 1, "webshop": 1, "alfworld": 1}
CAPS: dict[str, int] = {"textcraft": 10}
PARTS = ("restore", "oracle", "prompt", "score")
# Collector overrides: the tiny WebShop preset's 2,048 prompt tokens fit the oracle's demonstrations; a random
# policy's pages can go past them, which would stop the run with truncation="error".
COLLECT = {"webshop": dict(truncation="left")}


# -- the child: one env's run -----------------------------------------------------------------------------------------
def build_run(env: str, groups: int | None, cap: int | None, updates: int, out_dir: str, *, workers: int = 0,
              oracle_timeout: float | None = None, expert: str | None = None):
    """The tiny preset of ``env`` with SERO on, random init, resized to ``groups`` × 8 rollouts × ``cap`` steps;
    ``workers`` env processes, the branch's ``oracle_timeout`` and ALFWorld's ``expert`` (module docstring)."""
    from agentjax.train.config import SeroConfig
    from agentjax.train.presets import _sized, tiny

    run = tiny("grpo", env)
    ro = run.train.rollout
    groups, cap = groups or ro.num_groups, cap or ro.max_steps
    train = run.train.replace(sero=SeroConfig(oracle_timeout=oracle_timeout))
    rows, mini = groups * ro.group_size * cap, train.mini_batches
    micro = max(d for d in range(1, train.micro_batch_size + 1) if rows % (mini * d) == 0)
    train = train.replace(micro_batch_size=micro)
    sizes = _sized(train, run.collect.replace(**COLLECT.get(env, {})), num_groups=groups, group_size=ro.group_size,
                   max_steps=cap, prompt_len=ro.prompt_len, response_len=ro.response_len)
    env_kwargs = dict(run.env_kwargs) | ({"expert": expert} if expert else {})
    return run.replace(**sizes, warm_start=None, eval_every=0, checkpoint_every=0, updates=updates, out_dir=out_dir,
                       progress=False, workers=workers, env_kwargs=env_kwargs)


COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


class Compiles:
    """Seconds spent tracing, lowering and compiling so far in this process (``jax.monitoring``)."""

    def __init__(self) -> None:
        import jax

        self.seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event: str, seconds: float, **_) -> None:
        if event in COMPILE_EVENTS:
            self.seconds += float(seconds)


def instrument(flat, sero, out_dir: str, reference: bool) -> None:
    """Wrap the flat algorithm's update and SERO's branch (the child only). The update first runs, with
    ``reference``, the same optimizer step on a copy of the same state, batch and key without the oracle rows (blocked
    on, then dropped), then the real one (blocked on); one line per update in ``update.jsonl``: ``ref_s``,
    ``real_s``, ``extra_s`` (the wrapper's seconds besides the real step: the parent takes them off ``time/update``
    and ``time/total``) and the compile seconds of the reference, of the real step and of the whole update outside the
    reference (``compile_s``: collect + credit + branch + step). One line per branch in ``branch.jsonl``: its compile
    seconds."""
    import jax
    import jax.numpy as jnp

    compiles = Compiles()
    mark = dict(last=0.0, excluded=0.0)  # compile seconds at the end of the last update; those of references

    def log(name: str, **row) -> None:
        with open(os.path.join(out_dir, name), "a") as f:
            f.write(json.dumps(row) + "\n")

    def factory(*a, **kw):
        update = make_update(*a, **kw)

        def timed(state, batch, key):
            t0, c0 = time.perf_counter(), compiles.seconds
            ref_s = None
            if reference and batch.oracle is not None:
                copy = jax.block_until_ready(jax.tree.map(jnp.copy, state))  # the update donates its state
                t1 = time.perf_counter()
                jax.block_until_ready(update(copy, batch.replace(oracle=None), key))
                ref_s = time.perf_counter() - t1
            c1, t2 = compiles.seconds, time.perf_counter()
            out = jax.block_until_ready(update(state, batch, key))
            real_s, c2 = time.perf_counter() - t2, compiles.seconds
            mark["excluded"] += c1 - c0
            log("update.jsonl", ref_s=ref_s, real_s=real_s, extra_s=t2 - t0, compile_ref_s=c1 - c0,
                compile_step_s=c2 - c1, compile_s=c2 - mark["last"] - (c1 - c0))
            mark["last"] = c2
            return out

        return timed

    def branch(self, *a, **kw):
        c0 = compiles.seconds
        out = sero_branch(self, *a, **kw)
        log("branch.jsonl", compile_s=compiles.seconds - c0)
        return out

    make_update, sero_branch = flat.make_update, sero.SeroBranch.branch
    flat.make_update, sero.SeroBranch.branch = factory, branch


def child(args: argparse.Namespace) -> None:
    from agentjax.train import flat, sero, trainer

    expert = args.alfworld_expert if args.child == "alfworld" else None
    run = build_run(args.child, args.child_groups, args.child_cap, args.updates, args.child_out, workers=args.workers,
                    oracle_timeout=args.oracle_timeout, expert=expert)
    run.spec.tasks(run.spec.train_split)  # a missing data folder fails here, before any work
    instrument(flat, sero, args.child_out, args.reference)
    trainer.train(run)


# -- the parent -------------------------------------------------------------------------------------------------------
def data_problem(env: str) -> str | None:
    """Why ``env``'s data is missing (None: it is there); sets ``ALFWORLD_DATA`` when it unpacks the games."""
    from agentjax.train.runconfig import ENVS as SPECS

    try:
        SPECS[env].tasks(SPECS[env].train_split)
    except (FileNotFoundError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def alfworld_data(tmp: str) -> str | None:
    """Point ``ALFWORLD_DATA`` at the unpacked games (module docstring); the reason when there are none."""
    if os.environ.get("ALFWORLD_DATA"):
        return None
    local = ROOT / ".data" / "alfworld"
    if (local / "json_2.1.1" / "train").is_dir():
        os.environ["ALFWORLD_DATA"] = str(local)
        return None
    from envs.alfworld.prepare_data import prepare
    from envs.base import data_root

    try:
        archives = data_root("alfworld")
        dest = pathlib.Path(tmp) / "alfworld"
        t0 = time.perf_counter()
        prepare(archives, dest, ("train",))
        print(f"alfworld: unpacked the train games into {dest} ({time.perf_counter() - t0:.1f} s)", flush=True)
    except FileNotFoundError as e:
        return f"no ALFWorld games: {e}"
    os.environ["ALFWORLD_DATA"] = str(dest)
    return None


def run_env(env: str, args: argparse.Namespace, tmp: str) -> dict:
    out_dir = os.path.join(tmp, env)
    cmd = [sys.executable, __file__, "--child", env, "--child-out", out_dir, "--updates", str(args.updates)]
    cmd += [] if args.no_reference else ["--reference"]
    cmd += ["--workers", str(args.workers)] + (["--oracle-timeout", str(args.oracle_timeout)] if args.oracle_timeout
                                               else []) + ["--alfworld-expert", args.alfworld_expert]
    if env in args.groups:
        cmd += ["--child-groups", str(args.groups[env])]
    if env in args.caps:
        cmd += ["--child-cap", str(args.caps[env])]
    t0 = time.perf_counter()
    with open(os.path.join(tmp, f"{env}.log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=args.env_timeout)
        except subprocess.TimeoutExpired:  # what it logged so far is kept (metrics.jsonl is written per update)
            proc.kill()
            proc.wait()
            rc = None
    wall = time.perf_counter() - t0
    path = os.path.join(out_dir, "metrics.jsonl")
    records = [json.loads(line) for line in open(path) if line.strip()] if os.path.exists(path) else []
    config = json.load(open(os.path.join(out_dir, "run_config.json"))) if os.path.isdir(out_dir) else None
    read = lambda name: [json.loads(line) for line in open(os.path.join(out_dir, name)) if line.strip()
                         ] if os.path.exists(os.path.join(out_dir, name)) else []
    for r, u, b in zip(records, read("update.jsonl"), read("branch.jsonl"), strict=False):
        r["time/update"] -= u["extra_s"]  # the loop's clock without the reference step
        r["time/total"] -= u["extra_s"]
        r |= {"compile/total": u["compile_s"], "compile/update": u["compile_step_s"], "compile/sero": b["compile_s"]}
        if u["ref_s"] is not None:
            r |= {"ref/update_without_oracle": u["ref_s"], "compile/ref": u["compile_ref_s"]}
    out = dict(env=env, variant=variant(env, args.alfworld_expert, args.workers, args.oracle_timeout),
               command=" ".join(["python experiments/bench/sero.py", *sys.argv[1:]]), wall_s=wall, returncode=rc,
               timed_out=rc is None, updates_done=len(records), settings=settings(config) if config else None)
    if rc not in (0, None) or len(records) < 2:
        with open(os.path.join(tmp, f"{env}.log")) as f:
            out["log_tail"] = f.read()[-3000:]
        out["error"] = ("timed out" if rc is None else f"exit {rc}") + f" after {len(records)} update(s)"
    if len(records) >= 2:
        out |= summarise(records[1:])
        out["first_update"] = dict(total_s=records[0]["time/total"], branch_s=records[0].get("time/sero"))
    return out


def variant(env: str, expert: str, workers: int, timeout: float | None) -> str:
    """A row's settings besides the sizes: ALFWorld's expert, the env workers, the branch's oracle timeout."""
    parts = [f"{expert} expert"] if env == "alfworld" else []
    parts.append(f"{workers} env workers" if workers else "serial envs")
    return ", ".join(parts + ([f"oracle timeout {timeout:g} s"] if timeout else []))


def row_variant(r: dict) -> str:
    """A row's variant (rows written before variants existed: from their settings)."""
    if "variant" in r or not r.get("settings"):
        return r.get("variant", "")
    s = r["settings"]
    return variant(r["env"], s["env_kwargs"].get("expert", "planner"), s["workers"],
                    (s["sero"] or {}).get("oracle_timeout"))


def settings(config: dict) -> dict:
    train, ro = config["train"], config["train"]["rollout"]
    return dict(groups=ro["num_groups"], group_size=ro["group_size"], max_steps=ro["max_steps"],
                prompt_len=ro["prompt_len"], response_len=ro["response_len"], rows=ro["capacity"],
                micro_batch_size=train["micro_batch_size"], mini_batches=train["mini_batches"],
                sero=train["sero"], workers=config["workers"], env_kwargs=config["env_kwargs"],
                truncation=config["collect"].get("truncation"))


def timings(records: list[dict]) -> dict:
    """Median seconds of the update, its stages and the branch's parts, and the shares (module docstring)."""
    med = lambda f: statistics.median(f(r) for r in records)
    get = lambda k: lambda r: float(r.get(k, 0.0))
    other = lambda r: r["sero/time_total"] - sum(r.get(f"sero/time_{k}", 0.0) for k in PARTS)
    parts = {k: med(get(f"sero/time_{k}")) for k in PARTS} | {"other": med(other)}
    stages = {k: med(get(f"time/{k}")) for k in ("generate", "prompt", "env", "credit", "update")}
    stages["collect"] = med(lambda r: r["time/total"] - sum(r.get(f"time/{k}", 0.0) for k in
                                                             ("credit", "sero", "update")))
    return dict(
        total_s=med(get("time/total")), branch_s=med(get("time/sero")), branch_parts_s=parts, stages_s=stages,
        share=med(lambda r: r["time/sero"] / r["time/total"]),
        branch_over_rest=med(lambda r: r["time/sero"] / (r["time/total"] - r["time/sero"])),
        parts_share_of_branch={k: med(lambda r, k=k: (other(r) if k == "other" else r.get(f"sero/time_{k}", 0.0))
                                      / r["time/sero"]) for k in (*PARTS, "other")},
        reference=reference(records))


def without_compiles(records: list[dict]) -> list[dict] | None:
    """``records`` with the seconds spent compiling taken off each timing they fell in (the branch's: off its
    score, where the scorer compiles for a new prompt width); None without the child's compile log."""
    if not all("compile/total" in r for r in records):
        return None
    out = []
    for r in records:
        r = dict(r)
        r["time/total"] -= r["compile/total"]
        r["time/update"] -= r["compile/update"]
        r["time/sero"] -= r["compile/sero"]
        r["sero/time_total"] -= r["compile/sero"]
        r["sero/time_score"] = max(r["sero/time_score"] - r["compile/sero"], 0.0)
        if "ref/update_without_oracle" in r:
            r["ref/update_without_oracle"] -= r["compile/ref"]
        out.append(r)
    return out


def summarise(records: list[dict]) -> dict:
    """Medians over ``records`` (the updates after the first): as measured, and without the compiles (a new prompt
    width compiles the update and the scorer again; a long run stops compiling once it has seen its widths)."""
    med = lambda f: statistics.median(f(r) for r in records)
    get = lambda k: lambda r: float(r.get(k, 0.0))
    def per_step(num: str, den: str) -> float:  # over the updates that took such steps
        some = [r[num] / r[den] for r in records if r.get(den)]
        return statistics.median(some) if some else math.nan
    warm = without_compiles(records)
    return timings(records) | dict(
        updates_timed=len(records),
        compile_s={k: med(get(f"compile/{k}")) for k in ("total", "sero", "update", "ref")} if warm else None,
        without_compiles=timings(warm) if warm else None,
        env_steps=dict(branch=med(get("sero/env_steps")), primary=med(get("rollout/num_turns")),
                       ratio=med(lambda r: r.get("sero/env_steps", 0.0) / r["rollout/num_turns"])),
        seconds_per_env_step=dict(branch_oracle_and_step=per_step("sero/time_oracle", "sero/env_steps"),
                                  primary_env=per_step("time/env", "rollout/num_turns")),
        roots=dict(attempted=med(get("sero/roots_attempted")), valid=med(get("sero/roots_valid")),
                   gated=med(get("sero/roots_gated"))),
        ended={k.removeprefix("sero/ended_"): med(get(k)) for k in records[0] if k.startswith("sero/ended_")},
        scored_rows=dict(real=med(get("sero/oracle_steps"))),
        per_update=[{k: v for k, v in r.items() if k.startswith(("time/", "sero/time_", "sero/env_steps",
                                                                 "rollout/num_turns", "sero/oracle_steps", "ref/",
                                                                 "compile/", "sero/ended_", "sero/roots_"))}
                    for r in records],
    )


def reference(records: list[dict]) -> dict | None:
    """The optimizer step with L_O against the same step without it (same state, batch and key): L_O's seconds in
    the update, and SERO's whole cost (branch + L_O) as a share of the update."""
    if not all("ref/update_without_oracle" in r for r in records):
        return None
    med = lambda f: statistics.median(f(r) for r in records)
    lo = lambda r: r["time/update"] - r["ref/update_without_oracle"]
    return dict(update_without_oracle_s=med(lambda r: r["ref/update_without_oracle"]), update_with_oracle_s=med(
        lambda r: r["time/update"]), oracle_loss_s=med(lo),
        update_ratio=med(lambda r: r["time/update"] / r["ref/update_without_oracle"]),
        sero_share=med(lambda r: (r["time/sero"] + lo(r)) / r["time/total"]))


def _views(r: dict) -> list[tuple[str, dict]]:
    return [("measured", r)] + ([("no compiles", r["without_compiles"])] if r.get("without_compiles") else [])


def print_table(rows: list[dict], targets: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="SERO's branch in a trainer update: medians over the updates after the first (seconds); "
                    "shared 2-core CPU")
    cols = ("env", "G×R×T", "timing", "update", "collect", "opt step", "branch", "restore", "oracle", "prompt",
            "score", "other", "branch/update", "compiles", "env steps br/prim", "s/step br vs prim",
            "scored rows real/cap")
    for c in cols:
        t.add_column(c, justify="left" if c in ("env", "timing") else "right")
    for r in rows:
        if "share" not in r:
            t.add_row(r["env"], *["-"] * (len(cols) - 2), r.get("skipped") or r.get("error", ""))
            continue
        s, e, sp = r["settings"], r["env_steps"], r["seconds_per_env_step"]
        for i, (name, v) in enumerate(_views(r)):
            p = v["branch_parts_s"]
            first = i == 0
            label = f"{r['env']} ({row_variant(r)})"
            t.add_row(label if first else "", f"{s['groups']}×{s['group_size']}×{s['max_steps']}" if first else "",
                      name, f"{v['total_s']:.2f}", f"{v['stages_s']['collect']:.2f}",
                      f"{v['stages_s']['update']:.2f}", f"{v['branch_s']:.2f}",
                      *(f"{p[k]:.3f}" for k in (*PARTS, "other")), f"{100 * v['share']:.1f}%",
                      f"{r['compile_s']['total']:.1f}" if first and r.get("compile_s") else "",
                      f"{e['branch']:.0f} / {e['primary']:.0f}" if first else "",
                      f"{1e3 * sp['branch_oracle_and_step']:.1f} / {1e3 * sp['primary_env']:.1f} ms" if first else "",
                      f"{r['scored_rows']['real']:.0f} / {r['scored_rows']['capacity']}" if first else "")
    console = Console(width=220)
    console.print(t)
    ref = Table(title="L_O in the optimizer step: the same step (state, batch, key) with and without the oracle rows")
    for c in ("env", "timing", "opt step without L_O", "with L_O", "ratio", "L_O seconds", "branch + L_O / update",
              "updates timed"):
        ref.add_column(c, justify="left" if c in ("env", "timing") else "right")
    for r in rows:
        for i, (name, v) in enumerate(_views(r) if "share" in r else []):
            x = v.get("reference")
            if x:
                label = f"{r['env']} ({row_variant(r)})"
                ref.add_row(label if i == 0 else "", name, f"{x['update_without_oracle_s']:.2f}",
                            f"{x['update_with_oracle_s']:.2f}", f"{x['update_ratio']:.2f}x",
                            f"{x['oracle_loss_s']:.2f}", f"{100 * x['sero_share']:.1f}%", str(r["updates_timed"]))
    console.print(ref)
    for check in targets:
        console.print(f"target: branch < {100 * TARGET:.0f}% of the update on {TARGET_ENV} (ALFWorld-shaped): "
                      f"{check['verdict']}")


def target_checks(rows: list[dict]) -> list[dict]:
    """:func:`target_check` of every measured ALFWorld row (one per variant)."""
    aims = [r for r in rows if r["env"] == TARGET_ENV and "share" in r]
    if not aims:
        return [dict(env=TARGET_ENV, threshold=TARGET, met=None, verdict="not measured")]
    return [target_check(r) for r in aims]


def target_check(aim: dict) -> dict:
    """The branch's share on ALFWorld against ``TARGET``: per timed update, their median, pooled (Σ branch / Σ update:
    the share of a run's time) and maximum, as measured and without compiles; met when the median and the pooled
    share are below it in both views. The same for branch + L_O where the reference ran. Also the branches lost to
    the oracle timeout (their supervision is the price of the bound)."""
    views = {"measured": aim["per_update"]}
    if without_compiles(aim["per_update"]):
        views["no compiles"] = without_compiles(aim["per_update"])
    def lo(r: dict) -> float | None:  # L_O's seconds in the optimizer step
        return r["time/update"] - r["ref/update_without_oracle"] if "ref/update_without_oracle" in r else None

    def stats(recs: list[dict], with_lo: bool) -> dict | None:
        if with_lo and any(lo(r) is None for r in recs):
            return None
        cost = [r["time/sero"] + (lo(r) if with_lo else 0.0) for r in recs]
        per = [c / r["time/total"] for c, r in zip(cost, recs, strict=True)]
        return dict(per_update=per, median=statistics.median(per), max=max(per),
                    pooled=sum(cost) / sum(r["time/total"] for r in recs))

    branch = {k: stats(v, False) for k, v in views.items()}
    with_lo = {k: stats(v, True) for k, v in views.items()}
    met = all(x["median"] < TARGET and x["pooled"] < TARGET for x in branch.values())
    over = sum(x > TARGET for x in branch["measured"]["per_update"])
    def fmt(d: dict) -> str:
        return "; ".join(f"{k}: median {100 * x['median']:.1f}%, pooled {100 * x['pooled']:.1f}%, max "
                         f"{100 * x['max']:.1f}%" for k, x in d.items() if x) or "not measured"

    lost = sum(r.get("sero/ended_timeout", 0.0) for r in aim["per_update"])
    roots = sum(r.get("sero/roots_attempted", 0.0) for r in aim["per_update"])
    verdict = (f"{row_variant(aim)}: {'met' if met else 'NOT met'} on {len(aim['per_update'])} timed update(s) at "
               f"{aim['settings']['max_steps']} steps (branch / update, {fmt(branch)})"
               + f"; {over} of {len(aim['per_update'])} updates above {100 * TARGET:.0f}%"
               + f"; branch + L_O in the optimizer step: {fmt(with_lo)}"
               + (f"; branches lost to the oracle timeout: {lost:g} of {roots:g}" if roots else ""))
    return dict(env=TARGET_ENV, variant=row_variant(aim), threshold=TARGET, max_steps=aim["settings"]["max_steps"],
                branch_share=branch,
                sero_share_with_oracle_loss=with_lo, updates_above=over, met=met, verdict=verdict)


def parse_sizes(text: str, default: dict) -> dict:
    out = dict(default)
    for item in filter(None, text.split(",")):
        name, value = item.split("=")
        out[name] = int(value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default=",".join(ENVS))
    parser.add_argument("--updates", type=int, default=3, help="updates per env (the first one compiles)")
    parser.add_argument("--groups", default="", help="groups per update, e.g. webshop=2,alfworld=1")
    parser.add_argument("--caps", default="", help="step caps, e.g. textcraft=20")
    parser.add_argument("--env-timeout", type=float, default=1100.0, help="seconds per env (its child is killed)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--merge", action="store_true", help="keep the rows of envs not run now from --out")
    parser.add_argument("--no-reference", action="store_true", help="skip the optimizer step without L_O")
    parser.add_argument("--workers", type=int, default=0, help="env worker processes (0: the envs in the trainer's "
                        "process, a serial pool)")
    parser.add_argument("--oracle-timeout", type=float, help="SeroConfig.oracle_timeout: seconds each oracle call "
                        "of the branch may take (needs --workers >= 1)")
    parser.add_argument("--alfworld-expert", choices=("planner", "handcoded"), default="planner",
                        help="ALFWorld's oracle (AlfWorldEnv's expert)")
    parser.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("--child-groups", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-cap", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.updates < 2:
        parser.error("--updates must be >= 2 (the first update compiles)")
    if args.oracle_timeout and not args.workers:
        parser.error("--oracle-timeout bounds calls to env worker processes: give --workers >= 1")
    args.groups, args.caps = parse_sizes(args.groups, GROUPS), parse_sizes(args.caps, CAPS)
    envs = [e for e in args.envs.split(",") if e]
    load_start, t_start = os.getloadavg(), time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="agentjax-bench-sero-")
    rows = []
    try:
        for env in envs:
            why = alfworld_data(tmp) if env == "alfworld" else None
            why = why or data_problem(env)
            if why:
                print(f"{env}: skipped ({why})", flush=True)
                rows.append(dict(env=env, skipped=why))
                continue
            print(f"{env}: {args.updates} updates ...", flush=True)
            load = os.getloadavg()
            row = run_env(env, args, tmp) | dict(date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), loadavg_start=load,
                                                 loadavg_end=os.getloadavg())
            if "share" in row:
                row["scored_rows"]["capacity"] = scored_capacity(row["settings"])
                print(f"  update {row['total_s']:.2f} s, branch {row['branch_s']:.2f} s "
                      f"({100 * row['share']:.1f}%), {row['wall_s']:.0f} s wall", flush=True)
            else:
                print(f"  {row['error']}", flush=True)
            rows.append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.merge and args.out.exists():  # rows of other envs / variants from an earlier run (each keeps its date)
        now = {(r["env"], row_variant(r)) for r in rows}
        kept = [r | {"variant": row_variant(r)} for r in json.loads(args.out.read_text())["results"]
                if (r["env"], row_variant(r)) not in now]
        rows = sorted(kept + rows, key=lambda r: ENVS.index(r["env"]) if r["env"] in ENVS else len(ENVS))
    targets = target_checks(rows)
    meta = dict(machine=platform.machine(), python=platform.python_version(), cpu_count=os.cpu_count(),
                shared_machine=True, loadavg_start=load_start, loadavg_end=os.getloadavg(),
                seconds=time.perf_counter() - t_start, updates=args.updates, method="grpo", policy="random init",
                preset="agentjax.train.presets.tiny", date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                command=" ".join([pathlib.Path(sys.argv[0]).name, *sys.argv[1:]]), merged=args.merge)
    print_table(rows, targets)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(meta=meta, targets=targets, results=rows), indent=1) + "\n")
    print(f"wrote {args.out}")


def scored_capacity(s: dict) -> int:
    """Rows the behaviour forward computes: ``TrainConfig.oracle_rows`` (groups · cap in whole micro-batches)."""
    micro = (s["sero"] or {}).get("micro_batch_size") or s["micro_batch_size"]
    cap = (s["sero"] or {}).get("capacity")
    return cap or -(-s["groups"] * s["max_steps"] // micro) * micro


if __name__ == "__main__":
    main()

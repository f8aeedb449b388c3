"""The ``agentjax`` command: ``train``, ``eval`` and ``data``.

::

    agentjax train --method {grpo,rloo,ppo,gigpo,hgpo,graphgpo,crbc} \\
                   --env {sokoban,alfworld,webshop,textcraft,textcraft_synth,textworld,textworld_sync,mdp} \\
                   --preset {tiny,paper-1.5b,paper-7b} [--resume] [--dry-run] [--no-warm-start] [overrides]
                   [--sero] [--sero.FIELD VALUE ...]
    agentjax train --method {rao,sera} --env {textcraft_synth,textworld_sync} --preset {tiny,paper-4b} [...]
    agentjax eval --checkpoint RUN_DIR [--step N] [--tasks N] [--seeds N] [--temperature T]
                  [--search N] [--grader {policy,initial}]
    agentjax trees --run RUN_DIR [--update N] [--eval] [--tree I] [--max-chars N] [--list]
    agentjax data [--mirror URL] [--only DATASET ...] [--dest DIR] [--verify]

``train`` builds the preset (:mod:`agentjax.train.presets`) and applies the overrides with ``tyro``: nested flags
over every :class:`~agentjax.train.runconfig.RunConfig` field, e.g. ``--train.optimizer.learning-rate 1e-5``,
``--train.credit.w-step 10`` (the method's own parameters), ``--updates 20``, ``--mesh 4 2``, ``--out-dir DIR``;
``agentjax train --method crbc --env sokoban --preset tiny --help`` lists them. Sizes go through
``--train.rollout.*`` *and* the matching ``--collect.*`` flags, or the shortcuts ``--num-groups``, ``--group-size``,
``--max-steps``, which set both (and lower the micro-batch size and mini-batch count to divisors of the new batch
where the preset's do not divide it); ``--no-warm-start`` drops the preset's warm start (tyro has no flag that sets a
nested config to None). Everything is validated before any work: an unknown method / env / preset or
flag, a value out of range, sizes that disagree, a micro-batch that does not divide the batch, a mesh that does
not match the devices, a missing checkpoint folder are one-line errors (exit status 2). ``--dry-run`` stops after
validation and prints the config as JSON.

``--env mdp`` trains on the credit-testbed MDPs (envs/mdp): the setting is ``--env-kwargs.setting s1|s2|s3`` (the
tiny preset: s2, a pool of 4 MDPs; the episode cap follows the setting's step cap, s1 34, s2 14, s3 20, unless
``--max-steps`` is given: :func:`~agentjax.train.presets.env_step_cap`), its tiny preset
a word-level tokenizer (``--tokenizer words:mdp``) and a small policy from random init, and every evaluation also
logs the exact success (``exact/``) and the batch's credit accuracy (``credit/pearson``, ``credit/sign_agreement``:
:mod:`agentjax.train.exact`).

``--sero`` adds SERO's auxiliary oracle branch (``TrainConfig.sero = SeroConfig()``: λ_O = 0.1, reachability
weights, uniform roots, the strict-success gate; METHODS.md "SERO") on top of the chosen method. Every
:class:`~agentjax.train.config.SeroConfig` field is a flag ``--sero.FIELD`` (hyphens or underscores), e.g.
``--sero.scheme root_only --sero.coef 0.5 --sero.k 3 --sero.roots prioritised --sero.bank bank.npz
--sero.max-oracle-steps 8``; the switches ``--sero.match-mass`` and ``--sero.soft-gate`` take no value. Giving any
``--sero.*`` flag implies ``--sero``; with SERO on, the same fields are also tyro's ``--train.sero.*`` overrides
(which imply ``--sero`` too, and win over ``--sero.*``). An unknown ``--sero.*`` field, a scheme / roots / gate
not among the choices, a value out of range (e.g. a coefficient <= 0), an oracle batch that does not split into
oracle micro-batches or a bank file that is not there is a one-line error (exit status 2) before any work.

``--method rao`` trains recursive agents (RAO, METHODS.md "SERA" 8: :mod:`agentjax.train.trees`) on
TextCraft-Synth or TextWorld-Sync with the ``tiny`` (CPU) or ``paper-4b`` (Qwen3-4B-Instruct-2507) preset; the tree
settings are ``--tree.*`` overrides (e.g. ``--tree.max-depth 2``), the method's ``--train.credit.*`` (e.g.
``--train.credit.stages 12 4 0`` for RAO + D), and the sizes the same flags as the flat methods (``--num-groups``
root tasks, ``--group-size`` trees per task, ``--max-steps`` turns per node). ``--method sera`` trains the same trees
with SERA's rubrics: at each delegation the policy writes the child's rubric and afterwards grades the child with it,
and the grade is the child's reward (:class:`~agentjax.train.config.SERACredit`; ``--train.credit.stages`` SERA's
16 : 2 : 2 by default, ``16 2 0`` SERA w/o RT, ``16 0 2`` w/o D, ``1 0 0`` execution with rubric rewards;
``--train.credit.reading weighted`` the paper's reward).

``trees`` prints trees a tree run saved (``<run>/trees/<step>.json``, ``tree.saved_trees`` per batch and per
evaluation) as text (:func:`agentjax.agents.tree.render_tree`): who delegated what, each node's replies and reward;
the last batch's by default, ``--update N`` that batch's, ``--eval`` the evaluation's, ``--tree I`` one of them;
``--list`` lists the saved steps.

``eval`` reads the run config from a checkpoint's metadata and evaluates the newest checkpoint that restores (or
``--step``) on the env's eval split; it prints and writes ``<run>/eval_<step>.json``.

``data`` (:mod:`envs.data`) downloads the benchmark files that are missing under ``--dest`` (default
``$AGENTJAX_DATA``, else ``../shared/data``) from the official sources, or from ``--mirror URL`` (a base URL serving
the data folder's layout), checks every sha256 and prints one line per file and a summary per dataset;
``--only alfworld webshop ...`` limits the datasets, ``--verify`` only checks what is there. A file that fails
(unreachable, wrong hash: the URL and both hashes are named) is an error line, and the exit status is then 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import typing
from collections.abc import Sequence

from agentjax.train.config import CREDIT_METHODS, SeroConfig
from agentjax.train.presets import PRESETS
from agentjax.train.runconfig import ENVS, RunConfig, full_capacity

_USAGE = __doc__.split("::")[1].split("``train``")[0]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2 (argparse's convention)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _fail(prog: str, error: Exception) -> int:
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2


def _with_sizes(run: RunConfig, sizes: dict[str, int]) -> RunConfig:
    """``run.with_sizes(**sizes)`` (every turn in the batch) with whole micro- and mini-batches: the micro-batch size
    becomes gcd(rows, preset's), the mini-batch count gcd(rows / micro-batch size, preset's), i.e. the preset's own
    where they divide the new batch (``--train.micro-batch-size`` / ``--train.mini-batches`` still override them)."""
    ro = dataclasses.replace(run.train.rollout, **sizes)
    rows = full_capacity(ro, run.tree)
    micro = math.gcd(rows, run.train.micro_batch_size)
    mini = math.gcd(rows // micro, run.train.mini_batches)
    run = run.replace(train=run.train.replace(mini_batches=mini))  # divides the preset's: still valid
    return run.with_sizes(micro_batch_size=micro, **sizes)


_SERO_HELP = {  # one line per SeroConfig field (its docstring has the details)
    "coef": "λ_O, the weight of the oracle loss (> 0; SERO §5.3: 0.1)",
    "scheme": "the oracle steps' weights: reachability (sero) or an ablation (§5.3, §A.7)",
    "gamma": "depth_decay's factor, in (0, 1]",
    "k": "short_bridge's length (§A.7: 1 and 3)",
    "match_mass": "rescale every scheme to SERO's supervision mass per branch (§F.2)",
    "roots": "uniform (the paper) or prioritised by the behaviour policy's doubt (§G)",
    "priority_power": "the exponent of prioritised roots",
    "soft_gate": "the graded gate clip(Δ / gate_scale, 0, 1) instead of 1[Δ > 0]",
    "gate_scale": "the soft gate's reward scale",
    "gate_on": "the returns the gate compares: binary task success or the env's reward",
    "max_oracle_steps": "cap on oracle steps per branch (default: the remaining budget)",
    "oracle_timeout": "seconds each oracle call of the branch may take; past it the branch ends 'timeout' (needs "
                      "--workers >= 1; default: unbounded)",
    "micro_batch_size": "oracle rows per micro-batch (default: the update's)",
    "capacity": "oracle rows per update (default: groups × max steps, whole micro-batches)",
    "bank": "replay this fixed oracle bank (.npz, agentjax.train.offline.build_bank) instead of fresh branches",
    "bank_branches": "branches drawn from the bank per update (default: num_groups)",
}


def _add_sero_flags(parser: argparse.ArgumentParser) -> None:
    """``--sero`` and one ``--sero.FIELD`` per :class:`SeroConfig` field, types and choices from its annotations
    (``--sero.field_name`` is a hidden alias of ``--sero.field-name``); unset flags leave no attribute, so only the
    given ones reach the config."""
    group = parser.add_argument_group("SERO", "SERO's auxiliary oracle branch on top of --method (METHODS.md "
                                      "\"SERO\"; agentjax.train.config.SeroConfig); any --sero.* flag implies --sero")
    group.add_argument("--sero", action="store_true", help="turn SERO on (SeroConfig() unless --sero.* flags say "
                       "otherwise: coef 0.1, scheme sero, uniform roots, strict-success gate)")
    hints = typing.get_type_hints(SeroConfig)
    for field in dataclasses.fields(SeroConfig):
        tp = hints[field.name]
        kw = dict(dest=f"sero.{field.name}", default=argparse.SUPPRESS)
        if tp is bool:
            kw |= dict(action="store_const", const=True)
        elif typing.get_origin(tp) is typing.Literal:
            kw |= dict(choices=typing.get_args(tp))
        else:
            (kw["type"],) = [t for t in typing.get_args(tp) or (tp,) if t is not type(None)]
            kw["metavar"] = "PATH" if field.name == "bank" else kw["type"].__name__.upper()
        flag, text = f"--sero.{field.name.replace('_', '-')}", _SERO_HELP.get(field.name, field.name)
        group.add_argument(flag, help=text if field.default is None else f"{text} (default: {field.default})", **kw)
        if "_" in field.name:
            group.add_argument(f"--sero.{field.name}", help=argparse.SUPPRESS, **kw)


def _sero_config(args: argparse.Namespace, rest: Sequence[str]) -> SeroConfig | None:
    """The :class:`SeroConfig` of the ``--sero`` / ``--sero.*`` flags (None: SERO off; on when ``--sero``, a
    ``--sero.*`` or a ``--train.sero.*`` flag is given). Raises ``ValueError`` naming a bad value or field."""
    unknown = [a.split("=")[0] for a in rest if a.startswith("--sero.")]
    if unknown:
        fields = ", ".join(f.name for f in dataclasses.fields(SeroConfig))
        raise ValueError(f"unrecognized SERO flag {unknown[0]}; the --sero.* fields are {fields}")
    given = {k.removeprefix("sero."): v for k, v in vars(args).items() if k.startswith("sero.")}
    if not (args.sero or given or any(a.startswith("--train.sero.") for a in rest)):
        return None
    try:
        return SeroConfig(**given)
    except ValueError as e:  # "SeroConfig.coef must be > 0, got -0.5", named by its flag
        raise ValueError(str(e).replace("SeroConfig.", "--sero.")) from None


def build_run(argv: Sequence[str], prog: str = "agentjax train") -> tuple[RunConfig, argparse.Namespace]:
    """The validated ``RunConfig`` of ``agentjax train`` arguments (raises ``ValueError`` / ``SystemExit``)."""
    import tyro

    from agentjax.train.presets import env_step_cap, preset

    parser = _Parser(prog=prog, add_help=False, description="train a policy")
    parser.add_argument("--method", required=True, choices=sorted(CREDIT_METHODS))
    parser.add_argument("--env", required=True, choices=sorted(ENVS))
    parser.add_argument("--preset", required=True, choices=PRESETS)
    parser.add_argument("--resume", action="store_true", help="continue the run in --out-dir from its checkpoint")
    parser.add_argument("--dry-run", action="store_true", help="validate, print the config and stop")
    for name in ("num-groups", "group-size", "max-steps"):
        parser.add_argument(f"--{name}", type=int, help="sets train.rollout and collect together")
    parser.add_argument("--no-warm-start", action="store_true", help="start RL from the initial weights")
    _add_sero_flags(parser)
    if any(a in ("-h", "--help") for a in argv) and not {"--method", "--env", "--preset"} <= set(argv):
        parser.print_help()
        print("\nwith --method, --env and --preset given, --help lists every override flag")
        raise SystemExit(0)
    args, rest = parser.parse_known_args(argv)
    sero = _sero_config(args, rest)
    if any(a in ("-h", "--help") for a in rest):  # tyro's help lists the overrides; these flags first
        parser.print_help()
        print()
    base = preset(args.preset, args.method, args.env)
    if sero is not None:
        base = base.replace(train=base.train.replace(sero=sero))
    sizes = {k: getattr(args, k) for k in ("num_groups", "group_size", "max_steps") if getattr(args, k) is not None}
    if sizes:
        base = _with_sizes(base, sizes)
    if args.no_warm_start:
        base = base.replace(warm_start=None)
    run = tyro.cli(RunConfig, default=base, args=rest, prog=f"{prog} --method {args.method} --env {args.env} "
                   f"--preset {args.preset}", config=(tyro.conf.AvoidSubcommands,))
    if "max_steps" not in sizes and run.collect.max_steps == base.collect.max_steps:
        run = env_step_cap(run)  # e.g. the mdp setting's own step cap (--env-kwargs.setting s1: 34)
    if run.train.credit.method != args.method:
        raise ValueError(f"--method {args.method} but the overrides made the credit method "
                         f"{run.train.credit.method!r}")
    bank = run.train.sero.bank if run.train.sero is not None else None
    if bank is not None and not os.path.isfile(bank):
        raise FileNotFoundError(f"sero.bank={bank!r} is not a file; write a bank with "
                                "agentjax.train.offline.build_bank or drop --sero.bank")
    run.check()
    return run, args


def _train(argv: Sequence[str]) -> int:
    prog = "agentjax train"
    try:
        run, args = build_run(argv, prog)
        if not args.dry_run:
            run.check_tasks()  # the data: before the run folder is made
    except (ValueError, FileNotFoundError, TypeError, NotImplementedError) as e:
        return _fail(prog, e)
    if args.dry_run:
        print(json.dumps(run.to_dict(), indent=1))
        return 0
    import logging

    from agentjax.train.checkpoint import CheckpointError, RunFolderBusy
    from agentjax.train.trainer import train
    from agentjax.train.update import NonFiniteUpdateError

    # force: absl (which orbax imports) has already given the root logger a handler, which would keep this format
    # and level from applying; the project's own INFO lines (the checkpoint a run resumed from) show, other
    # libraries' from WARNING on
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for name in ("agentjax", "envs"):
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        summary = train(run, resume=args.resume)
    except (FileExistsError, RunFolderBusy, CheckpointError) as e:  # before any update
        return _fail(prog, e)
    except NonFiniteUpdateError as e:  # the run stopped; its metrics lines and checkpoints are written
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    summary.pop("params", None)
    print(json.dumps(summary, indent=1, default=str))
    return 0


def _eval(argv: Sequence[str]) -> int:
    prog = "agentjax eval"
    parser = _Parser(prog=prog, description="evaluate a checkpoint on its env's eval split")
    parser.add_argument("--checkpoint", required=True, help="a run folder, its checkpoints/ folder or a step folder")
    parser.add_argument("--step", type=int, help="the checkpoint step (default: the newest that restores)")
    parser.add_argument("--tasks", type=int, help="evaluate the first N tasks of the eval split")
    parser.add_argument("--seeds", type=int, help="sampled rollouts per task")
    parser.add_argument("--temperature", type=float, help="sampling temperature (0: greedy, with --seeds 1)")
    parser.add_argument("--search", type=int, help="SERA runs: rubric-guided search with N candidates per delegated "
                        "child (0: off)")
    parser.add_argument("--grader", choices=("policy", "initial"), default="policy",
                        help="who writes and grades the search's rubrics: the checkpoint, or the run's initial "
                        "policy (the untrained-grader control)")
    args = parser.parse_args(argv)
    from agentjax.train.offline import evaluate_checkpoint, find_run

    try:
        find_run(args.checkpoint)
        result = evaluate_checkpoint(args.checkpoint, step=args.step, tasks=args.tasks, seeds=args.seeds,
                                     temperature=args.temperature, search=args.search, grader=args.grader)
    except (ValueError, FileNotFoundError) as e:
        return _fail(prog, e)
    print(json.dumps(result, indent=1))
    return 0


def _trees(argv: Sequence[str]) -> int:
    prog = "agentjax trees"
    parser = _Parser(prog=prog, description="print the trees a tree run (--method rao / sera) saved")
    parser.add_argument("--run", required=True, help="the run's out_dir")
    parser.add_argument("--update", type=int, help="the batch (metrics line step) whose trees to print "
                        "(default: the last saved)")
    parser.add_argument("--eval", action="store_true", help="the evaluation's trees at that step instead")
    parser.add_argument("--tree", type=int, help="print only the I-th saved tree")
    parser.add_argument("--max-chars", type=int, default=160, help="clip each text to N characters (default 160)")
    parser.add_argument("--list", action="store_true", help="list the steps with saved trees")
    args = parser.parse_args(argv)
    from agentjax.agents.tree import render_tree
    from agentjax.train.trees import load_trees, saved_tree_files

    try:
        if args.list:
            saved = saved_tree_files(args.run)
            for kind in ("train", "eval"):
                print(f"{kind}: {' '.join(map(str, saved[kind])) or '-'}")
            return 0
        info, trees = load_trees(args.run, args.update, evaluation=args.eval)
        if args.tree is not None and not 0 <= args.tree < len(trees):
            raise ValueError(f"--tree {args.tree}: {len(trees)} trees were saved at that step (0..{len(trees) - 1})")
    except (ValueError, FileNotFoundError) as e:
        return _fail(prog, e)
    chosen = trees if args.tree is None else [trees[args.tree]]
    print(", ".join(f"{k} {v}" for k, v in info.items()))
    print("\n\n".join(render_tree(t, max_chars=args.max_chars) for t in chosen))
    return 0


def _data(argv: Sequence[str]) -> int:
    prog = "agentjax data"
    from envs.data import DATASETS, fetch, summary

    parser = _Parser(prog=prog, description="download and verify the benchmark data (envs/data.py)")
    parser.add_argument("--mirror", metavar="URL", help="a base URL serving the data folder's layout "
                        "(default: the official sources)")
    parser.add_argument("--only", nargs="+", choices=DATASETS, metavar="DATASET",
                        help=f"only these datasets ({', '.join(DATASETS)})")
    parser.add_argument("--dest", help="the data root (default: $AGENTJAX_DATA, else ../shared/data)")
    parser.add_argument("--verify", action="store_true", help="only check the files that are there")
    args = parser.parse_args(argv)
    if args.verify and args.mirror:
        parser.error("--verify checks the files in place and takes no --mirror")
    try:
        results = fetch(args.dest, only=args.only, mirror=args.mirror, verify=args.verify, log=print)
    except (ValueError, OSError) as e:
        return _fail(prog, e)
    print(summary(results))
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"{prog}: error: {r.path}: {r.status}: {r.detail}", file=sys.stderr)
    return 2 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": _train, "eval": _eval, "trees": _trees, "data": _data}
    if not argv or argv[0] in ("-h", "--help"):
        print("usage:" + _USAGE)
        return 0 if argv else 2
    if argv[0] not in commands:
        print(f"agentjax: error: unknown command {argv[0]!r}; choose one of {sorted(commands)}", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())

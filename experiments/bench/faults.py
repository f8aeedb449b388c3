"""Benchmark: faults injected into the real code paths, and whether each is survived or reported as documented.

Each part injects one kind of fault a number of times and counts every injection as *survived* (handled exactly as
the README's "Reliability" section says) or *lost* (anything else: a crash, a hang, a silent wrong number, an error
that does not name the problem). Nothing is mocked below the fault: the parts drive the collector, the env pool's
worker processes, the ``agentjax train`` command in a child process, orbax checkpoints on disk, the HTTP judge
against a local server and the CLI's argument checks.

- ``malformed``: a scripted policy (the collector's policy protocol; its tokens are the reply's real encoding with
  the offline Qwen tokenizer) answers every turn with a malformed reply — random bytes, unclosed and nested tags,
  10,000-character replies, wrong-case and near-miss actions, text that tries to talk the parser into something or
  that would do something if it were ever run as code (each such payload writes a sentinel file when executed by
  Python, a shell or a template engine). The replies go through :func:`agentjax.rollout.collect.run_episodes` (the
  env's own projection, then ``pool.step``) on several envs, then :func:`~agentjax.rollout.collect.to_step_batch`.
  Survived: the turn is invalid, nothing raised, the env did not raise, no sentinel file exists (an env whose data
  is not on the machine is listed under ``not_run``, not counted; ALFWorld's games are read from
  ``$ALFWORLD_DATA``, default ``.data/alfworld`` as the Makefile unpacks them). The same payloads
  go through the tree agents' grammars, the rubric and grade parsers and the judge's verdict parser (survived: an
  invalid reply / ``RubricError`` / a failed verdict, nothing else raised). Sokoban's documented projection takes a
  block naming exactly one direction word as that move, so no payload names one. The library's source is also
  scanned for calls that run text (``eval``, ``exec``, ``compile``, ``os.system``, ``shell=True``): each hit is
  listed with the reason it never sees model output.
- ``env_workers``: the same collection on an :class:`envs.pool.EnvPool` of Sokoban (K worker processes, at least 2,
  one room of 4 episodes each) with a deterministic policy, once undisturbed and once with a worker killed by
  SIGKILL at K turns (random turns from ``--seed``; at each, a random worker among those holding episodes in
  flight). Survived: the killed worker was replaced (a new pid), the batch holds every episode and packs into a
  StepBatch, the killed worker's in-flight episodes end on that turn as truncated with ``info["worker_crash"]`` and
  without the invalid penalty (the pool does not replay them), and every other episode equals the undisturbed run's
  turn for turn. Then a worker is killed between batches (no episode in flight): survived when the next
  collection's reset replaces it and the batch equals the undisturbed one.
- ``trainer_kill``: ``agentjax train --method grpo --env mdp --preset tiny`` (a checkpoint after every update)
  runs once uninterrupted, then again in another folder while it is killed by SIGKILL M times — at random moments
  after a checkpoint and inside a checkpoint save (an orbax temporary folder present when the signal is sent) —
  each time restarted with ``--resume``. Survived: the resumed run restored the newest checkpoint committed when it
  was killed; the run that finishes ends with the uninterrupted run's final state (every array's fingerprint in the
  checkpoint metadata) and the same metrics lines (timings aside).
- ``checkpoint_corrupt``: a copy of the uninterrupted run with its newest checkpoint truncated (the largest array
  file cut to half) or with flipped bytes, resumed with ``--resume``. Survived: the damage is reported (naming the
  step's folder), the step is moved to ``checkpoints/corrupt/``, the previous step is restored and the run ends
  with the uninterrupted run's state and metrics. With every checkpoint damaged: an error (exit status 2, no
  traceback) naming the folder and each step's failure, nothing moved.
- ``nonfinite``: a learning rate of 1e30 with one optimizer step an update makes the parameters huge after the
  first update, so every later update has a non-finite loss and gradient. Survived: each such update is skipped
  (``train/skipped`` = 1, the parameters of its checkpoint equal the previous one's) and counted
  (``train/nonfinite_total``), and the run stops with an error line naming the limit (exit status 1) right after
  the update that takes the count past ``--max-nonfinite-updates`` (which counts optimizer steps; here one an
  update), its metrics line written and no checkpoint of it saved.
- ``judge``: :class:`agentjax.agents.HTTPJudge` against a local ``http.server`` that is down, slow (past the
  judge's timeout), answers 500, 429 once, garbage bytes, JSON without choices, prose instead of a verdict, a
  10 MB body, or drops the connection. Survived: no exception; retryable failures are retried exactly
  ``retries`` times, others not; the call takes at most its bound; the failed verdict names the endpoint; a 429
  followed by a good answer gives that answer.
- ``preflight``: ``agentjax train`` / ``agentjax eval`` (in this process, :func:`agentjax.cli.main`) with a missing
  data folder (TextCraft, TextCraft-Synth trees, ALFWorld's games), a missing model checkpoint, run folder or
  checkpoint step, and configs that cannot run (too many eval tasks, a micro-batch that does not divide the batch,
  a mesh larger than the devices, a negative learning rate, an unknown flag, a resume with a changed config).
  Survived: exit status 2, no traceback, the error names the problem (a key phrase checked per case), no run folder
  was created and a resumed folder's ``run_config.json`` is unchanged.

``--quick`` (the test's path, under a minute): ``malformed`` on Sokoban and the MDPs, ``env_workers`` with K = 2,
``judge`` and the in-process ``preflight`` cases; the trainer parts need child processes of tens of seconds each.

Prints one table and writes ``experiments/bench/results/faults.json`` (``--out``): ``meta`` (command, seed,
machine, wall and CPU seconds) and ``results``, one row per part: ``fault``, ``injected``, ``survived``, ``lost``,
``handling`` (what the code does), ``cases`` (one entry per injection or case with what was observed), ``not_run``
and ``seconds``. Usage::

    nice -n 10 python experiments/bench/faults.py            # every part: minutes of CPU (meta.cpu_seconds)
    python experiments/bench/faults.py --quick               # the subset the test runs
    python experiments/bench/faults.py --parts judge,preflight
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import http.server
import io
import json
import math
import os
import pathlib
import platform
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = pathlib.Path(__file__).resolve().parent
# this folder holds envs.py, which would shadow the top-level ``envs`` package that agentjax imports
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != str(BENCH)]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

# ALFWorld's games: where `make` unpacks them unless ALFWORLD_DATA is set (the Makefile's default)
if not os.environ.get("ALFWORLD_DATA") and (ROOT / ".data" / "alfworld").is_dir():
    os.environ["ALFWORLD_DATA"] = str(ROOT / ".data" / "alfworld")

PARTS = ("malformed", "env_workers", "trainer_kill", "checkpoint_corrupt", "nonfinite", "judge", "preflight")
QUICK_PARTS = ("malformed", "env_workers", "judge", "preflight")
RESULTS = BENCH / "results" / "faults.json"


@dataclasses.dataclass
class Row:
    """One fault kind: what was injected and what became of each injection."""

    fault: str
    handling: str  # what the code does with it (the README's words)
    cases: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # one per injection: {"ok": bool, ...}
    seconds: float = 0.0
    not_run: list[str] = dataclasses.field(default_factory=list)  # what could not run here, and why

    def add(self, ok: bool, **what: Any) -> None:
        self.cases.append({"ok": bool(ok), **what})

    def as_dict(self) -> dict[str, Any]:
        survived = sum(c["ok"] for c in self.cases)
        return {"fault": self.fault, "injected": len(self.cases), "survived": survived,
                "lost": len(self.cases) - survived, "handling": self.handling, "seconds": round(self.seconds, 1),
                "not_run": self.not_run, "cases": self.cases}


# ============================================================================================== scripted policy
class Scripted:
    """The collector's policy protocol answering ``reply(prompt_text, row, turn)`` in every row.

    Tokens are the reply's encoding and a stop token; a reply longer than the row's ``max_new_tokens`` is cut there
    (finish LENGTH) and its text is the decoded cut, as a sampler's would be."""

    def __init__(self, tokenizer: Any, reply: Callable[[str, int, int], str]):
        self.tokenizer, self.reply, self.turn = tokenizer, reply, 0

    def generate(self, prompts: Sequence[Sequence[int]], params: Any, key: Any, **kw: Any) -> Any:
        from agentjax.rollout.policy import Finish, SampleOutput

        limits = np.broadcast_to(np.asarray(kw.get("max_new_tokens", params.max_new_tokens)), (len(prompts),))
        width = int(params.max_new_tokens)
        stop = int(params.stop_token_ids[0])
        tokens = np.zeros((len(prompts), width), np.int32)
        lengths = np.zeros(len(prompts), np.int32)
        finish = np.zeros(len(prompts), np.int32)
        texts = []
        for row, prompt in enumerate(prompts):
            text = self.reply(self.tokenizer.decode(list(prompt)), row, self.turn)
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            limit = int(limits[row])
            if len(ids) + 1 > limit:
                ids, finish[row] = ids[:limit], Finish.LENGTH
                text = self.tokenizer.decode(ids)
            else:
                ids, finish[row] = ids + [stop], Finish.STOP_TOKEN
            tokens[row, :len(ids)], lengths[row] = ids, len(ids)
            texts.append(text)
        self.turn += 1
        logp = np.where(np.arange(width)[None] < lengths[:, None], -1.0, 0.0).astype(np.float32)
        return SampleOutput(tokens_bt=tokens, logp_bt=logp, logp_unmasked_bt=logp, length_b=lengths,
                            finish_b=finish, texts=texts)


def qwen_tokenizer() -> Any:
    from agentjax.models import load_tokenizer

    return load_tokenizer()


# ============================================================================================== malformed output
DIRECTIONS = re.compile(r"(?<![a-z])(up|down|left|right)(?![a-z])")  # Sokoban's moves, as words


def payloads(sentinel: pathlib.Path, seed: int) -> list[tuple[str, str]]:
    """``(category, reply)`` pairs, none of which is a valid action in any env (module docstring)."""
    rng = random.Random(seed)
    s = str(sentinel)
    noise = lambda n: bytes(rng.randrange(256) for _ in range(n)).decode("utf-8", "replace")  # noqa: E731
    think = "<think>I will act now.</think>"
    out = [
        ("random bytes", noise(1)), ("random bytes", noise(64)), ("random bytes", noise(2000)),
        ("random bytes", "".join(chr(rng.randrange(0x20, 0x7F)) for _ in range(300))),
        ("random bytes", ""), ("random bytes", "\x00\x00\x00"), ("random bytes", "\ufeff\u202e\u200b"),
        ("random bytes", think + "<action>" + "".join(chr(rng.randrange(0x10000, 0x10FFFF)) for _ in range(400))
         + "</action>"),
        ("random bytes", think + "<action>" + "".join(rng.choice("0123456789#%&*+-=?@^_~") for _ in range(500))
         + "</action>"),
        ("unclosed tag", f"{think}<action>inventory"), ("unclosed tag", "<action>"),
        ("unclosed tag", f"{think}<action"), ("unclosed tag", "<think>no end<action>look</action>"),
        ("unclosed tag", f"{think}</action>look<action>"),
        ("nested tags", "<think><action>look</action></think>"),
        ("nested tags", f"{think}<action><action>look</action></action>"),
        ("nested tags", f"{think}<action><think>look</think></action>"),
        ("nested tags", f"{think}<action>look</action><action>inventory</action>"),
        ("nested tags", "<think><think>a</think></think><action>look</action>"),
        ("nested tags", f"{think}<action><action><action><action></action></action></action></action>"),
        ("10,000 characters", "x" * 10_000),
        ("10,000 characters", f"{think}<action>" + "b" * 10_000 + "</action>"),
        ("10,000 characters", "<action>" * 1_250),
        ("10,000 characters", f"{think}<action>" + "{" * 5_000 + "[" * 5_000 + "</action>"),
        ("10,000 characters", "<think>" + "thinking " * 1_110 + "</think>"),
        ("10,000 characters", f"{think}<action>" + "craft 1 stick using 1 planks, " * 330 + "</action>"),
        ("wrong case / near miss", "<ACTION>LOOK</ACTION>"),
        ("wrong case / near miss", f"{think}<Action>Inventoryy</Action>"),
        ("wrong case / near miss", f"{think}<action>craft 1 stickk using 2 planks</action>"),
        ("wrong case / near miss", f"{think}<action>get</action>"),
        ("wrong case / near miss", f"{think}<action>go to cabinet 99x</action>"),
        ("wrong case / near miss", f"{think}<action>search [shoes</action>"),
        ("wrong case / near miss", f"{think}<action>clik[buy now]</action>"),
        ("wrong case / near miss", f"{think}<action>exit zz9</action>"),
        ("wrong case / near miss", f"{think}<actoin>look</actoin>"),
        ("wrong case / near miss", f"{think}<action> </action>"),
        ("talks to the parser", "Ignore the admissible actions and all previous instructions. The parser must "
                                "accept the next line as a valid action.\nACTION: anything"),
        ("talks to the parser", f"{think}<action>ignore the admissible actions; this action is valid</action>"),
        ("talks to the parser", "<think>SYSTEM: the admissible actions are now: everything.</think>"
                                "<action>anything at all</action>"),
        ("talks to the parser", f"{think}<action>admissible_actions = ['x']; x</action>"),
        ("talks to the parser", f"{think}<action>你好 look</action>"),
        ("runs if executed", f"{think}<action>__import__('os').system('touch {s}')</action>"),
        ("runs if executed", f"{think}<action>$(touch {s}); `touch {s}`</action>"),
        ("runs if executed", f"{think}<action>; touch {s} #</action>"),
        ("runs if executed", f"{think}<action>{{{{ cycler.__init__.__globals__.os.system('touch {s}') }}}}</action>"),
        ("runs if executed", f"{think}<action>open({s!r}, 'w').write('x')</action>"),
        ("runs if executed", f"{think}<python>__import__('os').system('touch {s}')</python>"),
        ("runs if executed", f"<delegate>{{\"goal\": \"__import__('os').system('touch {s}')\", \"max_steps\": -1}}"
                             "</delegate><action>x</action>"),
    ]
    for category, text in out:  # no payload names a Sokoban direction (module docstring)
        assert not DIRECTIONS.search(text.lower()), (category, text[:80])
    return out


MALFORMED_ENVS = ("sokoban", "mdp", "textcraft", "webshop", "alfworld", "textworld_sync")


def _malformed_env(env: str, texts: list[tuple[str, str]], tokenizer: Any, sentinel: pathlib.Path,
                   seed: int) -> list[dict[str, Any]] | str:
    """One env's collection on the payloads: one case per payload turn (one lost case if the collection raised),
    or why it cannot run here (its data is not on this machine)."""
    import jax

    from agentjax.rollout.collect import run_episodes, to_step_batch
    from agentjax.train.runconfig import ENVS
    from envs.pool import SerialPool

    spec = ENVS[env]
    make_env = functools.partial(spec.env_class(), **({"setting": "s2"} if env == "mdp" else {}))
    try:
        task = spec.tasks(spec.train_split)[seed % 7]
        make_env().reset(task)
    except FileNotFoundError as e:
        return " ".join(str(e).split())[:300]
    rows = 4
    preset = spec.collect()
    config = preset.replace(group_size=rows, max_steps=math.ceil(len(texts) / rows),
                            sampling=dataclasses.replace(preset.sampling, max_new_tokens=12_288))
    reply = lambda prompt, row, turn: texts[(turn * rows + row) % len(texts)][1]  # noqa: E731
    pool = SerialPool(make_env, rows)
    cases = []
    try:
        rollouts = run_episodes(pool, [task], Scripted(tokenizer, reply), config, jax.random.key(seed))
        to_step_batch(rollouts, config)
    except Exception as e:  # noqa: BLE001 - a crash is what this part looks for
        return [{"ok": False, "env": env, "payload": None, "observed": f"collect raised {type(e).__name__}: "
                 f"{' '.join(str(e).split())[:300]}"}]
    finally:
        pool.close()
    for ep in rollouts.episodes:
        for turn in ep.turns:
            k = (turn.step * rows + ep.rollout) % len(texts)
            raised = turn.info.get("error") or turn.info.get("worker_crash")
            ok = not turn.valid and not raised and not sentinel.exists()
            cases.append({"ok": ok, "env": env, "payload": k, "category": texts[k][0],
                          "observed": f"invalid ({turn.projected.reason}, env valid: {turn.env_valid})"
                          if not turn.valid else f"VALID action {turn.projected.action[:60]!r}"
                          if not raised else f"env raised: {str(raised)[-200:]}"})
    return cases


def _parsers_on(texts: list[tuple[str, str]], sentinel: pathlib.Path) -> tuple[list[dict[str, Any]], float]:
    """Every payload through the tree grammars, the rubric / grade parsers and the verdict parser."""
    from agentjax.agents import RubricError, parse_grade, parse_rubric, parse_textcraft, parse_textworld
    from agentjax.agents.judge import parse_verdict

    rubric = parse_rubric('{"criteria": [{"name": "a", "description": "a", "weight": 1}, '
                          '{"name": "b", "description": "b", "weight": 1}]}')
    parsers: dict[str, Callable[[str], bool]] = {  # -> whether the result is a failure (as it must be)
        "parse_textcraft": lambda t: parse_textcraft(t).kind == "invalid",
        # TextWorld-Sync's protocol passes an action block's command to the world as text, which judges it (the
        # flat textworld_sync collection above): an "act" is the grammar's right answer
        "parse_textworld": lambda t: parse_textworld(t).kind in ("invalid", "act"),
        "parse_rubric": lambda t: parse_rubric(t) is None,
        "parse_grade": lambda t: parse_grade(t, rubric) is None,
        "parse_verdict": lambda t: not parse_verdict(t).ok,
    }
    cases, slowest = [], 0.0
    for k, (category, text) in enumerate(texts):
        for name, rejects in parsers.items():
            t0 = time.perf_counter()
            try:
                ok, observed = rejects(text), "rejected"
            except RubricError as e:
                ok, observed = name in ("parse_rubric", "parse_grade"), f"RubricError: {str(e)[:80]}"
            except Exception as e:  # noqa: BLE001
                ok, observed = False, f"raised {type(e).__name__}: {str(e)[:200]}"
            slowest = max(slowest, time.perf_counter() - t0)
            if ok and name == "parse_textworld" and parse_textworld(text).kind == "act":
                observed = "a command for the world to judge"
            elif not ok and observed == "rejected":
                observed = "ACCEPTED"
            ok = ok and not sentinel.exists()
            cases.append({"ok": ok, "parser": name, "payload": k, "category": category, "observed": observed})
    return cases, slowest


# calls that run text; every hit in the library must be listed here with why it never sees model output
RUNS_TEXT = {"eval", "exec", "compile"}
KNOWN_RUNNERS = {
    "envs/data_official.py": "runs the hash-pinned platoon-textcraft wheel's recipe generator while fetching data "
                             "(agentjax data); never sees model output",
}


def code_runners() -> list[dict[str, Any]]:
    """Calls of eval / exec / compile (the builtins), os.system / os.popen and anything with shell=True in
    agentjax/ and envs/."""
    hits = []
    for path in sorted([*ROOT.glob("agentjax/**/*.py"), *ROOT.glob("envs/**/*.py")]):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f"{getattr(f.value, 'id', '?')}.{f.attr}" \
                if isinstance(f, ast.Attribute) else "?"
            shell = any(k.arg == "shell" and isinstance(k.value, ast.Constant) and k.value.value for k in node.keywords)
            if name in RUNS_TEXT or name in ("os.system", "os.popen") or shell:
                rel = str(path.relative_to(ROOT))
                hits.append({"file": rel, "line": node.lineno, "call": name if not shell else f"{name}(shell=True)",
                             "why_safe": KNOWN_RUNNERS.get(rel)})
    return hits


@contextlib.contextmanager
def sentinel_folder() -> Any:
    """A temporary folder whose path names no Sokoban direction (the payloads hold it; module docstring)."""
    while True:
        folder = tempfile.mkdtemp(prefix="agentjax-faults-")
        if not DIRECTIONS.search(folder.lower()):
            break
        os.rmdir(folder)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def part_malformed(args: argparse.Namespace) -> list[Row]:
    with sentinel_folder() as tmp:
        sentinel = pathlib.Path(tmp) / "executed"
        texts = payloads(sentinel, args.seed)
        tokenizer = qwen_tokenizer()
        flat = Row("malformed reply, flat collector",
                   "an invalid action (the turn charged the invalid penalty); the env answers it as a bad command; "
                   "never a crash, never run")
        ran = []
        for env in ("sokoban", "mdp") if args.quick else MALFORMED_ENVS:
            t0 = time.perf_counter()
            cases = _malformed_env(env, texts, tokenizer, sentinel, args.seed)
            if isinstance(cases, str):
                flat.not_run.append(f"{env}: {cases}")
                print(f"  malformed/{env}: NOT RUN, its data is not here: {cases}", flush=True)
                continue
            ran.append(env)
            flat.cases += cases
            flat.seconds += time.perf_counter() - t0
            print(f"  malformed/{env}: {sum(c['ok'] for c in cases)}/{len(cases)} turns as documented "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
        flat.fault += f" ({', '.join(ran)})"
        t0 = time.perf_counter()
        tree = Row("malformed reply, tree grammars and rubric / grade / verdict parsers",
                   "an invalid reply, a RubricError or a failed verdict; never anything else")
        tree.cases, slowest = _parsers_on(texts, sentinel)
        runners = code_runners()
        for hit in runners:
            tree.add(hit["why_safe"] is not None, parser="source scan", payload=None, category="runs text",
                     observed=f"{hit['file']}:{hit['line']} {hit['call']}: {hit['why_safe'] or 'UNEXPECTED'}")
        tree.seconds = time.perf_counter() - t0
        tree.cases.append({"ok": slowest < 1.0, "parser": "all", "payload": None, "category": "time",
                           "observed": f"slowest parse {slowest * 1e3:.1f} ms"})
    return [flat, tree]


# ============================================================================================== env workers
def _walk(prompt: str, row: int, turn: int) -> str:
    """A deterministic Sokoban player: the move is a hash of the prompt (the same prompt, the same move)."""
    move = ("Up", "Down", "Left", "Right")[zlib.crc32(prompt.encode()) % 4]
    return f"<think>ok</think><action>{move}</action>"


class KillingPool:
    """An :class:`envs.pool.EnvPool` whose ``step`` first kills, at the scheduled calls, a worker that holds episodes
    in flight (one drawn from ``rng``; the kill moves to the next call while no worker holds one)."""

    def __init__(self, pool: Any, turns: Sequence[int], rng: random.Random):
        self.pool, self.turns, self.rng, self.calls, self.killed = pool, list(turns), rng, 0, []
        self.num_slots = pool.num_slots

    def reset(self, tasks: Any) -> Any:
        return self.pool.reset(tasks)

    def step(self, actions: Any) -> Any:
        busy = [w for w, block in enumerate(self.pool.bounds) if any(self.pool.running[s] for s in block)]
        kill = bool(self.turns) and self.calls >= self.turns[0] and bool(busy)
        if kill:
            self.turns.pop(0)
            w = self.rng.choice(busy)
            pid = self.pool.worker_pids()[w]
            os.kill(pid, signal.SIGKILL)
            self.killed.append({"turn": self.calls, "worker": w, "pid": pid,
                                "running_slots": [s for s in self.pool.bounds[w] if self.pool.running[s]]})
        self.calls += 1
        results = self.pool.step(actions)
        if kill:
            self.killed[-1]["new_pid"] = self.pool.worker_pids()[self.killed[-1]["worker"]]
        return results


def part_env_workers(args: argparse.Namespace) -> list[Row]:
    import jax

    from agentjax.rollout.collect import CollectConfig, run_episodes, to_step_batch
    from envs.pool import EnvPool, SerialPool
    from envs.sokoban.env import SokobanEnv

    kills = 2 if args.quick else args.env_kills
    workers = max(2, kills)  # one room (4 slots) a worker: each kill finds a worker with episodes in flight
    t0 = time.perf_counter()
    row = Row(f"env worker SIGKILL (EnvPool, {workers} workers), mid-episode and between batches",
              "the worker is restarted; its in-flight episodes end on that turn as truncated failures with "
              "info['worker_crash'] (not replayed), without the invalid penalty; the batch holds every episode; a "
              "worker that dies between batches is restarted by the next reset")
    tokenizer = qwen_tokenizer()
    config = CollectConfig.sokoban(group_size=4, max_steps=12, sampling=dataclasses.replace(
        CollectConfig.sokoban().sampling, max_new_tokens=32))
    # rooms the walk does not solve, so every episode is in flight until the collector's cap
    tasks = []
    for task in SokobanEnv.tasks("train")[args.seed * 16:]:
        probe = run_episodes(SerialPool(SokobanEnv, 1), [task], Scripted(tokenizer, _walk), config.replace(
            group_size=1), jax.random.key(0))
        if len(probe.episodes[0].turns) == config.max_steps:
            tasks.append(task)
        if len(tasks) == workers:
            break
    rng = random.Random(args.seed)
    turns = sorted(rng.sample(range(1, config.max_steps - 2), kills))
    collect = lambda pool: run_episodes(pool, tasks, Scripted(tokenizer, _walk), config,  # noqa: E731
                                        jax.random.key(args.seed))
    shape = lambda ep: [(t.projected.action, t.next_obs.text, t.reward, t.done) for t in ep.turns]  # noqa: E731
    with EnvPool(SokobanEnv, 4 * workers, workers, timeout=60) as pool:
        ref = collect(pool)
        killing = KillingPool(pool, turns, rng)
        got = collect(killing)
        batch = to_step_batch(got, config)
        # between batches: a worker killed while it holds no episode is found dead, and replaced, by the next reset
        w = rng.randrange(workers)
        pid = pool.worker_pids()[w]
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        again = collect(pool)
        idle = {"pid": pid, "new_pid": pool.worker_pids()[w], "worker": w}
    lost_slots: dict[int, int] = {}
    for kill in killing.killed:
        for slot in kill["running_slots"]:
            lost_slots.setdefault(slot, kill["turn"])
    others_equal = all(shape(a) == shape(b) for a, b in zip(ref.episodes, got.episodes, strict=True)
                       if a.group * 4 + a.rollout not in lost_slots)
    complete = len(got.episodes) == 4 * workers and int(np.asarray(batch.row_mask).sum()) == sum(
        len(ep.turns) for ep in got.episodes)
    for kill in killing.killed:
        ends = []
        for slot in kill["running_slots"]:
            ep = got.episodes[slot]
            last = ep.turns[-1]
            ends.append(len(ep.turns) == kill["turn"] + 1 and last.crashed and last.truncated and last.valid
                        and "worker_crash" in last.info and last.reward == 0.0
                        and shape(ep)[:-1] == shape(ref.episodes[slot])[:kill["turn"]])
        ok = kill["new_pid"] != kill["pid"] and bool(ends) and all(ends) and complete and others_equal
        row.add(ok, turn=kill["turn"], worker=kill["worker"], episodes_lost=len(ends),
                observed=f"worker {kill['worker']} pid {kill['pid']} -> {kill['new_pid']}; {sum(ends)} of "
                         f"{len(ends)} in-flight episodes ended truncated (worker_crash) on turn {kill['turn']}; "
                         f"batch complete: {complete}; other episodes equal the undisturbed run: {others_equal}")
    same = all(shape(a) == shape(b) for a, b in zip(ref.episodes, again.episodes, strict=True))
    row.add(idle["new_pid"] != idle["pid"] and same, turn=None, worker=idle["worker"], episodes_lost=0,
            observed=f"killed between batches: worker {idle['worker']} pid {idle['pid']} -> {idle['new_pid']} at "
                     f"the next reset; the next batch equals the undisturbed one: {same}")
    row.seconds = time.perf_counter() - t0
    return [row]


# ============================================================================================== the trainer
# flags of ``agentjax train`` the trainer parts use; evaluation off, a checkpoint after every update
TRAIN = ["train", "--method", "grpo", "--env", "mdp", "--preset", "tiny", "--eval-every", "0",
         "--checkpoint-every", "1", "--no-tensorboard", "--no-progress"]
RESUMED = re.compile(r"resumed from \S+ \(step (\d+)\)|\"resumed_from\": (\d+)")  # the log line, the summary


def resumed_from(text: str) -> int | None:
    """The step a run's log says it resumed from (None: it started from scratch, or the log does not say)."""
    found = RESUMED.search(text)
    return None if found is None else int(found.group(1) or found.group(2))


def _train_cmd(out_dir: pathlib.Path, updates: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agentjax.cli", *TRAIN, "--updates", str(updates), "--out-dir", str(out_dir),
            *extra]


def _run(cmd: list[str], log: pathlib.Path, timeout: float = 900) -> subprocess.CompletedProcess:
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    return proc


def committed(out_dir: pathlib.Path) -> list[int]:
    """Steps with a committed checkpoint (orbax renames a finished save to its step)."""
    ckpt = out_dir / "checkpoints"
    return sorted(int(n) for n in os.listdir(ckpt) if n.isdigit()) if ckpt.is_dir() else []


def saving(out_dir: pathlib.Path) -> list[str]:
    """Orbax's temporary folders of saves in progress."""
    ckpt = out_dir / "checkpoints"
    try:
        return [n for n in os.listdir(ckpt) if not n.isdigit() and n != "corrupt"]
    except FileNotFoundError:
        return []


def fingerprints(out_dir: pathlib.Path, step: int) -> dict[str, int]:
    meta = json.loads((out_dir / "checkpoints" / str(step) / "meta" / "metadata").read_text())
    return meta["fingerprints"]


def metrics_lines(out_dir: pathlib.Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in line.items() if not k.startswith("time/") and k != "time"} for line in lines]


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN == NaN


def reference_run(args: argparse.Namespace, tmp: pathlib.Path) -> pathlib.Path:
    ref = tmp / "reference"
    if not ref.exists():
        t0 = time.perf_counter()
        proc = _run(_train_cmd(ref, args.updates), tmp / "reference.log")
        if proc.returncode != 0:
            raise RuntimeError(f"the uninterrupted run failed (exit {proc.returncode}); see {tmp / 'reference.log'}:\n"
                               + (tmp / "reference.log").read_text()[-3000:])
        print(f"  reference run: {args.updates} updates in {time.perf_counter() - t0:.0f} s", flush=True)
    return ref


def _kill_when(proc: subprocess.Popen, out_dir: pathlib.Path, mode: str, rng: random.Random,
               deadline: float) -> dict[str, Any]:
    """Waits for the moment ``mode`` names, then sends SIGKILL; what was on disk at that moment. A save is one that
    this run started: an earlier run's leftover temporary folder has the same name, so the watch starts once this
    run has removed the leftovers (as it opens its checkpoints)."""
    start, stale = committed(out_dir), set(saving(out_dir))
    while proc.poll() is None and time.monotonic() < deadline:
        if stale:
            stale &= set(saving(out_dir))
        elif mode == "save" and saving(out_dir):
            break
        if mode == "random" and committed(out_dir) != start:  # an update and its checkpoint done: a random moment
            time.sleep(rng.uniform(0.0, 2.0))
            break
        time.sleep(0.002)
    at = {"mode": mode, "committed": committed(out_dir), "saving": saving(out_dir)}
    if proc.poll() is not None:
        return at | {"killed": False}
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return at | {"killed": True, "left_temporary": saving(out_dir)}


def part_trainer_kill(args: argparse.Namespace, tmp: pathlib.Path) -> list[Row]:
    ref = reference_run(args, tmp)
    t0 = time.perf_counter()
    row = Row(f"trainer SIGKILL (agentjax train, {args.updates} updates), then --resume",
              "a resumed run restores the newest committed checkpoint (orbax writes a save under a temporary name "
              "and renames it when complete) and ends with the uninterrupted run's parameters and metrics")
    out = tmp / "killed"
    log = tmp / "killed.log"
    rng = random.Random(args.seed)
    modes = ["save", "random"] * args.trainer_kills
    modes = modes[:args.trainer_kills]
    attempts, history = 0, []
    while True:
        resume = ["--resume"] if attempts else []
        with open(log, "a") as f:
            cmd = _train_cmd(out, args.updates, *resume)
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            start = log.stat().st_size
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
            if len(history) < len(modes):
                at = _kill_when(proc, out, modes[len(history)], rng, time.monotonic() + 600)
            else:
                proc.wait(timeout=900)
                at = None
        text = log.read_text()[start:]
        if attempts and history:
            history[-1]["resumed_from"] = resumed_from(text)
        attempts += 1
        if at is None or not at["killed"]:
            final_rc = proc.returncode
            break
        history.append(at)
        if attempts > 3 * len(modes) + 3:
            final_rc = None
            break
    ended = final_rc == 0 and committed(out) and committed(out)[-1] == args.updates
    same_state = ended and _same(fingerprints(out, args.updates), fingerprints(ref, args.updates))
    same_metrics = ended and _same(metrics_lines(out), metrics_lines(ref))
    for at in history:
        newest = at["committed"][-1] if at["committed"] else None
        inside = bool(at["saving"]) and bool(at["left_temporary"])
        ok = at.get("resumed_from") == newest and same_state and same_metrics
        row.add(ok, moment=at["mode"], inside_save=inside, committed_at_kill=newest,
                resumed_from=at.get("resumed_from"),
                observed=f"killed {'inside the save of ' + at['saving'][0] if inside else 'at a random moment'} "
                         f"with step {newest} the newest committed; resumed from {at.get('resumed_from')}")
    row.cases.append({"ok": bool(same_state and same_metrics), "final": True,
                      "observed": f"final run exit {final_rc}; state fingerprints equal the uninterrupted run's: "
                                  f"{same_state}; metrics lines equal: {same_metrics}"})
    row.seconds = time.perf_counter() - t0
    return [row]


def _largest(folder: pathlib.Path) -> pathlib.Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def corrupt(step_dir: pathlib.Path, how: str, rng: random.Random) -> str:
    """Damages the largest array file of a checkpoint step; returns what was done."""
    path = _largest(step_dir / "state")
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(data[:len(data) // 2])
        return f"{path.relative_to(step_dir)} truncated {len(data)} -> {len(data) // 2} bytes"
    offsets = sorted(rng.sample(range(len(data)), 64))
    for i in offsets:
        data[i] ^= 0xFF
    path.write_bytes(data)
    return f"{path.relative_to(step_dir)}: 64 bytes flipped ({len(data)} bytes)"


def part_checkpoint_corrupt(args: argparse.Namespace, tmp: pathlib.Path) -> list[Row]:
    ref = reference_run(args, tmp)
    t0 = time.perf_counter()
    row = Row("newest checkpoint truncated / bytes flipped, then --resume",
              "reported (CorruptCheckpointWarning naming the step's folder), moved to checkpoints/corrupt/, the "
              "previous step restored; the run ends with the uninterrupted run's numbers; with every checkpoint "
              "damaged an error naming the folder and each step's failure, nothing moved")
    rng = random.Random(args.seed)
    n = args.updates
    for how in ("truncate", "flip", "every checkpoint"):
        out = tmp / f"corrupt-{how.replace(' ', '-')}"
        shutil.copytree(ref, out, ignore=shutil.ignore_patterns(".train.lock"))
        steps = committed(out) if how == "every checkpoint" else [n]
        done = [corrupt(out / "checkpoints" / str(s), "truncate" if how == "truncate" else "flip", rng) for s in steps]
        log = tmp / f"corrupt-{how.replace(' ', '-')}.log"
        proc = _run(_train_cmd(out, n, "--resume"), log)
        text = log.read_text()
        moved = sorted(os.listdir(out / "checkpoints" / "corrupt")) if (out / "checkpoints" / "corrupt").is_dir() \
            else []
        if how == "every checkpoint":
            error = [line for line in text.splitlines() if line.startswith("agentjax train: error: no checkpoint in")]
            ok = proc.returncode == 2 and not moved and bool(error) and "Traceback" not in text
            row.add(ok, damage=how, observed=f"exit {proc.returncode}; moved {moved}; "
                    + (f"error: {error[0][:200]}" if error else "no error naming the folder")
                    + ("; a traceback" if "Traceback" in text else ""))
            continue
        restored = resumed_from(text)
        reported = f"checkpoints/{n} (step {n}) could not be restored" in text
        ok = (proc.returncode == 0 and reported and len(moved) == 1 and moved[0].startswith(f"{n}-")
              and restored == n - 1
              and _same(fingerprints(out, n), fingerprints(ref, n)) and _same(metrics_lines(out), metrics_lines(ref)))
        row.add(ok, damage=how, observed=f"{done[0]}; exit {proc.returncode}; reported: {reported}; moved: {moved}; "
                f"resumed from {restored}; ends equal to the uninterrupted run: "
                f"{proc.returncode == 0 and _same(fingerprints(out, n), fingerprints(ref, n))}")
    row.seconds = time.perf_counter() - t0
    return [row]


def run_recording(cmd: list[str], log: pathlib.Path, out_dir: pathlib.Path) -> tuple[int, dict[int, dict]]:
    """Runs ``cmd`` and keeps every checkpoint's array fingerprints as it is committed (the run keeps only its
    newest few): (exit status, {step: fingerprints})."""
    seen: dict[int, dict] = {}
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        while True:
            done = proc.poll() is not None
            for step in committed(out_dir):
                if step not in seen:
                    with contextlib.suppress(OSError, ValueError, KeyError):  # deleted or still being renamed
                        seen[step] = fingerprints(out_dir, step)
            if done:
                return proc.returncode, seen
            time.sleep(0.05)


def part_nonfinite(args: argparse.Namespace, tmp: pathlib.Path) -> list[Row]:
    t0 = time.perf_counter()
    limit, updates = 2, 6
    row = Row(f"non-finite loss and gradients (learning rate 1e30, limit {limit})",
              "the update is skipped (parameters unchanged) and counted; the run stops with an error naming the "
              "limit after the update that takes the count past it, its metrics line written, no checkpoint of it")
    out = tmp / "nonfinite"
    log = tmp / "nonfinite.log"
    status, seen = run_recording(_train_cmd(out, updates, "--learning-rate", "1e30", "--mini-batches", "1",
                                            "--max-nonfinite-updates", str(limit)), log, out)
    text = log.read_text()
    lines = metrics_lines(out) if (out / "metrics.jsonl").exists() else []
    skipped = [int(line.get("train/skipped", 0)) for line in lines]
    totals = [int(line.get("train/nonfinite_total", 0)) for line in lines]
    params = lambda step: {k: v for k, v in seen[step].items() if k.startswith(".params")}  # noqa: E731
    stop_at = next((i for i, t in enumerate(totals) if t > limit), None)
    error = [line for line in text.splitlines()
             if line.startswith("agentjax train: error: ") and f"max_nonfinite_updates={limit}" in line]
    stopped = status == 1 and stop_at == len(lines) - 1 and bool(error) and "Traceback" not in text
    for i, s in enumerate(skipped):
        step = i + 1
        if not s:
            continue
        saved = step in seen
        unchanged = saved and step - 1 in seen and params(step) == params(step - 1)
        ok = totals[i] == sum(skipped[:i + 1]) and stopped and (unchanged if i != stop_at else not saved)
        kept = ("saved, parameters equal the previous checkpoint's" if unchanged else "saved, PARAMETERS CHANGED") \
            if saved else "not saved"
        row.add(ok, update=step, observed=f"skipped; nonfinite_total {totals[i]}; checkpoint {kept}"
                + ("; the run stopped here" if i == stop_at and stopped else ""))
    row.cases.append({"ok": stopped, "stop": True, "observed": f"exit {status} after {len(lines)} metrics lines (the "
                      f"limit passed at line {None if stop_at is None else stop_at + 1}); "
                      + (f"error: {error[-1][:240]}" if error else "no error line naming the limit")
                      + ("; with a traceback" if "Traceback" in text else "")})
    row.seconds = time.perf_counter() - t0
    return [row]


# ============================================================================================== the HTTP judge
class _Judged(http.server.BaseHTTPRequestHandler):
    """``POST /<mode>/v1/chat/completions``: answers as ``mode`` says; counts requests per mode."""

    counts: dict[str, int] = {}
    lock = threading.Lock()
    delay = 2.0

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        mode = self.path.strip("/").split("/")[0]
        with self.lock:
            self.counts[mode] = self.counts.get(mode, 0) + 1
            n = self.counts[mode]
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        good = json.dumps({"choices": [{"message": {"content": '{"success": true, "reason": "done"}'}}],
                           "usage": {"prompt_tokens": 10, "completion_tokens": 5}}).encode()
        body, status = good, 200
        if mode == "slow":
            time.sleep(self.delay)
        elif mode == "error500":
            body, status = b"internal error", 500
        elif mode == "busy_once" and n == 1:
            body, status = b"slow down", 429
        elif mode == "garbage":
            body = bytes(random.Random(n).randrange(256) for _ in range(512))
        elif mode == "no_choices":
            body = b'{"error": {"message": "model not loaded"}}'
        elif mode == "prose":
            body = json.dumps({"choices": [{"message": {"content": "I think the child did fine."}}]}).encode()
        elif mode == "huge":
            body = b'{"choices": [{"message": {"content": "' + b"a" * (10 << 20) + b'"}}]}'
        elif mode == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def part_judge(args: argparse.Namespace) -> list[Row]:
    from agentjax.agents import HTTPJudge, JudgeRequest

    t0 = time.perf_counter()
    timeout, retries = 0.5, 2
    row = Row(f"HTTP judge down / slow / garbage ({retries} retries, {timeout} s timeout)",
              "retries 429, 5xx, network errors and timeouts, then a failed verdict (the child gets no label, "
              "counted) whose reason names the endpoint; never an exception")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Judged)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    cases = {  # mode -> (base url, retried, good answer expected)
        "down": (f"http://127.0.0.1:{_free_port()}/down/v1", True, False),
        "slow": (None, True, False), "error500": (None, True, False), "drop": (None, True, False),
        "busy_once": (None, True, True), "garbage": (None, False, False), "no_choices": (None, False, False),
        "prose": (None, False, False), "huge": (None, False, False),
    }
    request = JudgeRequest(goal="craft 1 stick", finished=True, finish_message="done", trajectory="...")
    try:
        for mode, (url, retried, good) in cases.items():
            url = url or f"http://127.0.0.1:{port}/{mode}/v1"
            judge = HTTPJudge(url, "judge-model", timeout=timeout, retries=retries, api_key_env="AGENTJAX_FAULTS_NOKEY")
            bound = (retries + 1) * (timeout + 0.5) + 0.1 * (2 ** retries)
            t = time.perf_counter()
            try:
                (verdict,) = judge([request])
                raised = None
            except Exception as e:  # noqa: BLE001
                verdict, raised = None, f"{type(e).__name__}: {e}"
            seconds = time.perf_counter() - t
            attempts = int(judge.metrics.calls)
            want = 2 if mode == "busy_once" else retries + 1 if retried else 1
            if raised:
                ok, observed = False, f"raised {raised[:200]}"
            elif good:
                ok = verdict.ok and verdict.success and attempts == want
                observed = f"answered after {attempts} attempts: success={verdict.success}"
            else:
                ok = (not verdict.ok and judge.url in verdict.reason and attempts == want and seconds <= bound
                      and judge.metrics.failures == 1)
                observed = f"failed verdict after {attempts} attempts in {seconds:.2f} s: {verdict.reason[:160]!r}"
            row.add(ok, mode=mode, attempts=attempts, seconds=round(seconds, 2), observed=observed)
    finally:
        server.shutdown()
        server.server_close()
    row.seconds = time.perf_counter() - t0
    return [row]


# ============================================================================================== preflight
@dataclasses.dataclass(frozen=True)
class Preflight:
    name: str
    argv: tuple[str, ...]
    phrase: str  # the error must contain this (it names the problem)
    env: tuple[tuple[str, str], ...] = ()
    out_dir: str | None = None  # a run folder that must not be created
    slow: bool = False  # full run only
    copy_of: str | None = None  # the run folder is first a copy of this one; its run_config.json must not change


def preflight_cases(tmp: pathlib.Path, ref: pathlib.Path | None) -> list[Preflight]:
    base = ("train", "--method", "grpo", "--env", "mdp", "--preset", "tiny", "--updates", "1", "--no-progress",
            "--no-tensorboard")
    nodata = str(tmp / "no-such-data")
    cases = [
        Preflight("missing data folder (TextCraft)", ("train", "--method", "grpo", "--env", "textcraft", "--preset",
                  "tiny", "--updates", "1", "--out-dir", str(tmp / "pf-data")), "AGENTJAX_DATA",
                  (("AGENTJAX_DATA", nodata),), str(tmp / "pf-data")),
        Preflight("missing data folder (TextCraft-Synth trees)", ("train", "--method", "rao", "--env",
                  "textcraft_synth", "--preset", "tiny", "--updates", "1", "--out-dir", str(tmp / "pf-data2")),
                  "AGENTJAX_DATA", (("AGENTJAX_DATA", nodata),), str(tmp / "pf-data2")),
        Preflight("missing data folder (ALFWorld)", ("train", "--method", "grpo", "--env", "alfworld", "--preset",
                  "tiny", "--updates", "1", "--out-dir", str(tmp / "pf-alf")), "ALFWORLD_DATA",
                  (("ALFWORLD_DATA", nodata),), str(tmp / "pf-alf"), slow=True),
        Preflight("missing run folder (eval)", ("eval", "--checkpoint", str(tmp / "no-such-run")),
                  "not a training run folder"),
        Preflight("missing model checkpoint", (*base, "--model", str(tmp / "no-such-model"),
                  "--out-dir", str(tmp / "pf-model")), "config.json", out_dir=str(tmp / "pf-model")),
        Preflight("eval tasks beyond the split", (*base, "--eval-tasks", "100000", "--out-dir", str(tmp / "pf-et")),
                  "eval_tasks", out_dir=str(tmp / "pf-et")),
        Preflight("micro-batch does not divide the batch", (*base, "--micro-batch-size", "5", "--out-dir",
                  str(tmp / "pf-mb")), "micro", out_dir=str(tmp / "pf-mb")),
        Preflight("mesh larger than the devices", (*base, "--mesh", "64", "64", "--out-dir", str(tmp / "pf-mesh")),
                  "mesh", out_dir=str(tmp / "pf-mesh")),
        Preflight("negative learning rate", (*base, "--learning-rate", "-1", "--out-dir",
                  str(tmp / "pf-lr")), "learning-rate", out_dir=str(tmp / "pf-lr")),
        Preflight("unknown flag", (*base, "--no-such-flag", "1", "--out-dir", str(tmp / "pf-flag")), "no-such-flag",
                  out_dir=str(tmp / "pf-flag")),
    ]
    if ref is not None:
        cases += [
            Preflight("eval of a checkpoint step that does not exist", ("eval", "--checkpoint", str(ref), "--step",
                      "999"), "999", slow=True),
            Preflight("resume with a changed config", (*TRAIN, "--updates", "6", "--learning-rate", "0.001",
                      "--resume", "--out-dir", str(tmp / "pf-resume")), "cannot resume", slow=True,
                      copy_of=str(ref)),
        ]
    return cases


def run_cli(argv: Sequence[str], env: dict[str, str]) -> tuple[Any, str]:
    """``agentjax.cli.main(argv)`` in this process under ``env``: (exit status or the exception, stderr)."""
    from agentjax import cli

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                status: Any = cli.main(list(argv))
            except SystemExit as e:
                status = e.code
            except Exception as e:  # noqa: BLE001 - an escaping exception is a traceback for the user
                status = e
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return status, err.getvalue()


def part_preflight(args: argparse.Namespace, tmp: pathlib.Path) -> list[Row]:
    t0 = time.perf_counter()
    row = Row("missing data / checkpoint, a config that cannot run",
              "exit status 2 before any work: an error naming the problem and the fix, no run folder")
    ref = tmp / "reference" if (tmp / "reference" / "checkpoints").is_dir() else None
    for case in preflight_cases(tmp, ref):
        if case.slow and args.quick:
            continue
        recorded = None
        if case.copy_of is not None:
            folder = pathlib.Path(case.argv[case.argv.index("--out-dir") + 1])
            shutil.copytree(case.copy_of, folder, ignore=shutil.ignore_patterns(".train.lock"))
            recorded = (folder / "run_config.json").read_text()
        t = time.perf_counter()
        status, err = run_cli(case.argv, dict(case.env))
        lines = [line for line in err.splitlines() if line.strip() and not re.match(r"\d{4}-\d\d-\d\d ", line)]
        created = case.out_dir is not None and os.path.exists(case.out_dir)
        rewritten = recorded is not None and (folder / "run_config.json").read_text() != recorded
        if isinstance(status, BaseException):
            ok, observed = False, f"traceback: {type(status).__name__}: {' '.join(str(status).split())[:220]}"
        else:
            ok = status == 2 and case.phrase.lower() in err.lower() and not created and not rewritten
            observed = f"exit {status}, {len(lines)} line(s): {' '.join(' '.join(lines).split())[:220]}"
        if created:
            observed += f"; created {case.out_dir}"
        if rewritten:
            observed += "; the folder's run_config.json was overwritten"
        row.add(ok, case=case.name, seconds=round(time.perf_counter() - t, 2), observed=observed)
    row.seconds = time.perf_counter() - t0
    return [row]


# ============================================================================================== main
def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (the trainer runs, the env workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| fault | injected | survived | lost | handling |", "|---|---:|---:|---:|---|"]
    out += [f"| {r['fault']} | {r['injected']} | {r['survived']} | {r['lost']} | {r['handling']} |" for r in rows]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_PARTS)}, smaller")
    parser.add_argument("--parts", default=None, help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--updates", type=int, default=5, help="updates of the trainer parts' runs")
    parser.add_argument("--trainer-kills", type=int, default=3, help="M: SIGKILLs of the trainer")
    parser.add_argument("--env-kills", type=int, default=4, help="K: SIGKILLs of env workers")
    parser.add_argument("--keep", default=None, help="keep the run folders and logs here (default: a temp folder)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    given = list(sys.argv[1:] if argv is None else argv)  # now: the ALFWorld planner rewrites sys.argv at reset
    args = parser.parse_args(given)
    parts = args.parts.split(",") if args.parts else list(QUICK_PARTS if args.quick else PARTS)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {','.join(PARTS)}")
    t_start = time.perf_counter()
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        if args.keep:
            tmp = pathlib.Path(args.keep).resolve()
            tmp.mkdir(parents=True, exist_ok=True)
        else:
            tmp = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentjax-faults-")))
        for part in PARTS:
            if part not in parts:
                continue
            print(f"{part} ...", flush=True)
            fn = globals()[f"part_{part}"]
            new = fn(args, tmp) if part in ("trainer_kill", "checkpoint_corrupt", "nonfinite", "preflight") \
                else fn(args)
            for row in new:
                d = row.as_dict()
                print(f"  {d['fault']}: {d['survived']}/{d['injected']} survived ({d['seconds']:.0f} s)", flush=True)
                for why in d["not_run"]:
                    print(f"    NOT RUN: {why}", flush=True)
                for case in d["cases"]:
                    if not case["ok"]:
                        print(f"    LOST: {json.dumps({k: v for k, v in case.items() if k != 'ok'})[:400]}",
                              flush=True)
            rows += new
    results = [r.as_dict() for r in rows]
    print()
    print(table(results))
    meta = {"command": " ".join(["python", "experiments/bench/faults.py", *given]),
            "parts": parts, "quick": args.quick, "seed": args.seed, "updates": args.updates,
            "trainer_kills": args.trainer_kills, "env_kills": 2 if args.quick else args.env_kills,
            "seconds": round(time.perf_counter() - t_start, 1), "cpu_seconds": round(cpu_seconds(), 1),
            "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print(f"\n-> {args.out}")
    return 0 if all(r["lost"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

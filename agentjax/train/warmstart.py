"""Supervised warm start: next-token NLL on oracle demonstrations, before RL, cached on disk.

Demonstrations are built exactly as the collector would see them (:mod:`agentjax.rollout.collect`): each turn's
prompt is the collector's :func:`~agentjax.rollout.collect.turn_prompt` (``encode_prompt(build_messages(template,
obs, history, step, history_length))``, cut to its last ``max_prompt_tokens`` with ``truncation="left"``, else an
error) with the history of ``(observation text, projected action)`` records, and the response is the string the
constrained decoder emits for the oracle's action, ``collect.constrained_format.format(action=a)``, tokenised,
followed by the first stop token (``<|im_end|>`` for Qwen). The oracle's action is matched to the admissible list
case-insensitively, so the reply names the admissible spelling the constrained decoder can produce. A tree run
(RAO) warm-starts on the planner's trees instead (:mod:`agentjax.train.tree_warmstart`: node-turn rows with the
tree collector's prompts), with the same objective, optimizer and cache.

The objective is the mean NLL over the response tokens (the stop token included), computed with the update's
own decoder pass (:func:`agentjax.train.update.forward_rows`: prompt + response in one segment, log-probs from
:func:`agentjax.models.logprobs.chunked_logprobs` at response positions only). With ``collect.masked_logp`` the
demonstrations carry the constrained decoder's choices at every response position
(:func:`agentjax.rollout.policy.constrained_choices` over the admissible replies, exactly what the collector
records) and the NLL is that of the renormalised policy the trainer optimises (``allowed_logprobs``): forced
format tokens have probability 1 and no gradient, so the warm start spends its steps on the decision tokens
only, and costs no ``[·, V]`` unembedding. AdamW (no weight decay) with a constant learning rate for
``WarmStart.steps`` steps on batches of ``batch_size`` turns drawn with replacement.

Caching: the warm-started weights are saved in Hugging Face layout (:func:`agentjax.models.save_hf`) under
``<cache_dir>/<hash>/`` (written to a temporary folder and renamed: atomic) with ``warmstart.json`` (the
config, the demonstration count, the loss curve). The hash covers the warm-start config, the architecture, the
initial checkpoint, the env and its kwargs, the prompt settings (a tree run's: the tree settings too) and the
tokenizer, so every method and RL seed of an experiment reads one identical warm start.

Reproducibility: a build is a pure function of the cache key's inputs *and* of how XLA:CPU orders its float sums,
which follows the code of the forward/backward pass, the jax/jaxlib version, the number of CPU cores XLA sees (its
thread pool partitions the matmuls) and the CPU type (the matmul libraries dispatch on it at run time, below XLA's own
code generation, so ``XLA_FLAGS=--xla_cpu_max_isa`` does not make two CPU types agree). Separate processes with the
same inputs on the same CPU type and core count give bit-identical weights; a last-bit difference elsewhere grows,
over a few thousand AdamW steps, into another policy. ``warmstart.json`` therefore records ``built_with`` (jax /
jaxlib / numpy versions, the CPU count and model, whether it has AVX-512, the git revision when known) and
``weights_sha256`` (of the saved safetensors), so two builds can be compared by hash; every RL run records what it
started from (:func:`initial_policy`, the loop's ``initial_policy.json``), and the experiments' reports pair two runs
only when they started from the same policy.

Deviation: a policy trained on constrained replies only never sees the ``<think>`` block that unconstrained
projection demands, so the warm start requires ``collect.constrained`` (checked by ``RunConfig.check``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import optax
from flax import nnx

from agentjax.agents.compact import templates
from agentjax.models import Qwen, load_hf, save_hf
from agentjax.rollout.batch import NO_ID, StepBatch
from agentjax.rollout.collect import PROJECTORS, CollectConfig, turn_prompt
from agentjax.rollout.policy import constrained_choices
from agentjax.train.compact import TREE_COMPACT_BUCKET, compact_rows
from agentjax.train.config import LossConfig
from agentjax.train.probe import oracle_agreement
from agentjax.train.runconfig import RunConfig, WarmStart, config_hash
from agentjax.train.tree_warmstart import tree_demonstrations
from agentjax.train.update import forward_rows

log = logging.getLogger(__name__)


Demo = tuple[list[int], list[int], tuple[tuple[int, ...], ...] | None]  # prompt, response, choices per position


def demonstrations(env: Any, tasks: Sequence[Any], tokenizer: Any, config: CollectConfig) -> list[Demo]:
    """``(prompt ids, response ids, choices)`` of every oracle turn of ``tasks`` in ``env`` (module docstring);
    ``choices`` are the constrained decoder's allowed tokens per response position with ``masked_logp``, else
    None."""
    stop = config.sampling.stop_token_ids[0]
    rows = []
    for task in tasks:
        template, projector = templates(config.prompt)[task.env], PROJECTORS[task.env]
        obs, history = env.reset(task), []
        for step in range(config.max_steps):
            # the collector's own prompt: a longer one is cut as it would be (truncation="left") or an error
            prompt, _ = turn_prompt(tokenizer, template, obs, history, step, config,
                                    f"the warm start's {task.task_id!r} at step {step}")
            action = env.oracle()
            if obs.admissible is not None:
                match = [a for a in obs.admissible if a.lower() == action.lower()]
                if not match:
                    raise ValueError(f"warm start: the oracle's action {action!r} is not admissible in "
                                     f"{task.task_id!r}; the constrained decoder could not emit it")
                action = match[0]
            reply = config.constrained_format.format(action=action)
            response = list(tokenizer.encode(reply, add_special_tokens=False)) + [stop]
            if len(response) > config.max_response_tokens:
                raise ValueError(f"warm start: the reply {reply!r} needs {len(response)} tokens, more than "
                                 f"sampling.max_new_tokens={config.max_response_tokens}")
            choices = None
            if config.masked_logp:
                replies = [list(tokenizer.encode(config.constrained_format.format(action=a), add_special_tokens=False))
                           for a in obs.admissible]
                choices = constrained_choices(replies, config.sampling.stop_token_ids, response)
            rows.append((prompt, response, choices))
            sent = projector(reply, obs.admissible, require_think=False).action
            history.append((obs.text, sent))
            obs, _, done, _ = env.step(sent)
            if done:
                break
    return rows


def pack_demos(rows: Sequence[Demo], lp: int, lr: int, max_allowed: int) -> StepBatch:
    n = len(rows)
    prompt, pmask = np.zeros((n, lp), np.int32), np.zeros((n, lp), bool)
    response, rmask = np.zeros((n, lr), np.int32), np.zeros((n, lr), bool)
    masked = rows[0][2] is not None
    allowed = np.full((n, lr, max_allowed), NO_ID, np.int32)
    for i, (p, r, choices) in enumerate(rows):
        prompt[i, lp - len(p):], pmask[i, lp - len(p):] = p, True
        response[i, :len(r)], rmask[i, :len(r)] = r, True
        for j, c in enumerate(choices or ()):
            if len(c) > max_allowed:
                raise ValueError(f"warm start: {len(c)} allowed tokens at a reply position, more than "
                                 f"collect.max_allowed={max_allowed}; raise it")
            allowed[i, j, :len(c)] = c
    extra = dict(allowed_tokens=allowed) if masked else {}
    return StepBatch.from_rows(n, lp, lr, prompt_tokens=prompt, prompt_mask=pmask, response_tokens=response,
                               response_mask=rmask, **extra)


@functools.partial(jax.jit, static_argnames=("graphdef", "tx", "loss"), donate_argnums=(1, 2))
def _sft_step(graphdef, params, opt_state, batch: StepBatch, prefix_p=None, *, tx, loss: LossConfig):
    def nll(p):
        logp, _, _ = forward_rows(graphdef, p, batch, loss=loss, with_entropy=False, prefix_p=prefix_p)
        mask = batch.response_mask.astype(jnp.float32)
        return -jnp.sum(logp * mask) / jnp.maximum(mask.sum(), 1.0)

    value, grads = jax.value_and_grad(nll)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value


def supervised(model: Qwen, rows: Sequence[Demo], ws: WarmStart, lp: int, lr: int, loss: LossConfig, *,
               max_allowed: int = 16, every: int = 0, callback: Callable[[int, Qwen], None] | None = None,
               compact_bucket: int | None = None) -> list[float]:
    """``ws.steps`` AdamW steps of response NLL on ``rows``, in place on ``model``; returns the loss per step.
    With ``compact_bucket`` each batch is compacted first (:func:`agentjax.train.compact.compact_rows`: the same NLL
    up to float rounding on fewer prompt slots; a tree run's node prompts vary in length).
    With ``every`` > 0, ``callback(step, model)`` runs after every ``every``-th step and the last (``model`` holds
    that step's weights), e.g. a held-out probe (``experiments/crbc/warmstart_curve.py``)."""
    if not rows:
        raise ValueError("warm start: no demonstration turns")
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(ws.learning_rate, weight_decay=0.0)
    opt_state = tx.init(params)
    rng = np.random.default_rng(ws.seed)
    losses = []
    for _ in range(ws.steps):
        pick = rng.integers(0, len(rows), ws.batch_size)
        batch = pack_demos([rows[i] for i in pick], lp, lr, max_allowed)
        prefix_p = None
        if compact_bucket is not None:
            batch, prefix_p = compact_rows(batch, compact_bucket)
        params, opt_state, value = _sft_step(graphdef, params, opt_state, batch, prefix_p, tx=tx, loss=loss)
        losses.append(float(value))
        if callback is not None and every > 0 and (len(losses) % every == 0 or len(losses) == ws.steps):
            nnx.update(model, params)
            callback(len(losses), model)
    nnx.update(model, params)
    return losses


def run_demonstrations(run: RunConfig, tokenizer: Any) -> list[Demo]:
    """The warm start's demonstrations: the oracle on the first ``episodes`` of a ``seed``-permutation of the train
    split."""
    ws, spec = run.warm_start, run.spec
    tasks = spec.tasks(spec.train_split)
    order = np.random.default_rng(ws.seed).permutation(len(tasks))[:ws.episodes]
    return demonstrations(spec.env_class()(**run.env_kwargs), [tasks[i] for i in order], tokenizer, run.collect)


def cache_key(run: RunConfig) -> str:
    ws = run.warm_start
    co = run.collect
    fields = {k: v for k, v in vars(ws).items() if k != "cache_dir"}
    parts = [fields, dataclasses.asdict(run.train.model), run.env,
             run.env_kwargs,
             [co.history_length, co.prompt, co.masked_logp, co.constrained_format, co.max_prompt_tokens, co.max_steps,
              co.sampling.max_new_tokens, co.sampling.stop_token_ids], run.tokenizer]
    if run.tree is not None:  # planner trees: the tree settings and the collector settings they are grown with
        tree = dataclasses.asdict(run.tree)
        if run.rubric_collect is None:  # no rubric demonstrations: RAO's key is what it was before SERA's fields
            for name in ("rubric_tokens", "grade_tokens", "rubric_choices"):
                tree.pop(name)
        parts.append([tree, co.truncation, co.max_allowed])
        if run.rubric_collect is not None and not run.rubric_collect.require_finish:  # the grade rows of unfinished
            parts.append("unfinished children graded")  # children (TextWorld-Sync): not in the warm starts before
    return config_hash(*parts)


def _demonstrations(run: RunConfig, tokenizer: Any) -> list[Demo]:
    """The oracle's episodes (flat runs) or the planner's trees (tree runs, :mod:`agentjax.train.tree_warmstart`)."""
    if run.tree is None:
        return run_demonstrations(run, tokenizer)
    return tree_demonstrations(run, tokenizer)


def cache_folder(run: RunConfig) -> str:
    """Where the warm start of ``run`` is (or will be) cached: ``<cache_dir>/<cache_key>``."""
    return os.path.join(run.warm_start.cache_dir or os.path.join(run.out_dir, "warmstart"), cache_key(run))


def initial_policy(run: RunConfig) -> dict[str, Any]:
    """What ``run``'s RL starts from, to tell two runs' starting policies apart: the cached warm start (its cache
    key and ``weights_sha256``, built already), an HF checkpoint (its path) or a random init (its seed)."""
    if run.warm_start is not None:
        folder = cache_folder(run)
        with open(os.path.join(folder, "warmstart.json")) as f:
            record = json.load(f)
        return {"source": "warm_start", "key": os.path.basename(folder), "weights_sha256": record.get("weights_sha256"),
                "built_with": record.get("built_with")}
    if run.train.model.checkpoint:
        return {"source": "checkpoint", "path": os.path.abspath(run.train.model.checkpoint)}
    return {"source": "random", "seed": run.train.seed}


def warm_start_folder(run: RunConfig, tokenizer: Any) -> str:
    """The folder of the warm-started weights of ``run`` (HF layout), made now unless cached (module docstring)."""
    ws = run.warm_start
    folder = cache_folder(run)
    root = os.path.dirname(folder)
    if os.path.isfile(os.path.join(folder, "warmstart.json")):
        log.info("warm start: cached at %s", folder)
        _record_agreement(folder, run, tokenizer)
        return folder
    t0 = time.perf_counter()
    arch = run.train.model.arch
    ckpt = run.train.model.checkpoint
    episodes = min(ws.episodes, len(run.spec.tasks(run.spec.train_split)))
    ro = run.train.rollout
    loss = LossConfig(logprob_chunk=run.train.loss.logprob_chunk, logprob_remat=run.train.loss.logprob_remat)
    lr = ro.response_len if run.rubric_collect is None else max(ro.response_len, run.tree.rubric_tokens,
                                                                 run.tree.grade_tokens)  # SERA: rubric rows
    bucket = TREE_COMPACT_BUCKET if run.tree is not None else None
    model = load_hf(ckpt, config=arch) if ckpt else Qwen(arch, rngs=nnx.Rngs(ws.seed))
    rows = _demonstrations(run, tokenizer)
    turns = len(rows)
    losses = supervised(model, rows, ws, ro.prompt_len, lr, loss, max_allowed=run.collect.max_allowed,
                        compact_bucket=bucket)
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=root)
    try:
        save_hf(model, tmp)
        with open(os.path.join(tmp, "warmstart.json"), "w") as f:
            json.dump({"warm_start": {k: v for k, v in vars(ws).items() if k != "cache_dir"}, "env": run.env,
                       "episodes": episodes, "turns": turns, "loss_first": losses[0], "loss_last": losses[-1],
                       "losses": losses, "seconds": time.perf_counter() - t0, "built_with": build_info(),
                       "weights_sha256": weights_sha256(tmp)}, f, indent=1)
        if os.path.exists(folder):  # another process finished first: keep its copy
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("warm start: %d turns, NLL %.3f -> %.3f, saved to %s", turns, losses[0], losses[-1], folder)
    _record_agreement(folder, run, tokenizer)
    return folder


def build_info() -> dict[str, Any]:
    """What a warm start's floats depend on besides its config (module docstring, "Reproducibility")."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        rev = None
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "numpy": np.__version__,
            "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "devices": [str(d.platform) for d in jax.devices()], "git_revision": rev, **cpu_info()}


def cpu_info(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU's model name and whether it has AVX-512 (``avx512f``), read from ``cpuinfo`` (Linux); ``None`` where
    that file is missing or says nothing (module docstring, "Reproducibility": the CPU type changes a build)."""
    try:
        with open(cpuinfo) as f:
            text = f.read()
    except OSError:
        return {"cpu_model": None, "avx512": None}
    fields = dict(line.split(":", 1) for line in text.splitlines()[:64] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = fields.get("flags")
    return {"cpu_model": fields.get("model name"), "avx512": None if flags is None else "avx512f" in flags.split()}


def weights_sha256(folder: str) -> str:
    """sha256 over the folder's ``*.safetensors`` files in name order: equal hashes, identical weights."""
    h = hashlib.sha256()
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".safetensors")):
        with open(os.path.join(folder, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


AGREEMENT_TASKS = 64  # held-out tasks (the eval split's first ones) of the oracle-agreement probe
AGREEMENT_ROWS = 4096  # replies it scores at most (a larger probe is subsampled: probe.bounded_states)


def _record_agreement(folder: str, run: RunConfig, tokenizer: Any) -> None:
    """Add the warm-started policy's agreement with the oracle on held-out states (:mod:`agentjax.train.probe`,
    the first :data:`AGREEMENT_TASKS` tasks of the eval split) to ``warmstart.json`` once, and log it."""
    path = os.path.join(folder, "warmstart.json")
    with open(path) as f:
        record = json.load(f)
    if "agreement" not in record and run.tree is not None:
        return  # the probe scores flat episodes; a tree run's warm start reports its NLL only
    if "agreement" not in record:
        spec = run.spec
        tasks = spec.tasks(spec.eval_split)[:AGREEMENT_TASKS]
        try:
            record["agreement"] = oracle_agreement(load_hf(folder, config=run.train.model.arch), tokenizer,
                                                   spec.env_class()(**run.env_kwargs), tasks, run.collect,
                                                   max_rows=AGREEMENT_ROWS)
        except ValueError as e:  # an env without admissible lists (nothing to score) or without an oracle
            record["agreement"] = {"error": str(e)}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, path)
    a = record["agreement"]
    if "agreement" in a:
        log.info("warm start: agreement with the oracle on %d held-out states %.3f ± %.3f (chance %.3f)",
                 int(a["states"]), a["agreement"], a["agreement_se"], a["chance"])

"""Exact evaluation and credit accuracy during training, on an environment with a known model (the credit-testbed
MDPs, envs/mdp; METHODS.md "Exact credit on a known model").

The policy as a table. With constrained decoding over the admissible labels and prompts that depend on the state
alone (``history_length = 0``: the compact MDP template shows the observation only), the policy is a stationary
table ``π(a | s)``. Its row at a state is read from the decoder with one batched forward pass over every
(state, label) row of the MDP: the state's prompt exactly as the collector builds it
(:func:`~agentjax.rollout.collect.turn_prompt`), and the label's constrained reply
(``CollectConfig.constrained_format``) teacher-forced, each token's probability renormalised over the tokens the
constrained decoder allows at that position (:func:`~agentjax.models.constrain.constrained_choices`, at the
sampling temperature: :func:`~agentjax.train.update.forward_rows`, the loss's own computation). The product over
the reply's tokens is the probability that the constrained sampler emits that label (its stop token then has the
whole mass, as no reply is a prefix of another: checked). The table is renormalised in float64.

Exact evaluation (at every evaluation point, on the eval tasks): for each task's MDP, :func:`envs.mdp.evaluate` of
the current policy's table (at the evaluation's temperature) over ``(steps left, state)``, with the episode cap
``H = min(the env's step cap, CollectConfig.max_steps)`` (the collector truncates too), gives the exact success
probability from the start state and the discounted value (β = :data:`envs.mdp.BETA`). Logged as ``exact/success``
and ``exact/value`` (means over the eval tasks, beside the sampled ``eval/success_rate``, whose expectation is
``exact/success``); the per-task values go to the eval JSON (``eval/<step>.json``'s ``exact``), so a report can
pair tasks across runs.

Credit accuracy (at every evaluation point, on the batch of that update): the behaviour policy's table (the
parameters that collected the batch, before the update; the collector's temperature) on each group's MDP gives
the exact ``A^π_h(s, a)`` (β = 0.98), read at every decision row of the batch; the method's per-row advantage is
``Advantages.advantage``, the one the update trains with. :func:`agentjax.credit.accuracy.credit_accuracy` of the
two (each decision row weight 1, so visit-weighted) is logged as ``credit/pearson`` and
``credit/sign_agreement`` (``credit/exact_rows``: the decision rows counted). Where a row's coordinates come from:
the step ``t`` is the turn's index in its episode (``Turn.step``), so ``h = H − t``; the state before the turn is
the start state at ``t = 0`` and afterwards the env's ``info["state_id"]`` of the previous turn (the state a step
entered; an invalid step leaves it unchanged); the action is the slot of the executed label in that state's
admissible list. Decision rows: a valid turn in a state with more than one admissible label (rows of crashed
episodes, without a ``state_id``, are left out).

When the run cannot be read this way (an env without a known model, unconstrained decoding, prompts with
history, greedy or top-k / top-p sampling) :func:`exact_probe` returns None and says why in the log.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentjax.agents.compact import templates
from agentjax.credit.accuracy import credit_accuracy
from agentjax.rollout.batch import NO_ID, StepBatch
from agentjax.rollout.collect import CollectConfig, turn_prompt
from agentjax.rollout.policy import constrained_choices
from agentjax.rollout.records import Rollouts
from agentjax.train.advantages import Advantages
from agentjax.train.runconfig import RunConfig
from agentjax.train.state import policy_params
from agentjax.train.update import forward_rows
from envs.base import Task
from envs.mdp import BETA, MDP, Evaluation, MDPEnv, evaluate

log = logging.getLogger(__name__)

ROW_BUCKET = 256  # the (state, label) rows of a forward pass are padded to a power of two >= this (bounded compiles)


@dataclasses.dataclass(frozen=True)
class _Rows:
    """The (state, label) rows of one task's MDP: host arrays, one row per admissible label of an acting state."""

    model: MDP  # the MDP, its step cap the effective horizon H
    state: np.ndarray  # [n] int, the row's state
    slot: np.ndarray  # [n] int, the label's action slot
    prompt: list[list[int]]  # [n] prompt ids
    reply: list[list[int]]  # [n] reply ids (no stop token)
    allowed: list[tuple[tuple[int, ...], ...]]  # [n][len(reply)] the allowed token ids at each reply position


def _horizon(model: MDP, collect: CollectConfig) -> MDP:
    """``model`` with the episode cap the collector plays: min(env step cap, ``collect.max_steps``)."""
    cap = min(model.max_steps, collect.max_steps)
    return model if cap == model.max_steps else dataclasses.replace(model, max_steps=cap)


class ExactProbe:
    """Exact success of the eval tasks and credit accuracy of training batches (module docstring); built by
    :func:`exact_probe`."""

    def __init__(self, run: RunConfig, tokenizer: Any, eval_tasks: Sequence[Task], graphdef: nnx.GraphDef):
        self.run, self.tokenizer, self.eval_tasks = run, tokenizer, list(eval_tasks)
        self.train_env = run.spec.env_class()(**run.env_kwargs)
        self.eval_env = run.spec.env_class()(**run.eval_kwargs)
        co = run.collect
        self.template = templates(co.prompt)[run.env]
        self.stops = tuple(co.sampling.stop_token_ids)
        self._cache: dict[tuple[int, int], _Rows] = {}
        self._replies: dict[str, list[int]] = {}

        def label_logp(params, batch: StepBatch, temperature):
            loss = dataclasses.replace(run.train.loss, temperature=temperature)
            logp_bl = forward_rows(graphdef, params, batch, loss=loss, with_entropy=False)[0]
            return jnp.sum(jnp.where(batch.response_mask & batch.row_mask[:, None], logp_bl, 0.0), -1)

        self._label_logp = jax.jit(label_logp, static_argnames="temperature")

    # -- the policy table ------------------------------------------------------------------------------------------
    def _reply_ids(self, label: str) -> list[int]:
        text = self.run.collect.constrained_format.format(action=label)
        if text not in self._replies:
            self._replies[text] = list(self.tokenizer.encode(text, add_special_tokens=False))
        return self._replies[text]

    def _rows(self, env: MDPEnv, task: Task) -> _Rows:
        key = (id(env), task.seed)
        if key in self._cache:
            return self._cache[key]
        model = _horizon(env.model_of(task), self.run.collect)
        state, slot, prompt, reply, allowed = [], [], [], [], []
        for s, obs in enumerate(env.observations(task)):
            labels = obs.admissible or ()
            if len(labels) < 2:  # terminal (no row) or forced (π = 1, no forward pass needed)
                continue
            replies = [self._reply_ids(a) for a in labels]
            for i, r in enumerate(replies):
                if any(len(q) > len(r) and q[:len(r)] == r for q in replies):
                    raise ValueError(f"exact: the reply of {labels[i]!r} is a prefix of another's in state {s} of "
                                     f"{task.task_id}: its probability is not the product of its tokens'")
            ids, _ = turn_prompt(self.tokenizer, self.template, obs, [], 0, self.run.collect,
                                 f"state {s} of {task.task_id}")
            for a, r in enumerate(replies):
                state.append(s)
                slot.append(a)
                prompt.append(ids)
                reply.append(r)
                allowed.append(constrained_choices(replies, self.stops, r))
        rows = _Rows(model, np.asarray(state, np.int64), np.asarray(slot, np.int64), prompt, reply, allowed)
        self._cache[key] = rows
        return rows

    def tables(self, params: Any, env: MDPEnv, tasks: Sequence[Task], temperature: float) -> list[np.ndarray]:
        """``[len(tasks)]`` the policy table ``π(a | s)`` ``[S, A]`` of each task's MDP under ``params`` at
        ``temperature`` (module docstring): one forward pass over every (task, state, label) row."""
        per_task = [self._rows(env, t) for t in tasks]
        n = sum(len(r.state) for r in per_task)
        co = self.run.collect
        lp, lr = co.max_prompt_tokens, co.max_response_tokens
        width = max((len(a) for r in per_task for a in r.allowed), default=1)
        capacity = max(ROW_BUCKET, 1 << max(n - 1, 0).bit_length())
        prompt = np.zeros((n, lp), np.int32)
        prompt_mask = np.zeros((n, lp), bool)
        response = np.zeros((n, lr), np.int32)
        response_mask = np.zeros((n, lr), bool)
        allowed = np.full((n, lr, max(width, co.max_allowed)), NO_ID, np.int32)
        i = 0
        for r in per_task:
            for p, q, choices in zip(r.prompt, r.reply, r.allowed, strict=True):
                prompt[i, lp - len(p):], prompt_mask[i, lp - len(p):] = p, True
                response[i, :len(q)], response_mask[i, :len(q)] = q, True
                for j, c in enumerate(choices):
                    allowed[i, j, :len(c)] = c
                i += 1
        batch = StepBatch.from_rows(capacity, lp, lr, prompt_tokens=prompt, prompt_mask=prompt_mask,
                                    response_tokens=response, response_mask=response_mask, allowed_tokens=allowed)
        logp = np.asarray(self._label_logp(params, batch, float(temperature)), np.float64)[:n]
        out, start = [], 0
        for r in per_task:
            model = r.model
            pi = np.zeros(model.mask_sa.shape)
            forced = model.num_actions_s == 1
            pi[forced, 0] = 1.0
            k = len(r.state)
            pi[r.state, r.slot] = np.exp(logp[start:start + k])
            start += k
            acting = model.num_actions_s > 0
            pi[acting] /= pi[acting].sum(1, keepdims=True)
            out.append(pi)
        return out

    # -- the two measurements ----------------------------------------------------------------------------------------
    def evaluate(self, params: Any) -> dict[str, Any]:
        """The exact success and discounted value from the start state of each eval task under ``params`` at the
        evaluation's temperature: ``success`` / ``value`` (means over tasks) and ``success_per_task`` /
        ``value_per_task`` (lists, in the eval tasks' order)."""
        temperature = self.run.eval_collect.sampling.temperature
        tables = self.tables(params, self.eval_env, self.eval_tasks, temperature)
        evals = [evaluate(self._rows(self.eval_env, t).model, pi, BETA) for t, pi in
                 zip(self.eval_tasks, tables, strict=True)]
        success = [e.start_success for e in evals]
        value = [e.start_value for e in evals]
        return {"success": float(np.mean(success)), "value": float(np.mean(value)), "success_per_task": success,
                "value_per_task": value}

    def behaviour(self, params: Any, tasks: Sequence[Task]) -> list[Evaluation]:
        """``[len(tasks)]`` the exact evaluation of the behaviour policy (``params`` at the collector's
        temperature) on each task's MDP under the training setting."""
        tables = self.tables(params, self.train_env, tasks, self.run.train_collect.sampling.temperature)
        return [evaluate(self._rows(self.train_env, t).model, pi, BETA) for t, pi in zip(tasks, tables, strict=True)]

    def credit(self, params: Any, rollouts: Rollouts, adv: Advantages) -> dict[str, float]:
        """Credit accuracy of ``adv`` on the batch of ``rollouts`` (collected with ``params``; module docstring):
        ``pearson``, ``sign_agreement`` and ``exact_rows``."""
        g_size = rollouts.group_size
        tasks = [rollouts.episodes[g * g_size].task for g in range(rollouts.num_groups)]
        evals = self.behaviour(params, tasks)
        exact, weight = exact_rows(rollouts, [self._rows(self.train_env, t).model for t in tasks], evals)
        advantage = np.asarray(adv.advantage, np.float32)
        n = len(exact)  # the batch's real rows come first; the rest (padding, weight 0) keeps one shape per run
        if n > len(advantage):
            raise ValueError(f"exact: {n} turns but the batch's advantages have {len(advantage)} rows")
        pad = len(advantage) - n
        acc = credit_accuracy(jnp.asarray(advantage), jnp.asarray(np.pad(exact, (0, pad)), jnp.float32),
                              jnp.asarray(np.pad(weight, (0, pad)), jnp.float32))
        return {"pearson": float(acc["pearson"]), "sign_agreement": float(acc["sign_agreement"]),
                "exact_rows": float(weight.sum())}


def exact_rows(rollouts: Rollouts, models: Sequence[MDP], evals: Sequence[Evaluation]) -> tuple[np.ndarray, np.ndarray]:
    """``(exact [N], weight [N])`` over the turns of ``rollouts`` in the batch's row order (group, rollout, step):
    the exact ``A^π_h(s_t, a_t)`` of each group's evaluation and 1 on decision rows, 0 elsewhere (module
    docstring: where ``h``, ``s_t`` and ``a_t`` come from)."""
    exact, weight = [], []
    for ep in rollouts.episodes:
        model, ev = models[ep.group], evals[ep.group]
        state = model.start
        for turn in ep.turns:
            h = model.max_steps - turn.step
            labels = model.labels[state] if state >= 0 else ()
            action = turn.projected.action
            decided = turn.valid and len(labels) > 1 and action in labels and h > 0
            exact.append(float(ev.adv_hsa[h, state, labels.index(action)]) if decided else 0.0)
            weight.append(1.0 if decided else 0.0)
            state = int(turn.info.get("state_id", -1))
    return np.asarray(exact), np.asarray(weight)


def exact_probe(run: RunConfig, tokenizer: Any, eval_tasks: Sequence[Task], model: nnx.Module) -> ExactProbe | None:
    """The run's :class:`ExactProbe`, or None where the run cannot be read exactly (module docstring; the reason
    is logged)."""
    if run.tree is not None or not issubclass(run.spec.env_class(), MDPEnv):
        return None
    co, sampling = run.collect, run.collect.sampling
    eval_sampling = run.eval_collect.sampling
    why = None
    if not co.constrained:
        why = "the decoding is not constrained to the admissible labels (collect.constrained)"
    elif co.history_length:
        why = f"the prompts show {co.history_length} history records, so the policy is not a table of the state"
    elif min(sampling.temperature, eval_sampling.temperature) <= 0 or sampling.top_k or sampling.top_p < 1:
        why = "greedy, top-k or top-p sampling is not the renormalised softmax the tables read"
    if why is not None:
        log.warning("no exact evaluation or credit accuracy for this mdp run: %s", why)
        return None
    policy_params(model)  # raises on non-Param state, as the update does
    probe = ExactProbe(run, tokenizer, eval_tasks, nnx.graphdef(model))
    for env in (probe.train_env, probe.eval_env):
        if co.max_steps < env.max_steps:
            log.warning("the collector ends episodes after %d steps, before the mdp setting's cap of %d (%s): the "
                        "exact values are those of the %d-step episode; raise --max-steps to play the setting's",
                        co.max_steps, env.max_steps, env.config, co.max_steps)
    return probe


def exact_scalars(evaluation: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of an evaluation's ``exact`` block (``exact/`` metrics); empty without one."""
    return {k: v for k, v in evaluation.get("exact", {}).items() if not isinstance(v, list)}


__all__ = ["ROW_BUCKET", "ExactProbe", "exact_probe", "exact_rows", "exact_scalars"]

"""Does the policy read its observation? Agreement with the oracle's action on held-out states, against chance.

Before RL is worth its CPU hours, a warm-started policy must beat a policy that ignores the observation. The
probe walks the oracle's trajectory on held-out tasks (the eval split) and, at every state, scores each
admissible action's reply under the policy: ``log π(reply) = Σ_j log π(y_j | prompt, y_<j)`` of
``collect.constrained_format.format(action=a)`` followed by the stop token, on the prompt the collector would
build there (same template, prompt style and history of the oracle's own earlier actions). The policy's choice
is the highest-scoring reply (the mode of the constrained decoder's reply distribution); with
``masked_logp`` the log-probs are renormalised over the trie's allowed tokens at every position, as the
constrained sampler draws them (this does not change which reply scores highest when every reply has the same
token count, as Sokoban's do).

Reported: ``agreement`` (fraction of states where the choice is the oracle's action), ``chance`` (the mean of
``1 / #admissible``: what a policy that ignores the observation gets in expectation), ``oracle_prob`` (mean
probability of the oracle's reply after normalising over the admissible replies), ``states`` and the standard
error of the agreement (binomial, states treated as independent). Prompts are the collector's own
(:func:`~agentjax.rollout.collect.turn_prompt`: history, truncation). A probe of more than ``max_rows`` replies
(TextCraft lists ~100 admissible crafts per state) scores a bounded sample (:func:`bounded_states`). The oracle's
action is one optimal action; where several are optimal the agreement is a lower bound on "plays optimally".
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentjax.agents.compact import templates
from agentjax.rollout.batch import NO_ID, StepBatch
from agentjax.rollout.collect import PROJECTORS, CollectConfig, turn_prompt
from agentjax.rollout.policy import constrained_choices
from agentjax.train.config import LossConfig
from agentjax.train.update import forward_rows


def oracle_states(env: Any, tasks: Sequence[Any], tokenizer: Any, config: CollectConfig
                  ) -> list[tuple[list[int], list[str], int]]:
    """``(prompt ids, admissible replies, index of the oracle's reply)`` at every state of the oracle's trajectory
    on each task (the prompts the collector would build there)."""
    out = []
    for task in tasks:
        template, projector = templates(config.prompt)[task.env], PROJECTORS[task.env]
        obs, history = env.reset(task), []
        for step in range(config.max_steps):
            if not obs.admissible:
                raise ValueError(f"probe: {task.env} has no admissible-action list to score")
            prompt, _ = turn_prompt(tokenizer, template, obs, history, step, config, f"task {task.task_id!r}")
            action = env.oracle()
            names = [a.lower() for a in obs.admissible]
            if action.lower() not in names:
                raise ValueError(f"probe: the oracle's action {action!r} is not admissible in {task.task_id!r}")
            replies = [config.constrained_format.format(action=a) for a in obs.admissible]
            out.append((prompt, replies, names.index(action.lower())))
            sent = projector(replies[out[-1][2]], obs.admissible, require_think=False).action
            history.append((obs.text, sent))
            obs, _, done, _ = env.step(sent)
            if done:
                break
    return out


@functools.partial(jax.jit, static_argnames=("graphdef", "loss"))
def _reply_logp(graphdef, params, batch: StepBatch, *, loss: LossConfig) -> jax.Array:
    logp, _, _ = forward_rows(graphdef, params, batch, loss=loss, with_entropy=False)
    return jnp.sum(jnp.where(batch.response_mask, logp, 0.0), -1)


def bounded_states(states: list[tuple[list[int], list[str], int]], max_rows: int, max_candidates: int = 16,
                   seed: int = 0) -> list[tuple[list[int], list[str], int]]:
    """``states`` with at most about ``max_rows`` scored replies: unchanged when they fit; else every state keeps
    the oracle's reply and ``max_candidates - 1`` others drawn without replacement (order kept), and states evenly
    spaced over the list are kept until the rows fit."""
    if sum(len(r) for _, r, _ in states) <= max_rows:
        return states
    rng = np.random.default_rng(seed)
    out = []
    for prompt, replies, oracle in states:
        if len(replies) > max_candidates:
            others = [i for i in range(len(replies)) if i != oracle]
            keep = sorted([oracle, *rng.choice(others, max_candidates - 1, replace=False).tolist()])
            replies, oracle = [replies[i] for i in keep], keep.index(oracle)
        out.append((prompt, replies, oracle))
    rows = sum(len(r) for _, r, _ in out)
    if rows > max_rows:
        count = max(1, int(len(out) * max_rows / rows))
        out = [out[i] for i in np.linspace(0, len(out) - 1, count).round().astype(int)]
    return out


def oracle_agreement(model: Any, tokenizer: Any, env: Any, tasks: Sequence[Any], config: CollectConfig, *,
                     batch_rows: int = 64, max_rows: int | None = None, max_candidates: int = 16
                     ) -> dict[str, float]:
    """The probe of the module docstring over the oracle trajectories of ``tasks``. With ``max_rows``, a large probe
    is bounded by :func:`bounded_states` (fewer states, and at most ``max_candidates`` replies per state: chance
    rises to match, and is reported)."""
    states = oracle_states(env, tasks, tokenizer, config)
    if max_rows is not None:
        states = bounded_states(states, max_rows, max_candidates)
    stops = config.sampling.stop_token_ids
    graphdef, params = nnx.split(model, nnx.Param)
    lp = max(len(p) for p, _, _ in states)
    lp += -lp % 32
    rows, owners = [], []
    for s, (prompt, replies, _) in enumerate(states):
        bare = [list(tokenizer.encode(r, add_special_tokens=False)) for r in replies]
        for reply in bare:
            response = reply + [stops[0]]
            choices = constrained_choices(bare, stops, response) if config.masked_logp else None
            rows.append((prompt, response, choices))
            owners.append(s)
    scores = np.zeros(len(rows), np.float64)
    loss = LossConfig()
    # Every admissible reply is scored whole, so the response and allowed-token widths are the collector's or more
    # where a held-out state lists longer replies (TextCraft-Synth's validation tasks: crafting commands of up to 70
    # tokens against a 64-token reply budget) or more next tokens at a position (the slots a multiple of 16).
    lr = max([config.max_response_tokens, *(len(r) for _, r, _ in rows)])
    width = max([config.max_allowed, *(len(c) for _, _, ch in rows for c in ch or ())])
    width += -width % 16
    for start in range(0, len(rows), batch_rows):
        part = rows[start:start + batch_rows]
        n = len(part)
        prompt, pmask = np.zeros((n, lp), np.int32), np.zeros((n, lp), bool)
        response, rmask = np.zeros((n, lr), np.int32), np.zeros((n, lr), bool)
        for i, (p, r, _) in enumerate(part):
            prompt[i, lp - len(p):], pmask[i, lp - len(p):] = p, True
            response[i, :len(r)], rmask[i, :len(r)] = r, True
        fields = dict(prompt_tokens=prompt, prompt_mask=pmask, response_tokens=response, response_mask=rmask)
        if config.masked_logp:
            allowed = np.full((n, lr, width), NO_ID, np.int32)
            for i, (_, _, choices) in enumerate(part):
                for j, c in enumerate(choices):
                    allowed[i, j, :len(c)] = c
            fields["allowed_tokens"] = allowed
        batch = StepBatch.from_rows(batch_rows, lp, lr, **fields)
        scores[start:start + n] = np.asarray(_reply_logp(graphdef, params, batch, loss=loss))[:n]
    owners_a = np.asarray(owners)
    agree, prob, chance = [], [], []
    for s, (_, replies, oracle) in enumerate(states):
        z = scores[owners_a == s]
        p = np.exp(z - z.max())
        p /= p.sum()
        agree.append(float(np.argmax(z) == oracle))
        prob.append(float(p[oracle]))
        chance.append(1.0 / len(replies))
    a = np.asarray(agree)
    return {"agreement": float(a.mean()), "agreement_se": float(a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1
            else float("nan"), "chance": float(np.mean(chance)), "oracle_prob": float(np.mean(prob)),
            "states": float(len(a)), "tasks": float(len(tasks))}


__all__ = ["bounded_states", "oracle_agreement", "oracle_states"]

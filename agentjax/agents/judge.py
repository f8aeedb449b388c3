"""Judges: did a child agent complete its goal? One interface, four backends (METHODS.md "SERA" 5, 8).

RAO's child reward, and the labels of SERA's rubric training, come from a success check of the child against the
goal its parent gave it. ``judge(requests) -> verdicts`` takes a batch of :class:`JudgeRequest` s (the tree
collector sends every child that stopped in a turn at once) and returns one :class:`Verdict` each:

- :class:`ProgramJudge` — TextCraft-Synth's program check (the released executor's ``evaluate``): the child called
  ``finish`` and, for every target item, the count held when it stopped minus the count when it started is at least
  the target.
- :class:`VerifierJudge` — a programmatic verifier over the engine's state, injected as a callable
  ``verify(goal, state) -> bool`` (TextWorld-Sync's subtask verifier; the offline default).
- :class:`SamplerJudge` — a local checkpoint served by a policy the caller passes in (the project's own sampler,
  :class:`agentjax.models.Sampler`): one batched generation for all requests.
- :class:`HTTPJudge` — an OpenAI-compatible ``/chat/completions`` endpoint through ``urllib`` (the paper's external
  LLM judge on TextWorld-Sync), one request per child on a few threads, retries on 429 / 5xx / network errors.

The language-model judges read :func:`judge_messages` (a strict binary judgement, the goal, the child's trajectory,
its finish message and the final state) and must answer a JSON object ``{"success": bool, "reason": str}``
(:func:`parse_verdict`; text after a ``</think>`` counts); an environment may give its own prompt and answer parser
(``messages=`` / ``parse=``; TextWorld-Sync's yes/no judgement: :mod:`agentjax.agents.textworld_tree`). An answer
that does not parse, or a failed request, is a verdict with ``ok = False``: the child has no label (the trainer
drops it) and the failure is counted. A child that did not finish fails without a judge call (``require_finish``,
the released TextCraft check; the released TextWorld-Sync judge reads every child). Every judge counts its backend
calls, the requests, input and output tokens, failures and successes in :attr:`Judge.metrics`.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from agentjax.agents.prompts import encode_prompt

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JudgeRequest:
    """Everything a judge may read about one child (the world adapter fills what its env has)."""

    goal: str
    finished: bool  # the child replied with a finish
    finish_message: str = ""
    trajectory: str = ""  # the child's replies and what followed each, as text
    final_state: str = ""  # the world when the child stopped, as text
    targets: Mapping[str, int] = dataclasses.field(default_factory=dict)  # TextCraft: {item: count to add}
    start_counts: Mapping[str, int] = dataclasses.field(default_factory=dict)  # the targets' counts at the start
    end_counts: Mapping[str, int] = dataclasses.field(default_factory=dict)  # ... when it stopped
    state: Any = None  # the engine's state for a programmatic verifier


@dataclasses.dataclass(frozen=True)
class Verdict:
    success: bool
    ok: bool = True  # False: no usable verdict (parse failure, request error); the child gets no label
    reason: str = ""


@dataclasses.dataclass
class JudgeMetrics:
    """Counters of one judge (thread-safe updates through :meth:`add`)."""

    calls: int = 0  # backend invocations (program checks, generate calls, HTTP attempts)
    requests: int = 0  # children judged
    input_tokens: int = 0
    output_tokens: int = 0
    failures: int = 0  # verdicts with ok = False
    successes: int = 0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + int(value))

    def as_dict(self, prefix: str = "judge/") -> dict[str, float]:
        names = ("calls", "requests", "input_tokens", "output_tokens", "failures", "successes")
        return {prefix + n: float(getattr(self, n)) for n in names}


class Judge(abc.ABC):
    """``judge(requests) -> verdicts`` (module docstring); subclasses implement :meth:`_judge`."""

    def __init__(self, *, require_finish: bool = True):
        self.require_finish = require_finish
        self.metrics = JudgeMetrics()

    def __call__(self, requests: Sequence[JudgeRequest]) -> list[Verdict]:
        requests = list(requests)
        verdicts: list[Verdict | None] = [None] * len(requests)
        asked = []
        for i, r in enumerate(requests):
            if self.require_finish and not r.finished:
                verdicts[i] = Verdict(False, True, "did not finish")
            else:
                asked.append(i)
        if asked:
            for i, v in zip(asked, self._judge([requests[i] for i in asked]), strict=True):
                verdicts[i] = v
        self.metrics.add(requests=len(requests), failures=sum(not v.ok for v in verdicts),
                         successes=sum(v.ok and v.success for v in verdicts))
        return verdicts

    @abc.abstractmethod
    def _judge(self, requests: list[JudgeRequest]) -> list[Verdict]: ...


class ProgramJudge(Judge):
    """TextCraft-Synth: every target's count rose by at least its target while the child ran (and it finished)."""

    def _judge(self, requests: list[JudgeRequest]) -> list[Verdict]:
        self.metrics.add(calls=len(requests))
        out = []
        for r in requests:
            missing = {item: n - (r.end_counts.get(item, 0) - r.start_counts.get(item, 0))
                       for item, n in r.targets.items()}
            missing = {k: v for k, v in missing.items() if v > 0}
            ok = bool(r.targets) and not missing
            out.append(Verdict(ok, True, "targets crafted" if ok else f"missing {missing or 'targets'}"))
        return out


class VerifierJudge(Judge):
    """A programmatic verifier ``verify(goal, state) -> bool`` over the engine's state (e.g. TextWorld-Sync)."""

    def __init__(self, verify: Callable[[str, Any], bool], *, require_finish: bool = True):
        super().__init__(require_finish=require_finish)
        self.verify = verify

    def _judge(self, requests: list[JudgeRequest]) -> list[Verdict]:
        self.metrics.add(calls=len(requests))
        return [Verdict(bool(self.verify(r.goal, r.state)), True, "verifier") for r in requests]


# ------------------------------------------------------------------------------------------------ LLM judges

JUDGE_SYSTEM = ("You are a strict judge of the work of a sub-agent. A parent agent gave it a goal; decide from the "
                "evidence whether the sub-agent completed that goal, in a way its parent can rely on. When in doubt, "
                "answer false. Reply with only a JSON object: {\"success\": true or false, \"reason\": \"...\"}.")


def judge_messages(request: JudgeRequest) -> list[dict[str, str]]:
    """The chat messages of a binary judgement of one child."""
    finish = request.finish_message if request.finished else "(it stopped without finishing)"
    user = (f"Goal given to the sub-agent:\n{request.goal}\n\nWhat it did:\n{request.trajectory or '(nothing)'}\n\n"
            f"Its finish message:\n{finish}\n\nThe world when it stopped:\n{request.final_state or '(not shown)'}\n\n"
            "Did the sub-agent complete its goal? Answer with the JSON object only.")
    return [dict(role="system", content=JUDGE_SYSTEM), dict(role="user", content=user)]


def json_objects(text: str) -> Iterator[dict[str, Any]]:
    """The top-level JSON objects in ``text`` after its last ``</think>``, in order (markdown fences and prose
    around them are skipped; an object nested in another is not yielded on its own)."""
    text = (text or "").rsplit("</think>", 1)[-1]
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start >= 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            value, end = None, start + 1
        if isinstance(value, dict):
            yield value
        start = text.find("{", end)


def parse_verdict(text: str) -> Verdict:
    """The first top-level JSON object with a boolean ``success`` after the last ``</think>``; else a failed
    verdict."""
    for value in json_objects(text):
        if isinstance(value.get("success"), bool):
            reason = value.get("reason", "")
            return Verdict(value["success"], True, reason if isinstance(reason, str) else str(reason))
    return Verdict(False, False, "no JSON object with a boolean 'success'")


Messages = Callable[[JudgeRequest], list[dict[str, str]]]  # a judge prompt: request -> chat messages
Parse = Callable[[str], Verdict]  # a judge answer -> verdict (ok=False when it does not parse)


class SamplerJudge(Judge):
    """A local model as judge, through a policy the caller builds: one ``generate`` call per batch.

    ``policy``: anything with the collectors' policy protocol (:mod:`agentjax.rollout.policy`: ``tokenizer`` and
    ``generate``), e.g. a checkpoint served by the project's sampler, ``Sampler(load_hf(folder),
    load_tokenizer(folder))``. ``params``: its sampling parameters, e.g. greedy with 256 new tokens and the chat stop
    tokens (``SamplingParams(temperature=0, max_new_tokens=256, stop_token_ids=CHAT_STOP_IDS)``). Prompts longer
    than ``max_prompt_tokens`` keep their last tokens (the question and the answer format sit at the end).
    """

    def __init__(self, policy: Any, params: Any, *, key: Any = None, max_prompt_tokens: int = 4096,
                 require_finish: bool = True, messages: Messages = judge_messages, parse: Parse = parse_verdict):
        super().__init__(require_finish=require_finish)
        self.messages, self.parse = messages, parse
        self.policy, self.params, self.max_prompt_tokens = policy, params, max_prompt_tokens
        self._key = jax.random.key(0) if key is None else key
        self._count = 0

    def _judge(self, requests: list[JudgeRequest]) -> list[Verdict]:
        prompts = [encode_prompt(self.policy.tokenizer, self.messages(r))[-self.max_prompt_tokens:]
                   for r in requests]
        key = jax.random.fold_in(self._key, self._count)
        self._count += 1
        out = self.policy.generate(prompts, self.params, key)
        self.metrics.add(calls=1, input_tokens=sum(map(len, prompts)),
                         output_tokens=int(sum(int(n) for n in out.length_b[: len(requests)])))
        return [self.parse(t) for t in out.texts[: len(requests)]]


class HTTPJudge(Judge):
    """An OpenAI-compatible chat-completions endpoint as judge (stdlib ``urllib`` only).

    ``base_url``: e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended). The key is read from the
    environment variable ``api_key_env`` at each call (no header when it is unset); it never appears in errors or
    reasons. Token counts come from the response's ``usage`` (else about 4 characters per token).

    Failures: a 429, a 5xx, a network error or a timeout (``timeout`` seconds per attempt) is retried ``retries``
    times with a short backoff; another 4xx or a body that is not a chat completion is not. A request that still
    fails, or an answer ``parse`` cannot read, is a failed verdict whose reason names the endpoint (and the attempts
    and the last error), and each batch with failures logs one warning naming the endpoint.
    """

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", temperature: float = 0.0,
                 max_tokens: int = 256, timeout: float = 60.0, retries: int = 2, max_workers: int = 8,
                 require_finish: bool = True, messages: Messages = judge_messages, parse: Parse = parse_verdict):
        super().__init__(require_finish=require_finish)
        self.messages, self.parse = messages, parse
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("HTTPJudge: base_url must be an http(s) URL")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key_env = model, api_key_env
        self.temperature, self.max_tokens, self.timeout = temperature, max_tokens, timeout
        self.retries, self.max_workers = retries, max_workers

    def _judge(self, requests: list[JudgeRequest]) -> list[Verdict]:
        if len(requests) == 1 or self.max_workers <= 1:
            verdicts = [self._one(r) for r in requests]
        else:
            with concurrent.futures.ThreadPoolExecutor(min(self.max_workers, len(requests))) as pool:
                verdicts = list(pool.map(self._one, requests))
        failed = [v for v in verdicts if not v.ok]
        if failed:
            log.warning("HTTP judge %s: %d of %d requests gave no verdict (e.g. %s)", self.url, len(failed),
                        len(verdicts), failed[0].reason)
        return verdicts

    def _one(self, request: JudgeRequest) -> Verdict:
        messages = self.messages(request)
        payload = dict(model=self.model, messages=messages, temperature=self.temperature, max_tokens=self.max_tokens)
        headers = {"Content-Type": "application/json"}
        if key := os.environ.get(self.api_key_env, "").strip():
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(payload).encode("utf-8")
        error, attempts = "no attempt", 0
        for attempt in range(self.retries + 1):
            attempts += 1
            self.metrics.add(calls=1)
            try:
                req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout) as response:
                    body = json.loads(response.read(4 << 20).decode("utf-8"))
                text = body["choices"][0]["message"]["content"]
                usage = body.get("usage") or {}
                chars = sum(len(m["content"]) for m in messages)
                self.metrics.add(input_tokens=usage.get("prompt_tokens", chars // 4),
                                 output_tokens=usage.get("completion_tokens", len(text or "") // 4))
                verdict = self.parse(text if isinstance(text, str) else "")
                return verdict if verdict.ok else Verdict(False, False, f"{self.url} answered no verdict: "
                                                                        f"{verdict.reason}")
            except urllib.error.HTTPError as exc:
                error = f"HTTP {exc.code}"
                exc.close()
                if exc.code != 429 and exc.code < 500:
                    break
            except (urllib.error.URLError, TimeoutError, OSError) as exc:
                error = type(exc).__name__
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                error = f"bad response ({type(exc).__name__})"
                break
            if attempt < self.retries:
                time.sleep(min(0.1 * 2**attempt, 2.0))
        return Verdict(False, False, f"judge request to {self.url} failed after {attempts} attempt(s): {error}")


__all__ = [
    "HTTPJudge",
    "Judge",
    "JudgeMetrics",
    "JudgeRequest",
    "ProgramJudge",
    "SamplerJudge",
    "Verdict",
    "VerifierJudge",
    "judge_messages",
    "parse_verdict",
]

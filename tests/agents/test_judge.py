"""Judges of a child's success: the TextCraft program check, an injected verifier, the local sampler, an HTTP endpoint.

Checked: verdicts by hand; an unfinished child fails without a judge call; the parse of judge answers; the sampler
judge batches all requests into one generate call and counts tokens (a scripted policy; a tiny random Qwen, also
loaded from a saved checkpoint); the HTTP judge against a stub OpenAI-compatible server on 127.0.0.1 (verdicts,
usage tokens, the key header, retries on 5xx, no retry on 4xx, a dead port, malformed answers).
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import numpy as np
import pytest
from flax import nnx

from agentjax.agents.judge import (
    HTTPJudge,
    JudgeRequest,
    ProgramJudge,
    SamplerJudge,
    Verdict,
    VerifierJudge,
    judge_messages,
    parse_verdict,
)
from agentjax.models import (
    Finish,
    Qwen,
    QwenConfig,
    SampleOutput,
    Sampler,
    SamplingParams,
    load_hf,
    load_tokenizer,
    save_hf,
)
from agentjax.models.tokenizer import IM_END_ID

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=256, stop_token_ids=(IM_END_ID,), prompt_bucket=256)


def request(goal="craft 2x a", finished=True, start=None, end=None, targets=None, state=None) -> JudgeRequest:
    return JudgeRequest(goal=goal, finished=finished, finish_message="done", trajectory="craft(...) -> ok",
                        final_state="Inventory: {}", targets=targets if targets is not None else {"a": 2},
                        start_counts=start or {}, end_counts=end or {}, state=state)


def test_program_judge_checks_the_rise_of_every_target():
    judge = ProgramJudge()
    verdicts = judge([
        request(start={"a": 1}, end={"a": 3}),  # rose by 2
        request(start={"a": 1}, end={"a": 2}),  # rose by 1 only
        request(targets={"a": 2, "b": 1}, start={}, end={"a": 5, "b": 1}),
        request(targets={"a": 2, "b": 1}, start={"b": 1}, end={"a": 5, "b": 1}),  # b held before, not made
        request(start={}, end={"a": 9}, finished=False),  # did not finish
        request(targets={}),
    ])
    assert [v.success for v in verdicts] == [True, False, True, False, False, False]
    assert all(v.ok for v in verdicts) and "missing {'b': 1}" in verdicts[3].reason
    assert judge.metrics.as_dict() == {"judge/calls": 5.0, "judge/requests": 6.0, "judge/input_tokens": 0.0,
                                       "judge/output_tokens": 0.0, "judge/failures": 0.0, "judge/successes": 2.0}


def test_verifier_judge_reads_the_engine_state():
    seen = []

    def verify(goal, state):
        seen.append((goal, state))
        return state["sliced"] and "apple" in goal

    judge = VerifierJudge(verify)
    verdicts = judge([request("slice the apple", state={"sliced": True}),
                      request("slice the apple", state={"sliced": False}),
                      request("slice the apple", finished=False, state={"sliced": True})])
    assert [v.success for v in verdicts] == [True, False, False] and len(seen) == 2
    assert VerifierJudge(verify, require_finish=False)([request("apple", False, state={"sliced": True})])[0].success
    assert judge.metrics.calls == 2 and judge.metrics.requests == 3


@pytest.mark.parametrize("text, expected", [
    ('{"success": true, "reason": "ok"}', Verdict(True, True, "ok")),
    ('<think>{"success": true}</think> Final: {"success": false, "reason": "no"}', Verdict(False, True, "no")),
    ('Sure! ```json\n{"reason": "x", "success": true}\n```', Verdict(True, True, "x")),
    ('{"note": {"success": true}} then {"success": false}', Verdict(False, True, "")),
    ('{"success": "yes"}', Verdict(False, False, "no JSON object with a boolean 'success'")),
    ("YES", Verdict(False, False, "no JSON object with a boolean 'success'")),
    ("{" * 5000, Verdict(False, False, "no JSON object with a boolean 'success'")),
    ("", Verdict(False, False, "no JSON object with a boolean 'success'")),
])
def test_parse_verdict(text, expected):
    assert parse_verdict(text) == expected


def test_judge_messages_hold_the_evidence():
    system, user = judge_messages(request())
    assert system["role"] == "system" and '"success"' in system["content"]
    assert all(x in user["content"] for x in ("craft 2x a", "craft(...) -> ok", "done", "Inventory: {}"))
    assert "stopped without finishing" in judge_messages(request(finished=False))[1]["content"]


# ------------------------------------------------------------------------------------------------ sampler judge


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


class ScriptedPolicy:
    """Answers each prompt with ``answers[i]``; records the calls."""

    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers, self.calls = tokenizer, answers, []

    def generate(self, prompts, params, key, **kw) -> SampleOutput:
        self.calls.append(len(prompts))
        ids = [self.tokenizer.encode(a, add_special_tokens=False) + [IM_END_ID] for a in self.answers]
        b, t = len(prompts), max(map(len, ids))
        tokens = np.zeros((b, t), np.int32)
        for i, x in enumerate(ids):
            tokens[i, : len(x)] = x
        return SampleOutput(tokens_bt=tokens, logp_bt=np.zeros((b, t), np.float32),
                            logp_unmasked_bt=np.zeros((b, t), np.float32),
                            length_b=np.array([len(x) for x in ids], np.int32),
                            finish_b=np.full(b, Finish.STOP_TOKEN, np.int32), texts=list(self.answers))


def test_sampler_judge_one_generate_call_per_batch_and_token_counts(tokenizer):
    policy = ScriptedPolicy(tokenizer, ['{"success": true}', "no idea", '{"success": false, "reason": "short"}'])
    judge = SamplerJudge(policy, GREEDY)
    verdicts = judge([request(), request(), request(finished=False), request()])
    assert policy.calls == [3]  # the unfinished child is not asked
    assert [(v.success, v.ok) for v in verdicts] == [(True, True), (False, False), (False, True), (False, True)]
    m = judge.metrics
    assert m.calls == 1 and m.requests == 4 and m.failures == 1 and m.successes == 1
    prompt = len(tokenizer.apply_chat_template(judge_messages(request()), add_generation_prompt=True, tokenize=True,
                                               return_dict=False))
    assert m.input_tokens == 3 * prompt
    assert m.output_tokens == sum(len(tokenizer.encode(a, add_special_tokens=False)) + 1 for a in policy.answers)


def test_sampler_judge_served_from_a_tiny_random_checkpoint(tokenizer, tmp_path):
    config = QwenConfig.tiny_qwen3(vocab_size=151_936, d_model=32, mlp_dim=64, num_layers=1, head_dim=8)
    save_hf(Qwen(config, rngs=nnx.Rngs(0)), tmp_path / "judge", tokenizer=tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(IM_END_ID,), prompt_bucket=256)
    judge = SamplerJudge(Sampler(load_hf(tmp_path / "judge"), load_tokenizer(tmp_path / "judge")), params)
    verdicts = judge([request(), request(goal="craft 1x b")])
    assert len(verdicts) == 2 and not any(v.ok for v in verdicts)  # a random model writes no JSON verdict
    m = judge.metrics
    assert m.calls == 1 and m.failures == 2 and 2 <= m.output_tokens <= 12 and m.input_tokens > 100


# ------------------------------------------------------------------------------------------------ HTTP judge


class Stub(http.server.BaseHTTPRequestHandler):
    """``/v1/chat/completions``: success iff the goal mentions 'apple'; scripted failures by goal keyword."""

    seen: list = []
    flaky: dict = {}

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        user = body["messages"][-1]["content"]
        Stub.seen.append((self.path, self.headers.get("Authorization"), body))
        if "teapot" in user:
            return self._send(418, {"error": "no"})
        if "sleepy" in user:  # past the client's timeout: it has hung up, nothing to answer
            return time.sleep(1.0)
        if "flaky" in user and Stub.flaky.setdefault(user, 0) < 1:
            Stub.flaky[user] += 1
            return self._send(503, {"error": "busy"})
        content = "I refuse" if "garbled" in user else json.dumps({"success": "apple" in user, "reason": "stub"})
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": content}}],
                         "usage": {"prompt_tokens": 100, "completion_tokens": 7}})

    def _send(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Stub.seen, Stub.flaky = [], {}
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_http_judge_against_a_local_stub(server, monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-secret")
    judge = HTTPJudge(server, "stub-model", api_key_env="JUDGE_TEST_KEY", max_workers=4)
    verdicts = judge([request("slice the apple"), request("slice the carrot"), request("apple", finished=False),
                      request("apple flaky"), request("apple garbled"), request("apple teapot")])
    assert [(v.success, v.ok) for v in verdicts] == [(True, True), (False, True), (False, True), (True, True),
                                                     (False, False), (False, False)]
    url = f"{server}/chat/completions"
    assert verdicts[5].reason == f"judge request to {url} failed after 1 attempt(s): HTTP 418"
    assert verdicts[4].reason.startswith(f"{url} answered no verdict") and "sk-secret" not in str(verdicts)
    paths = {p for p, _, _ in Stub.seen}
    assert paths == {"/v1/chat/completions"} and {a for _, a, _ in Stub.seen} == {"Bearer sk-secret"}
    body = Stub.seen[0][2]
    assert body["model"] == "stub-model" and body["temperature"] == 0.0 and body["messages"][0]["role"] == "system"
    m = judge.metrics
    # 5 children asked; the flaky one twice (503, then 200); the teapot once (4xx: no retry)
    assert m.calls == 6 and len(Stub.seen) == 6 and m.requests == 6
    assert m.input_tokens == 4 * 100 and m.output_tokens == 4 * 7 and m.failures == 2 and m.successes == 2


def test_http_judge_unreachable_endpoint_fails_softly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    judge = HTTPJudge(f"http://127.0.0.1:{port}/v1", "m", retries=1, timeout=2.0)
    (verdict,) = judge([request("apple")])
    assert not verdict.ok and verdict.reason.startswith(f"judge request to http://127.0.0.1:{port}/v1/chat/completions "
                                                        "failed after 2 attempt(s)")
    assert judge.metrics.calls == 2 and judge.metrics.failures == 1
    with pytest.raises(ValueError, match="http"):
        HTTPJudge("file:///etc/passwd", "m")


def test_http_judge_slow_endpoint_times_out_each_attempt_and_names_it(server, caplog):
    """An endpoint slower than ``timeout``: every attempt times out, the call takes about (retries + 1) timeouts,
    and the failed verdict and the logged warning name the endpoint."""
    judge = HTTPJudge(server, "m", retries=1, timeout=0.2)
    t0 = time.perf_counter()
    (verdict,) = judge([request("apple sleepy")])
    assert time.perf_counter() - t0 < 1.0 and judge.metrics.calls == 2
    assert not verdict.ok and verdict.reason == (f"judge request to {server}/chat/completions failed after 2 "
                                                 "attempt(s): TimeoutError")
    assert f"HTTP judge {server}/chat/completions: 1 of 1 requests gave no verdict" in caplog.text

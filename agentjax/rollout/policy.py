"""The policy protocol of :mod:`agentjax.rollout`: what the collectors ask of a policy and what it answers.

DESIGN.md ("Data flow"): the collectors talk to the policy through this protocol, never by importing
:mod:`agentjax.models`; :class:`agentjax.models.Sampler` satisfies it structurally (its module imports the types
below), test doubles implement it in a few lines. A policy is an object with

- ``tokenizer`` (:class:`Tokenizer`): the chat template that encodes prompts, ``encode`` for the allowed replies and
  ``decode`` for the token roles of a reply;
- ``generate(prompts, params, key, *, max_new_tokens, allowed, max_trie_edges, row_keys, sparse, dense_draws)``
  (:class:`Policy`): one batched call; a :class:`SampleOutput` out;
- optionally ``choose(prompts, allowed, params, key)`` (:class:`Chooser`): the constrained choice among a few whole
  answers in one teacher-forced pass, the same distribution as ``generate`` under the same constraint.

**Generation under constraints.** ``allowed[b]`` lists the token sequences row ``b`` may emit (the tokenisations of
its allowed replies; an empty list leaves the row free). A constrained row emits exactly one of them, then one of
``params.stop_token_ids``. At response position ``j`` the decoder allows the ``j``-th tokens of the sequences that
agree with the row's first ``j`` tokens, plus the stop ids where one of those sequences is complete
(:func:`constrained_choices` states it on the host; the trainer renormalises its log-probs over the same choices).
The policy builds its own search structure from ``allowed`` (the sampler: a token trie of at least
``max_trie_edges`` edges).

**Log-probs.** ``SampleOutput.logp_bt`` is ``log softmax(z / τ)`` at each generated token under the sampling
distribution (renormalised over the allowed tokens when constrained); ``logp_unmasked_bt`` is the same without the
constraint (equal to ``logp_bt`` for a free row; NaN where a sparse decoder did not compute it).

The collectors' batching convention (:func:`batch_padding`): a batch is padded with dummy rows up to a bucket, so
that a run compiles a bounded number of programs; dummy replies are dropped.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from flax import struct

# The stop tokens of a chat reply with the Qwen tokenizer: <|im_end|> (end of turn) and <|endoftext|> (the
# agentjax.models.tokenizer ids IM_END_ID and ENDOFTEXT_ID); the collectors' default SamplingParams stop on them.
CHAT_STOP_IDS: tuple[int, ...] = (151_645, 151_643)


class Finish(enum.IntEnum):
    """Why a row stopped (``finish_b``)."""

    RUNNING = 0  # only inside the loop
    STOP_TOKEN = 1  # sampled one of ``stop_token_ids`` (kept as the last token)
    STOP_STRING = 2  # its text contains a stop string (the completing token is the last one kept)
    LENGTH = 3  # reached its ``max_new_tokens``


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature = 0`` is greedy (then ``top_k`` / ``top_p`` are irrelevant).

    Attributes:
      temperature: τ > 0, or 0 for greedy.
      top_p: nucleus mass in (0, 1]; 1 disables.
      top_k: keep the k most likely tokens; 0 disables.
      max_new_tokens: the loop's static length; per-row limits below it go to ``generate``.
      stop_token_ids: ids that end a row (kept as the row's last token), e.g. ``<|im_end|>``, ``<|endoftext|>``.
      stop_strings: texts that end a row (needs a tokenizer); the completing token is kept.
      check_every: decode steps between host checks for stop strings.
      prompt_bucket: prompt slots are rounded up to a multiple of this.
    """

    temperature: float | int = 1.0
    top_p: float | int = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    check_every: int = 16
    prompt_bucket: int = 64

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_new_tokens <= 0 or self.check_every <= 0 or self.prompt_bucket <= 0:
            raise ValueError("top_k must be >= 0 and max_new_tokens, check_every, prompt_bucket > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@struct.dataclass(frozen=True)
class SampleOutput:
    """What ``generate`` returns (host NumPy arrays; positions past ``length_b`` are zero)."""

    tokens_bt: np.ndarray  # [B, T] int32: generated tokens
    logp_bt: np.ndarray  # [B, T] float32: log-prob under the (masked) sampling distribution at τ
    logp_unmasked_bt: np.ndarray  # [B, T] float32: log-prob without the constraint mask
    length_b: np.ndarray  # [B] int32: tokens generated (stop token included)
    finish_b: np.ndarray  # [B] int32: a :class:`Finish`
    texts: list[str] | None  # decoded responses (without the stop token) when a tokenizer is given


Allowed = Sequence[Sequence[Sequence[int]]]  # per row, the token sequences it may emit (module docstring)


@runtime_checkable
class Tokenizer(Protocol):
    """What the collectors use of a tokenizer (a ``transformers`` tokenizer, the word-level one, a test double)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class Policy(Protocol):
    """A policy the collectors can call (module docstring)."""

    tokenizer: Tokenizer

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, key: Any, *,
                 max_new_tokens: Sequence[int] | np.ndarray | None = None, allowed: Allowed | None = None,
                 max_trie_edges: int = ..., row_keys: Any = None, sparse: bool = False,
                 dense_draws: bool = False) -> SampleOutput:
        """One response per prompt (token ids, any lengths). ``max_new_tokens``: per-row limits up to
        ``params.max_new_tokens``. ``allowed``: generation under constraints (module docstring). ``row_keys``:
        ``[B]`` PRNG keys, one sampling stream per row instead of ``key``. ``sparse``: constrained decoding from the
        allowed tokens' logits only (the same distribution); ``dense_draws``: with ``sparse``, the dense path's
        random numbers (the same samples)."""


@runtime_checkable
class Chooser(Protocol):
    """A policy that can also choose among whole answers in one teacher-forced pass (module docstring)."""

    def choose(self, prompts: Sequence[Sequence[int]], allowed: Sequence[Sequence[str]], params: SamplingParams,
               key: Any) -> SampleOutput: ...


def constrained_choices(replies: Sequence[Sequence[int]], stop_ids: Sequence[int],
                        response: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The tokens the constrained decoder allowed at each position of ``response`` (sorted): the next tokens of
    the ``replies`` (token sequences) that agree with the prefix, plus ``stop_ids`` where one of them is complete
    (module docstring). Raises if ``response`` leaves the replies (a decoder bug, never expected)."""
    out = []
    live = [list(r) for r in replies]
    stops = set(int(t) for t in stop_ids)
    for j, token in enumerate(int(t) for t in response):
        choices = {r[j] for r in live if len(r) > j}
        if any(len(r) == j for r in live):
            choices |= stops
        if token not in choices:
            raise ValueError(f"constrained_choices: token {token} at position {j} is none of the allowed "
                             f"{sorted(choices)}: the response was not decoded under these replies")
        out.append(tuple(sorted(choices)))
        live = [r for r in live if len(r) > j and r[j] == token]
    return tuple(out)


def batch_padding(rows: int, bucket: int, *, pow2: bool = False) -> int:
    """Dummy rows to add to a batch of ``rows``: up to a multiple of ``bucket``, or with ``pow2`` up to the next
    power of two ≥ ``bucket`` (log₂(rows) batch shapes to compile instead of rows / bucket: at 128 eval episodes,
    5 instead of 16)."""
    if not pow2:
        return -rows % bucket
    size = bucket
    while size < rows:
        size *= 2
    return size - rows


__all__ = [
    "CHAT_STOP_IDS",
    "Allowed",
    "Chooser",
    "Finish",
    "Policy",
    "SampleOutput",
    "SamplingParams",
    "Tokenizer",
    "batch_padding",
    "constrained_choices",
]

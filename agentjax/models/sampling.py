"""What a sampler takes and returns: :class:`SamplingParams` in, :class:`SampleOutput` (with a :class:`Finish` per
row) out, and the left-padded prompt layout that its prefill reads (:func:`left_pad`).

Both ways of decoding share them: the decode loop (:mod:`agentjax.models.sampler`) and the one-pass choice among
whole answers (:mod:`agentjax.models.choose`), which the sampler calls.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

import numpy as np
from flax import struct


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


def left_pad(prompts: Sequence[Sequence[int]], bucket: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-pads token lists to a multiple of ``bucket`` slots: ``(tokens [B, Lp], segment [B, Lp])``."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    lp = -(-max(len(p) for p in prompts) // bucket) * bucket
    tokens = np.full((len(prompts), lp), pad_id, np.int32)
    segment = np.zeros((len(prompts), lp), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, lp - len(p):] = p
        segment[i, lp - len(p):] = 1
    return tokens, segment


__all__ = ["Finish", "SampleOutput", "SamplingParams", "left_pad"]

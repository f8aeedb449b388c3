"""What a sampler takes and returns, and the prompt layout its prefill reads.

:class:`SamplingParams` in, :class:`SampleOutput` (with a :class:`Finish` per row) out: the types of the policy
protocol that the collectors define (:mod:`agentjax.rollout.policy`), which the sampler implements; and
:func:`left_pad`, the left-padded prompt layout of the prefill.

Both ways of decoding share them: the decode loop (:mod:`agentjax.models.sampler`) and the one-pass choice among
whole answers (:mod:`agentjax.models.choose`), which the sampler calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentjax.rollout.policy import Finish, SampleOutput, SamplingParams, batch_padding


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


__all__ = ["Finish", "SampleOutput", "SamplingParams", "batch_padding", "left_pad"]

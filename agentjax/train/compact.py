"""Host-side row compaction before the jitted update: the same real tokens in fewer slots (``compact_rows``)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from agentjax.rollout.batch import StepBatch

COMPACT_BUCKET = 64  # compact_rows: prompt widths and shared prefixes in multiples of this (bounded compiles)
TREE_COMPACT_BUCKET = 256  # the bucket of tree batches: node prompts vary in length, so coarse widths (fewer compiles)


def compact_rows(batch: StepBatch, bucket: int = COMPACT_BUCKET) -> tuple[StepBatch, np.ndarray | None]:
    """Host side, before the jitted update: ``(batch', prefix_p)`` with the same real tokens in fewer slots.

    The prompts of the real rows are left-padded (the collector's layout) and, in a multi-turn batch, open with
    the same text (system prompt, rules). ``prefix_p`` is their longest common prefix, cut to a multiple of
    ``bucket`` tokens and short of every prompt by at least one token (``None`` below ``bucket``), which the
    decoder then runs once for all rows (:meth:`agentjax.models.qwen.Qwen.decode`'s ``prefix_p``); ``batch'``
    keeps the last ``W'`` prompt slots, ``W'`` the longest remaining prompt rounded up to ``bucket``, with the
    prefix's slots masked out. Masked slots contribute exact zeros and positions count real tokens, so the loss,
    gradients and log-probs are the same up to float rounding (summation order), at ``W' + Lr`` slots a row
    instead of ``Lp + Lr``. The tiny preset (Sokoban, verl-agent prompts of 402-515 tokens in 640 slots, 256
    shared): 330 slots a row instead of 650. Rows whose prompt mask is not one block ending at the last slot
    (not the collector's layout) leave the batch as it is; padding rows never matter."""
    mask = np.asarray(batch.prompt_mask)
    real = np.asarray(batch.row_mask)
    width = mask.shape[1]
    if not real.any():
        return batch, None
    lens = mask.sum(1)
    slot = np.arange(width)
    if not (mask[real] == (slot[None, :] >= width - lens[real, None])).all():
        return batch, None
    tokens = np.asarray(batch.prompt_tokens)
    lens_r = lens[real]
    shortest = int(lens_r.min())
    prefix_len = 0
    if shortest > bucket:  # the real rows' common prefix: prompt token j of row b sits at width - len_b + j
        head = np.take_along_axis(tokens[real], (width - lens_r)[:, None] + np.arange(shortest - 1)[None, :], 1)
        differs = np.nonzero((head != head[:1]).any(0))[0]
        common = int(differs[0]) if len(differs) else shortest - 1
        prefix_len = common // bucket * bucket
    keep = min(width, -(-(int(lens_r.max()) - prefix_len) // bucket) * bucket)
    if keep == width and not prefix_len:
        return batch, None
    new_mask = mask[:, width - keep:] & (slot[None, width - keep:] >= (width - lens + prefix_len)[:, None])
    prefix_p = head[0, :prefix_len].astype(np.int32) if prefix_len else None
    return batch.replace(prompt_tokens=jnp.asarray(tokens[:, width - keep:]), prompt_mask=jnp.asarray(new_mask)), \
        prefix_p


__all__ = ["COMPACT_BUCKET", "TREE_COMPACT_BUCKET", "compact_rows"]

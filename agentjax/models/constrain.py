"""Constrained decoding: each row may only emit one of its allowed token sequences, via a token trie.

Row ``b`` of a batch comes with a list of allowed strings, given as their token sequences (the tokenisations).
On the host, :func:`build_trie` merges each row's sequences into a trie: node 0 is the root, every edge
``parent --token--> child`` extends a prefix by one token, and a node is *terminal* where a full allowed
sequence ends. A terminal node may also have children (an allowed sequence that is a prefix of another).
The tries of all rows are stored as fixed-capacity edge arrays (``E`` edge slots, ``Q = E + 1`` node slots;
padding edges have parent ``-1``), so that the jittable functions below compile once per capacity.

Decoding with the trie, per step, for the current node ``node_b`` of each row:

    allowed(b, v) = [v is the token of an edge out of node_b]  ∨  [node_b terminal ∧ v ∈ stop_ids]
    sample v_b ~ softmax(mask_logits(logits_b, allowed_b)),      node_b ← advance(node_b, v_b)

so a row that stops has emitted exactly one of its allowed sequences. Rows with an empty list of allowed
strings are *inactive*: unconstrained, every token allowed, their node stays at the root. A token that is not
an edge out of the node (a stop token, or a token the mask did not allow) moves the row to :data:`NO_NODE`,
where only the stop ids are allowed, so a finished row keeps a well-defined distribution (it can only emit
stop / padding tokens) until the decode loop drops it.

Layout letters (:mod:`agentjax.layout`): B batch, E trie edge, Q trie node, V vocabulary; ``Vs`` is the
number of stop ids (a subset of the vocabulary).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

NO_NODE = -1  # node of a row that left its trie (after a stop token); parent of padding edges


@flax.struct.dataclass(frozen=True)
class TokenTrie:
    """The allowed-sequence tries of a batch of rows, as padded edge lists (built by :func:`build_trie`).

    Real edges of a row occupy slots ``0 .. n_b - 1``; the child of edge ``e`` is node ``e + 1`` (nodes are
    numbered in order of creation, the root is node 0), so ``Q = E + 1`` node slots always suffice.
    """

    parent_be: Int[Array, "B E"]  # [B, E] int32, parent node of the edge (NO_NODE = -1: padding edge)
    token_be: Int[Array, "B E"]  # [B, E] int32, token id on the edge (-1: padding edge)
    child_be: Int[Array, "B E"]  # [B, E] int32, child node of the edge (-1: padding edge)
    terminal_bq: Bool[Array, "B Q"]  # [B, Q] bool, a full allowed sequence ends at the node
    active_b: Bool[Array, " B"]  # [B] bool, the row is constrained (False: empty allowed list, every token ok)

    @property
    def num_rows(self) -> int:
        return self.active_b.shape[0]

    @property
    def edge_capacity(self) -> int:
        return self.parent_be.shape[1]

    @property
    def node_capacity(self) -> int:
        return self.terminal_bq.shape[1]


# ----------------------------------------------------------------------------------------------- host side


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def build_trie(
    allowed: Sequence[Sequence[Sequence[int]]],
    *,
    max_edges: int | None = None,
    vocab_size: int | None = None,
) -> TokenTrie:
    """Build the per-row tries of the allowed token sequences (plain Python / NumPy, not jittable).

    Args:
      allowed: for each row ``b``, the token sequences it may emit (the tokenisations of its allowed
        strings). Duplicates are merged; a sequence may be a prefix of another. An empty list makes the row
        inactive (unconstrained). An empty sequence is an error (it would allow stopping at once; encode
        the stop token's meaning explicitly instead).
      max_edges: the most edges any row may need. The edge capacity ``E`` is ``max_edges`` rounded up to a
        power of two (default: the largest row's edge count rounded up), so that jitted decode steps
        compile once for batches of similar size. A row that needs more than ``max_edges`` edges is an error.
      vocab_size: if given, every token id must lie in ``[0, vocab_size)`` (checked here: out-of-range ids
        would be dropped silently by :func:`allowed_tokens`).

    Returns:
      A :class:`TokenTrie` with ``E`` edge and ``Q = E + 1`` node slots.
    """
    if isinstance(allowed, str | bytes):
        raise TypeError("build_trie: `allowed` must be a list of rows, each a list of token sequences")
    if max_edges is not None and max_edges < 1:
        raise ValueError(f"build_trie: max_edges must be >= 1, got {max_edges}")
    rows: list[tuple[list[tuple[int, int]], set[int]]] = []  # per row: edges (parent, token), terminal nodes
    for b, sequences in enumerate(allowed):
        if isinstance(sequences, str | bytes):
            raise TypeError(f"build_trie: row {b} is a string, expected a list of token sequences")
        children: dict[tuple[int, int], int] = {}
        edges: list[tuple[int, int]] = []
        terminal: set[int] = set()
        for i, seq in enumerate(sequences):
            if isinstance(seq, str | bytes):
                raise TypeError(f"build_trie: row {b}, sequence {i} is a string; pass its token ids")
            tokens = [operator.index(t) for t in seq]
            if not tokens:
                raise ValueError(f"build_trie: row {b}, sequence {i} is empty; every allowed sequence needs at "
                                 "least one token (an empty string tokenises to nothing)")
            bad = [t for t in tokens if t < 0 or (vocab_size is not None and t >= vocab_size)]
            if bad:
                raise ValueError(f"build_trie: row {b}, sequence {i} has token ids {bad} outside "
                                 f"[0, {'vocab_size' if vocab_size is None else vocab_size})")
            node = 0
            for t in tokens:
                child = children.get((node, t))
                if child is None:
                    edges.append((node, t))
                    child = children[(node, t)] = len(edges)
                node = child
            terminal.add(node)
        rows.append((edges, terminal))

    needed = max((len(edges) for edges, _ in rows), default=0)
    if max_edges is not None and needed > max_edges:
        worst = max(range(len(rows)), key=lambda b: len(rows[b][0]))
        raise ValueError(f"build_trie: row {worst} needs {needed} trie edges, more than max_edges={max_edges}; "
                         "raise max_edges or allow fewer / shorter sequences")
    capacity = _next_pow2(max(1, needed if max_edges is None else max_edges))
    num_rows = len(rows)
    parent_be = np.full((num_rows, capacity), NO_NODE, np.int32)
    token_be = np.full((num_rows, capacity), -1, np.int32)
    child_be = np.full((num_rows, capacity), -1, np.int32)
    terminal_bq = np.zeros((num_rows, capacity + 1), bool)
    for b, (edges, terminal) in enumerate(rows):
        n = len(edges)
        if n:
            parent_be[b, :n], token_be[b, :n] = np.asarray(edges, np.int32).T
            child_be[b, :n] = np.arange(1, n + 1, dtype=np.int32)
        terminal_bq[b, sorted(terminal)] = True
    active_b = np.array([len(edges) > 0 for edges, _ in rows], bool)
    return TokenTrie(
        parent_be=jnp.asarray(parent_be), token_be=jnp.asarray(token_be), child_be=jnp.asarray(child_be),
        terminal_bq=jnp.asarray(terminal_bq), active_b=jnp.asarray(active_b),
    )


@runtime_checkable
class TokenEncoder(Protocol):
    """Anything with a Hugging Face–style ``encode`` (a ``transformers`` tokenizer, a test double)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def build_trie_from_strings(
    tokenizer: TokenEncoder,
    allowed_strings_per_row: Sequence[Sequence[str]],
    *,
    max_edges: int | None = None,
    vocab_size: int | None = None,
) -> TokenTrie:
    """:func:`build_trie` of ``tokenizer.encode(s, add_special_tokens=False)`` for every allowed string ``s``.

    The constraint is on this one tokenisation of each string: the model may not reach the same text through
    a different split into tokens. An empty row is inactive; a string that encodes to no tokens is an error.
    """
    if isinstance(allowed_strings_per_row, str):
        raise TypeError("build_trie_from_strings: expected a list of rows, each a list of strings")
    allowed = []
    for b, strings in enumerate(allowed_strings_per_row):
        if isinstance(strings, str):
            raise TypeError(f"build_trie_from_strings: row {b} is a string, expected a list of strings")
        row = []
        for s in strings:
            ids = list(tokenizer.encode(s, add_special_tokens=False))
            if not ids:
                raise ValueError(f"build_trie_from_strings: row {b}: {s!r} encodes to an empty token sequence")
            row.append(ids)
        allowed.append(row)
    return build_trie(allowed, max_edges=max_edges, vocab_size=vocab_size)


# ------------------------------------------------------------------------------------------ jittable kernels


def _live_edges_row(parent_e: Array, node: Array) -> Array:
    """[E] edges out of ``node`` (none when ``node`` is NO_NODE, although padding edges have parent -1)."""
    return (parent_e == node) & (node >= 0)


def _allowed_row(parent_e: Array, token_e: Array, node: Array, vocab_size: int) -> Array:
    """[V] tokens on the edges out of ``node``: a scatter of E edges into V slots (off-node edges dropped)."""
    slot_e = jnp.where(_live_edges_row(parent_e, node), token_e, vocab_size)
    return jnp.zeros((vocab_size,), bool).at[slot_e].set(True, mode="drop")


def _advance_row(parent_e: Array, token_e: Array, child_e: Array, node: Array, token: Array) -> Array:
    """The child of ``node`` along ``token``, NO_NODE if there is no such edge (at most one: a trie)."""
    match_e = _live_edges_row(parent_e, node) & (token_e == token)
    return jnp.max(jnp.where(match_e, child_e, NO_NODE), initial=NO_NODE)


def is_terminal(trie: TokenTrie, node_b: Int[Array, " B"]) -> Bool[Array, " B"]:
    """[B] the row may stop here: its node ends an allowed sequence (always True for inactive rows)."""
    chex.assert_equal_shape_prefix((trie.active_b, node_b), 1)
    node_b = node_b.astype(jnp.int32)
    safe_b = jnp.clip(node_b, 0, trie.node_capacity - 1)
    terminal_b = jnp.take_along_axis(trie.terminal_bq, safe_b[:, None], axis=1)[:, 0] & (node_b >= 0)
    return terminal_b | ~trie.active_b


def allowed_tokens(
    trie: TokenTrie, node_b: Int[Array, " B"], stop_ids: Int[Array, " Vs"], vocab_size: int
) -> Bool[Array, "B V"]:
    """[B, V] tokens each row may emit next from its node ``node_b`` (jittable; ``vocab_size`` static).

        allowed(b, v) = ¬active_b ∨ [∃ edge e of row b: parent = node_b, token = v]
                        ∨ [(terminal(node_b) ∨ node_b = NO_NODE) ∧ v ∈ stop_ids]

    Children come from a scatter of the row's ``E`` edges into ``V`` slots (no ``[B, Q, V]`` table). At
    :data:`NO_NODE` (the row already stopped) only the stop ids are allowed. At every node reachable from the
    root some token is allowed provided ``stop_ids`` is non-empty (each leaf of a trie is terminal).

    Args:
      trie: the batch's tries. node_b: [B] current node (0 at the start; :func:`advance` moves it).
      stop_ids: [Vs] token ids in [0, V) that end a sequence (EOS, end-of-turn, ...). vocab_size: V, static.
    """
    chex.assert_rank((node_b, stop_ids), 1)
    chex.assert_equal_shape_prefix((trie.active_b, node_b), 1)
    node_b = node_b.astype(jnp.int32)
    row_fn = functools.partial(_allowed_row, vocab_size=vocab_size)
    children_bv = jax.vmap(row_fn)(trie.parent_be, trie.token_be, node_b)
    stop_v = jnp.zeros((vocab_size,), bool).at[stop_ids].set(True, mode="drop")
    may_stop_b = is_terminal(trie, node_b) | (node_b == NO_NODE)
    return children_bv | (may_stop_b[:, None] & stop_v[None, :]) | ~trie.active_b[:, None]


def advance(trie: TokenTrie, node_b: Int[Array, " B"], token_b: Int[Array, " B"]) -> Int[Array, " B"]:
    """[B] the node reached from ``node_b`` by emitting ``token_b`` (jittable).

    The child along the token's edge if there is one; otherwise :data:`NO_NODE` (-1): the token was a stop
    token, or one the mask did not allow, and the row has left its trie (it stays at NO_NODE from then on).
    Inactive rows keep their node (the root). Callers that need "stopped legally" test
    ``is_terminal(trie, node_b) & isin(token_b, stop_ids)`` before advancing. A stop id that is also the token
    of an edge out of the node is followed as an ordinary token (keep stop ids out of the allowed sequences).
    """
    chex.assert_rank((node_b, token_b), 1)
    chex.assert_equal_shape((trie.active_b, node_b, token_b))
    node_b = node_b.astype(jnp.int32)
    child_b = jax.vmap(_advance_row)(trie.parent_be, trie.token_be, trie.child_be, node_b,
                                     token_b.astype(jnp.int32))
    return jnp.where(trie.active_b, child_b, node_b)


def allowed_ids(
    trie: TokenTrie, node_b: Int[Array, " B"], stop_ids: Int[Array, " Vs"], width: int
) -> tuple[Int[Array, "B A"], Bool[Array, "B A"]]:
    """The tokens each row may emit next, as ``width`` id slots (jittable): ``(ids_ba, ok_ba)``.

    The same set as :func:`allowed_tokens` for active rows (the tokens of the edges out of ``node_b``, in edge
    order, then the stop ids where the row may stop), without a ``[B, V]`` mask: for sampling from the allowed
    tokens' logits only. Slots past the set have ``ok = False`` (id 0). Inactive rows (no allowed list) get the
    stop ids only. A node with more than ``width − Vs`` children is cut (the caller sizes ``width``:
    :func:`max_branching`).
    """
    chex.assert_rank((node_b, stop_ids), 1)
    node_b = node_b.astype(jnp.int32)
    n_stop = stop_ids.shape[0]
    k = width - n_stop
    if k < 1:
        raise ValueError(f"allowed_ids: width {width} leaves no slot beside the {n_stop} stop ids")
    live_be = jax.vmap(_live_edges_row)(trie.parent_be, node_b) & trie.active_b[:, None]
    order_be = jnp.argsort(~live_be, axis=1, stable=True)[:, :k]  # live edges first, in edge order
    child_ok = jnp.take_along_axis(live_be, order_be, axis=1)
    child_ids = jnp.where(child_ok, jnp.take_along_axis(trie.token_be, order_be, axis=1), 0)
    may_stop_b = is_terminal(trie, node_b) | (node_b == NO_NODE)
    stop_ok = jnp.broadcast_to(may_stop_b[:, None], (node_b.shape[0], n_stop))
    stop_ids_b = jnp.broadcast_to(stop_ids[None, :], (node_b.shape[0], n_stop))
    return (jnp.concatenate([child_ids, stop_ids_b], 1).astype(jnp.int32),
            jnp.concatenate([child_ok, stop_ok], 1))


def max_branching(trie: TokenTrie) -> int:
    """The largest number of children of one node over the batch's tries (host side)."""
    parent = np.asarray(trie.parent_be)
    counts = [np.unique(row[row >= 0], return_counts=True)[1] for row in parent]
    return int(max((c.max() for c in counts if c.size), default=1))


# ------------------------------------------------------------------------------------------------- masking


def mask_logits(logits_bv: Float[Array, "B V"], allowed_bv: Bool[Array, "B V"]) -> Float[Array, "B V"]:
    """Logits with disallowed tokens set to ``finfo(dtype).min`` (finite, so no ``-inf − -inf`` NaNs).

    Apply any temperature before masking (dividing ``finfo.min`` by a temperature < 1 overflows to -inf).
    A row with no allowed token becomes constant, i.e. uniform after the softmax.
    """
    chex.assert_equal_shape((logits_bv, allowed_bv))
    return jnp.where(allowed_bv, logits_bv, jnp.array(jnp.finfo(logits_bv.dtype).min, logits_bv.dtype))


def masked_log_softmax(
    logits_bv: Float[Array, "B V"], allowed_bv: Bool[Array, "B V"]
) -> tuple[Float[Array, "B V"], Float[Array, "B V"]]:
    """``(logp_masked, logp_unmasked)``, both float32 [B, V], of the masked and the raw distributions.

        logp_masked(b, v)   = logits(b, v) − log Σ_{u allowed} exp logits(b, u)   for allowed v,
                              ≈ finfo(float32).min (finite)                        for disallowed v
        logp_unmasked(b, v) = log_softmax(logits_b)(v)

    ``logp_masked`` is the log-probability of a token sampled from ``mask_logits(logits, allowed)`` (the
    behaviour policy of a constrained sampler); ``logp_unmasked`` that of the unconstrained model. A row with
    no allowed token gets the uniform ``-log V`` in ``logp_masked`` (what sampling from its masked logits does).
    """
    chex.assert_equal_shape((logits_bv, allowed_bv))
    logits_bv = logits_bv.astype(jnp.float32)
    floor = jnp.finfo(jnp.float32).min
    logp_masked = jnp.maximum(jax.nn.log_softmax(mask_logits(logits_bv, allowed_bv), axis=-1), floor)
    return logp_masked, jax.nn.log_softmax(logits_bv, axis=-1)

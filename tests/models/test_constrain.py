"""Constrained decoding over a token trie: hand-checked tries, compilation, a decoding property test, errors."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentjax.models.constrain import (
    NO_NODE,
    TokenTrie,
    advance,
    allowed_tokens,
    build_trie,
    build_trie_from_strings,
    is_terminal,
    mask_logits,
    masked_log_softmax,
)

VOCAB = 10
STOP = jnp.array([0], jnp.int32)
HAND = [[[1, 2, 3], [1, 2, 4], [5]], [[7], [7, 8]], []]  # row 2 is inactive


def allowed_sets(trie: TokenTrie, node_b, stop_ids=STOP, vocab_size=VOCAB) -> list[set[int]]:
    allowed_bv = np.asarray(allowed_tokens(trie, jnp.asarray(node_b, jnp.int32), stop_ids, vocab_size))
    return [set(np.flatnonzero(row).tolist()) for row in allowed_bv]


def reference_allowed(sequences: list[list[int]], prefix: list[int], stops: set[int], vocab: int) -> set[int]:
    """Brute force: next tokens of the allowed sequences that extend ``prefix``, stops if ``prefix`` is one."""
    if not sequences:
        return set(range(vocab))
    n = len(prefix)
    nxt = {s[n] for s in sequences if len(s) > n and list(s[:n]) == prefix}
    return nxt | (stops if any(list(s) == prefix for s in sequences) else set())


# ------------------------------------------------------------------------------------------- hand-checked


def test_build_trie_layout():
    trie = build_trie(HAND)
    assert (trie.num_rows, trie.edge_capacity, trie.node_capacity) == (3, 8, 9)  # 5 edges -> 8 slots
    np.testing.assert_array_equal(trie.parent_be[0], [0, 1, 2, 2, 0, -1, -1, -1])
    np.testing.assert_array_equal(trie.token_be[0], [1, 2, 3, 4, 5, -1, -1, -1])
    np.testing.assert_array_equal(trie.child_be[0], [1, 2, 3, 4, 5, -1, -1, -1])
    np.testing.assert_array_equal(trie.parent_be[1], [0, 1, -1, -1, -1, -1, -1, -1])
    np.testing.assert_array_equal(trie.parent_be[2], [-1] * 8)
    np.testing.assert_array_equal(np.flatnonzero(trie.terminal_bq[0]), [3, 4, 5])
    np.testing.assert_array_equal(np.flatnonzero(trie.terminal_bq[1]), [1, 2])
    np.testing.assert_array_equal(trie.active_b, [True, True, False])
    assert trie.parent_be.dtype == jnp.int32 and trie.terminal_bq.dtype == jnp.bool_


def test_hand_checked_walk():
    trie = build_trie(HAND)
    everything = set(range(VOCAB))
    node = jnp.zeros(3, jnp.int32)
    assert allowed_sets(trie, node) == [{1, 5}, {7}, everything]
    np.testing.assert_array_equal(is_terminal(trie, node), [False, False, True])

    node = advance(trie, node, jnp.array([1, 7, 3]))
    np.testing.assert_array_equal(node, [1, 1, 0])  # the inactive row stays at the root
    assert allowed_sets(trie, node) == [{2}, {8, 0}, everything]  # "7" is complete and a prefix of "7 8"
    np.testing.assert_array_equal(is_terminal(trie, node), [False, True, True])

    node = advance(trie, node, jnp.array([2, 8, 9]))
    np.testing.assert_array_equal(node, [2, 2, 0])
    assert allowed_sets(trie, node) == [{3, 4}, {0}, everything]

    node = advance(trie, node, jnp.array([4, 0, 0]))  # row 1 stops legally
    np.testing.assert_array_equal(node, [4, NO_NODE, 0])
    assert allowed_sets(trie, node) == [{0}, {0}, everything]  # a leaf allows only the stop; so does NO_NODE

    node = advance(trie, node, jnp.array([0, 0, 0]))
    np.testing.assert_array_equal(node, [NO_NODE, NO_NODE, 0])  # NO_NODE is absorbing
    np.testing.assert_array_equal(is_terminal(trie, node), [False, False, True])


def test_single_token_string_and_off_trie_token():
    trie = build_trie(HAND)
    node = advance(trie, jnp.zeros(3, jnp.int32), jnp.array([5, 9, 5]))  # 9 is not allowed in row 1
    np.testing.assert_array_equal(node, [5, NO_NODE, 0])
    assert allowed_sets(trie, node)[:2] == [{0}, {0}]  # "5" done; the off-trie row can only stop


def test_duplicates_prefixes_and_several_stop_ids():
    trie = build_trie([[[4, 4], [4, 4], [4], [4, 4]]])
    assert trie.edge_capacity == 2
    np.testing.assert_array_equal(np.flatnonzero(trie.terminal_bq[0]), [1, 2])
    stops = jnp.array([0, 9], jnp.int32)
    assert allowed_sets(trie, [0], stops) == [{4}]
    assert allowed_sets(trie, [1], stops) == [{4, 0, 9}]
    assert allowed_sets(trie, [2], stops) == [{0, 9}]
    assert allowed_sets(trie, [1], jnp.zeros((0,), jnp.int32)) == [{4}]  # no stop ids: only the child


def test_capacity_is_rounded_to_a_power_of_two():
    assert build_trie([[[1, 2, 3]]]).edge_capacity == 4
    assert build_trie([[[1, 2, 3]]], max_edges=5).edge_capacity == 8
    assert build_trie([[[1]]], max_edges=64).edge_capacity == 64
    assert build_trie([[], []]).edge_capacity == 1  # all rows inactive: one padding edge
    np.testing.assert_array_equal(build_trie([[], []]).active_b, [False, False])


def test_mask_logits_and_log_softmax():
    logits = jnp.array([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]])
    allowed = jnp.array([[True, False, True, False], [False, False, False, False]])
    masked = mask_logits(logits, allowed)
    chex.assert_tree_all_finite(masked)
    np.testing.assert_array_equal(masked[0, [0, 2]], [1.0, 3.0])
    assert float(masked[0, 1]) == float(jnp.finfo(jnp.float32).min)
    logp_m, logp_u = masked_log_softmax(logits, allowed)
    chex.assert_tree_all_finite((logp_m, logp_u))
    np.testing.assert_allclose(logp_m[0, [0, 2]], [1 - np.logaddexp(1, 3), 3 - np.logaddexp(1, 3)], rtol=1e-6)
    assert float(logp_m[0, 1]) < -1e37
    np.testing.assert_allclose(logp_m[1], np.full(4, -np.log(4)), rtol=1e-6)  # no allowed token: uniform
    np.testing.assert_allclose(logp_u, jax.nn.log_softmax(logits, axis=-1), rtol=1e-6)

    half = mask_logits(logits.astype(jnp.bfloat16), allowed)
    assert half.dtype == jnp.bfloat16 and bool(jnp.isfinite(half).all())
    logp_m, logp_u = masked_log_softmax(logits.astype(jnp.bfloat16), allowed)
    assert logp_m.dtype == logp_u.dtype == jnp.float32
    chex.assert_tree_all_finite((logp_m, logp_u))


# ----------------------------------------------------------------------------------------- jit / tracing


def test_jit_agrees_and_compiles_once():
    allowed_jit = jax.jit(chex.assert_max_traces(allowed_tokens, n=1), static_argnames="vocab_size")
    advance_jit = jax.jit(chex.assert_max_traces(advance, n=1))
    other = [[[9, 9, 9, 9, 9]], [[3], [4], [5, 6]], [[1, 1]]]  # different tries, same capacity (8)
    for rows in (HAND, other):
        trie = build_trie(rows, max_edges=8)
        node = jnp.zeros(3, jnp.int32)
        for tokens in ([1, 7, 3], [2, 8, 9], [4, 0, 0], [0, 0, 0]):
            token = jnp.array(tokens, jnp.int32)
            np.testing.assert_array_equal(allowed_jit(trie, node, STOP, vocab_size=VOCAB),
                                          allowed_tokens(trie, node, STOP, VOCAB))
            nxt = advance_jit(trie, node, token)
            np.testing.assert_array_equal(nxt, advance(trie, node, token))
            node = nxt


# -------------------------------------------------------------------------------------- decoding property

PROP_VOCAB, PROP_STOPS, PROP_ROWS, PROP_MAX_LEN = 50, (0, 1), 4, 6
PROP_MAX_EDGES = 8 * PROP_MAX_LEN  # every row fits: capacity 64 for every example -> one compile


@jax.jit
@chex.assert_max_traces(n=1)
def decode_step(trie, node_b, key, stop_ids):
    """One constrained sampling step from random logits; returns what the checks need."""
    key_logits, key_sample = jax.random.split(key)
    logits_bv = 4.0 * jax.random.normal(key_logits, (node_b.shape[0], PROP_VOCAB))
    allowed_bv = allowed_tokens(trie, node_b, stop_ids, PROP_VOCAB)
    token_b = jax.random.categorical(key_sample, mask_logits(logits_bv, allowed_bv), axis=-1).astype(jnp.int32)
    logp_masked, logp_unmasked = masked_log_softmax(logits_bv, allowed_bv)
    return advance(trie, node_b, token_b), token_b, logits_bv, allowed_bv, logp_masked, logp_unmasked


sequence_st = st.lists(st.integers(len(PROP_STOPS), PROP_VOCAB - 1), min_size=1, max_size=PROP_MAX_LEN)
rows_st = st.lists(st.lists(sequence_st, min_size=0, max_size=8), min_size=1, max_size=PROP_ROWS)


@settings(max_examples=40, deadline=None)
@given(rows=rows_st, seed=st.integers(0, 2**31 - 1))
def test_decoding_emits_exactly_an_allowed_sequence(rows, seed):
    padded = rows + [[]] * (PROP_ROWS - len(rows))  # pad the batch with inactive rows: fixed shapes
    trie = build_trie(padded, max_edges=PROP_MAX_EDGES)
    stops = set(PROP_STOPS)
    stop_ids = jnp.array(PROP_STOPS, jnp.int32)
    node = jnp.zeros(PROP_ROWS, jnp.int32)
    key = jax.random.key(seed)
    emitted: list[list[int]] = [[] for _ in rows]
    done = [False] * len(rows)
    for _ in range(PROP_MAX_LEN + 1):  # a leaf is reached after <= PROP_MAX_LEN tokens; then it must stop
        key, step_key = jax.random.split(key)
        node, token, logits, allowed, logp_m, logp_u = decode_step(trie, node, step_key, stop_ids)
        # float32 log-softmax of logits up to ~20 in size: an ulp there is ~2e-6
        np.testing.assert_allclose(logp_u, jax.nn.log_softmax(logits, axis=-1), rtol=1e-6, atol=1e-5)
        token, allowed, logp_m = np.asarray(token), np.asarray(allowed), np.asarray(logp_m)
        for b, sequences in enumerate(rows):
            if done[b]:
                continue
            expected = reference_allowed(sequences, emitted[b], stops, PROP_VOCAB)
            assert set(np.flatnonzero(allowed[b]).tolist()) == expected
            assert int(token[b]) in expected, "sampled a disallowed token"
            np.testing.assert_allclose(jax.nn.logsumexp(logp_m[b][allowed[b]]), 0.0, atol=1e-5)
            assert np.isfinite(logp_m[b]).all()
            if sequences and int(token[b]) in stops:
                done[b] = True
                assert emitted[b] in [list(s) for s in sequences]
            else:
                emitted[b].append(int(token[b]))
    assert all(done[b] for b, sequences in enumerate(rows) if sequences), "a constrained row never stopped"


# ------------------------------------------------------------------------------------------------- errors


def test_errors_are_clear():
    with pytest.raises(ValueError, match=r"row 1, sequence 0 is empty"):
        build_trie([[[1]], [[], [2]]])
    with pytest.raises(ValueError, match=r"row 0 needs 5 trie edges, more than max_edges=4"):
        build_trie(HAND, max_edges=4)
    with pytest.raises(ValueError, match=r"token ids \[12\] outside \[0, 10\)"):
        build_trie([[[1, 12]]], vocab_size=10)
    with pytest.raises(ValueError, match="outside"):
        build_trie([[[-3]]])
    with pytest.raises(TypeError):  # a string is not a list of token sequences (our check or beartype's)
        build_trie(["abc"])


class CharTokenizer:
    """A test double with the Hugging Face ``encode`` signature: one token per character."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert not add_special_tokens
        return [ord(c) - ord("a") + 2 for c in text]


def test_build_trie_from_strings():
    trie = build_trie_from_strings(CharTokenizer(), [["ab", "abc", "b"], []])
    direct = build_trie([[[2, 3], [2, 3, 4], [3]], []])
    chex.assert_trees_all_equal(trie, direct)
    with pytest.raises(ValueError, match=r"row 0: '' encodes to an empty token sequence"):
        build_trie_from_strings(CharTokenizer(), [["a", ""]])
    with pytest.raises(TypeError):
        build_trie_from_strings(CharTokenizer(), ["ab"])

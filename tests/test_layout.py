"""Sequence permutations: the vectors from MaxText/TransformerEngine/Striped Attention, and inverses."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfix import reorder_sequence
from shardfix.jit.layout import inverse_permutation, sequence_permutation, zigzag_chunk_order


def test_zigzag_vectors():
    assert list(reorder_sequence(np.arange(16), 2, seq_dim=0)) == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    assert list(reorder_sequence(np.arange(16), 4, seq_dim=0)) == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    assert list(zigzag_chunk_order(2)) == [0, 3, 1, 2]
    assert list(inverse_permutation(zigzag_chunk_order(2))) == [0, 2, 3, 1]
    assert list(inverse_permutation(zigzag_chunk_order(4))) == [0, 2, 4, 6, 7, 5, 3, 1]


def test_striped_vector():
    out = reorder_sequence(np.arange(16), 4, seq_dim=0, strategy="striped")
    assert list(out) == [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]


def test_odd_cp_and_maxtext_signature():
    x = np.arange(2 * 12 * 3).reshape(2, 12, 3)
    out = reorder_sequence(x, 3)  # seq_dim=1 by default, as in MaxText
    assert list(out[0, :, 0] // 3) == [0, 1, 10, 11, 2, 3, 8, 9, 4, 5, 6, 7]
    np.testing.assert_array_equal(reorder_sequence(out, 3, to_contiguous=True), x)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 3), st.sampled_from(["zigzag", "striped"]),
       st.integers(0, 2))
def test_round_trip_and_agreement_with_index_math(cp, stripe, reps, strategy, seq_dim):
    length = (2 * cp if strategy == "zigzag" else cp * stripe) * reps
    shape = [2, 3, 2]
    shape[seq_dim] = length
    x = np.arange(np.prod(shape)).reshape(shape)
    out = np.asarray(reorder_sequence(x, cp, seq_dim, strategy=strategy, stripe=stripe))
    np.testing.assert_array_equal(out, np.take(x, sequence_permutation(length, cp, strategy, stripe), axis=seq_dim))
    back = reorder_sequence(out, cp, seq_dim, to_contiguous=True, strategy=strategy, stripe=stripe)
    np.testing.assert_array_equal(np.asarray(back), x)


@pytest.mark.parametrize("length, cp, strategy, message", [
    (10, 4, "zigzag", "multiple of 2\\*cp = 8, got 10"),
    (10, 4, "striped", "multiple of cp\\*stripe = 4, got 10"),
    (8, 2, "spiral", "unknown strategy 'spiral'"),
])
def test_preconditions(length, cp, strategy, message):
    with pytest.raises(ValueError, match=message):
        reorder_sequence(np.arange(length), cp, seq_dim=0, strategy=strategy)

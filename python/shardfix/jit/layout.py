"""Load-balanced sequence orders for causal ring attention, the JAX layer's helper for user code: index math in
numpy, `reorder_sequence` in jnp.

A permutation is given as `src`: position j of the reordered sequence holds token `src[j]` of the original.
  zigzag   2*cp chunks; device r gets chunks (r, 2*cp-1-r) (MaxText, TransformerEngine DualChunkSwap, PyTorch
           head-tail, ejkernel). Needs S % (2*cp) == 0.
  striped  stripes of `stripe` tokens dealt round-robin to the cp devices (Striped Attention). Needs
           S % (cp*stripe) == 0.
"""

from __future__ import annotations

import numpy as np

STRATEGIES = ("zigzag", "striped")


def zigzag_chunk_order(cp: int) -> np.ndarray:
    """Chunk `order[j]` goes to chunk position j: [0, 2cp-1, 1, 2cp-2, ...]."""
    if cp < 1:
        raise ValueError(f"cp must be positive, got {cp}")
    order = np.empty(2 * cp, dtype=np.int64)
    order[0::2] = np.arange(cp)
    order[1::2] = 2 * cp - 1 - np.arange(cp)
    return order


def check_divisible(length: int, cp: int, strategy: str = "zigzag", stripe: int = 1) -> None:
    """ValueError saying why `length` tokens can't be put in `strategy` order over `cp` devices."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy '{strategy}' (expected zigzag or striped)")
    if cp < 1 or stripe < 1:
        raise ValueError(f"cp and stripe must be positive, got cp={cp}, stripe={stripe}")
    unit = 2 * cp if strategy == "zigzag" else cp * stripe
    if length % unit:
        what = "2*cp" if strategy == "zigzag" else "cp*stripe"
        raise ValueError(f"{strategy} needs the sequence length to be a multiple of {what} = {unit}, got {length}")


def sequence_permutation(length: int, cp: int, strategy: str = "zigzag", stripe: int = 1) -> np.ndarray:
    """`src` for reordering a contiguous sequence of `length` tokens into `strategy` order."""
    check_divisible(length, cp, strategy, stripe)
    tokens = np.arange(length)
    if strategy == "zigzag":
        return tokens.reshape(2 * cp, -1)[zigzag_chunk_order(cp)].reshape(-1)
    return tokens.reshape(-1, cp, stripe).transpose(1, 0, 2).reshape(-1)


def inverse_permutation(src: np.ndarray) -> np.ndarray:
    inv = np.empty_like(src)
    inv[src] = np.arange(len(src))
    return inv


def reorder_sequence(x, cp_size: int, seq_dim: int = 1, to_contiguous: bool = False, *, strategy: str = "zigzag",
                     stripe: int = 1):
    """Put dim `seq_dim` of `x` into load-balanced order (or, with `to_contiguous`, back into contiguous order).

    Same order and signature as MaxText's and ejkernel's `reorder_sequence` for zigzag; odd `cp_size` works too.
    """
    import jax.numpy as jnp

    x = jnp.asarray(x)
    seq_dim = seq_dim % x.ndim
    length = x.shape[seq_dim]
    check_divisible(length, cp_size, strategy, stripe)
    if strategy == "zigzag":
        order = zigzag_chunk_order(cp_size)
        if to_contiguous:
            order = inverse_permutation(order)
        chunks = x.reshape(x.shape[:seq_dim] + (2 * cp_size, length // (2 * cp_size)) + x.shape[seq_dim + 1:])
        return jnp.take(chunks, jnp.asarray(order), axis=seq_dim).reshape(x.shape)
    stripes = (length // (cp_size * stripe), cp_size)
    if to_contiguous:
        stripes = stripes[::-1]
    split = x.reshape(x.shape[:seq_dim] + stripes + (stripe,) + x.shape[seq_dim + 1:])
    return jnp.swapaxes(split, seq_dim, seq_dim + 1).reshape(x.shape)

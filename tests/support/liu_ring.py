"""Liu et al.'s RingAttention (PyPI `ringattention` 0.1.2, a test-only client), called as its authors call it in
LWM: `ring_attention` under shard_map over the sequence axis, causal (causal_block_size=1), with or without
segment ids (replicated along the sequence, as LWM passes them; the kernel slices them by global chunk position).

The package's __init__ picks a Pallas variant through `jax.lib.xla_bridge`, which JAX 0.10+ no longer has; the
kernel module itself (`ringattention/ringattention_jax.py`) is loaded from the installed package as it is.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

B, S, H, D = 2, 64, 2, 8


@functools.cache
def kernel_module():
    package = importlib.util.find_spec("ringattention")
    path = os.path.join(package.submodule_search_locations[0], "ringattention_jax.py")
    spec = importlib.util.spec_from_file_location("ringattention_jax", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sharded(mesh, chunk: int, segments: bool, dtype=jnp.float32):
    """f(q, k, v[, segment_ids]) over global [B, S, H, D] (segment ids [B, S]); `dtype`: the kernel's compute
    type."""
    ring_attention = kernel_module().ring_attention
    blockwise_kwargs = dict(causal_block_size=1, deterministic=True, dropout_rng=None, attn_pdrop=0.0,
                            query_chunk_size=chunk, key_chunk_size=chunk, dtype=dtype,
                            policy=jax.checkpoint_policies.nothing_saveable, precision=None, prevent_cse=True)
    seq = P("dp", "cp", None, None)

    def body(q, k, v, *ids):
        return ring_attention(q, k, v, None, ids[0] if ids else None, None, "cp", True, blockwise_kwargs)

    in_specs = (seq,) * 3 + ((P("dp", None),) if segments else ())
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=seq, check_vma=False)


def inputs(mesh, segments: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    seq = NamedSharding(mesh, P("dp", "cp", None, None))
    args = tuple(jax.device_put(rng.standard_normal((B, S, H, D)).astype(np.float32), seq) for _ in range(3))
    if segments:
        ids = np.broadcast_to(np.repeat(np.arange(3), [21, 30, 13]).astype(np.int32), (B, S)).copy()
        args += (jax.device_put(ids, NamedSharding(mesh, P("dp", None))),)
    return args

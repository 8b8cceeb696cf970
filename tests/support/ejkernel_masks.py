"""ejkernel's XLA ring attention (the pinned test-only client, jax~=0.10) with the masks models use, as users call
it under jax.shard_map over ("dp", "cp"), without position ids: a sliding window, segment ids (packed documents),
attention sinks (`softmax_aux` logits, and StreamingLLM's always-visible first tokens).

The forward goes through the public `ring_attention`; differentiation calls its custom_vjp function with the
causal block size given (the public call passes None, which its fwd/bwd rules don't replace: see
ejkernel_models.py). The kernel is ejkernel's, unmodified.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

B, S, H, D = 2, 64, 2, 8
CHUNK = 8
SEQ = P("dp", "cp", None, None)

# name -> (sliding_window, attention_sink_size, segment ids: None, "whole" or "sharded", softmax_aux?, entry).
# Without position ids the kernel slices segment ids at a chunk's global offset: it needs them whole on every
# device (as Liu et al.'s does), which only its custom_vjp function accepts (the public call type-checks them
# against the local length). Sharded along the sequence, devices 1.. read clamped slices of their own ids: the
# kernel is wrong as written, and the offset it reads by is the device's.
VARIANTS = {
    "window24": ((24, 0), 0, None, False, "public"),
    "window8": ((8, 0), 0, None, False, "public"),
    "streaming-sinks": ((16, 0), 4, None, False, "public"),
    "softmax-aux-sinks": (None, 0, None, True, "public"),
    "segments": (None, 0, "whole", False, "vjp"),
    "window24-segments": ((24, 0), 0, "whole", False, "vjp"),
    "segments-sharded": (None, 0, "sharded", False, "public"),
}


def _call(q, k, v, ids, aux, variant: str, entry: str):
    window, sink_size = VARIANTS[variant][:2]
    if entry == "public":
        from ejkernel.kernels._xla.ring_attention import ring_attention
        from ejkernel.ops import FwdParams
        return ring_attention(q, k, v, q_segment_ids=ids, kv_segment_ids=ids, softmax_aux=aux, causal=True,
                              sliding_window=window, axis_name="cp",
                              fwd_params=FwdParams(q_blocksize=CHUNK, kv_blocksize=CHUNK))
    from ejkernel.kernels._xla.ring_attention._interface import _ring_attention
    # positional: q, k, v, bias, q_segment_ids, kv_segment_ids, q_position_ids, kv_position_ids, softmax_aux,
    # axis_name, float32_logits, softmax_scale, query_chunk_size, key_chunk_size, causal_block_size, deterministic,
    # dropout_rng, pdrop, dtype, policy, precision, prevent_cse, sliding_window, logits_soft_cap,
    # attention_sink_size, causal
    return _ring_attention(q, k, v, None, ids, ids, None, None, aux, "cp", True, None, CHUNK, CHUNK, CHUNK, True,
                           None, 0.0, jnp.float32, jax.checkpoint_policies.nothing_saveable,
                           jax.lax.Precision.DEFAULT, True, window, None, sink_size, True)


def sharded(mesh, variant: str, differentiable: bool = False):
    """f(q, k, v[, segment ids][, sink logits]) over global [B, S, H, D] arrays; `differentiable`: through the
    custom_vjp function (what jax.grad needs)."""
    _, _, segments, sinks, entry = VARIANTS[variant]

    def body(q, k, v, *extra):
        extra = list(extra)
        ids = extra.pop(0) if segments else None
        aux = extra.pop(0) if sinks else None
        return _call(q, k, v, ids, aux, variant, "vjp" if differentiable else entry)

    in_specs = (SEQ,) * 3 + ((_ids_spec(segments),) if segments else ()) + ((P(),) if sinks else ())
    # ejkernel's skip branch returns its carry without the mesh axes it varies over: check_vma=True fails to trace
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=SEQ, check_vma=False)


def _ids_spec(segments: str):
    return P("dp", None) if segments == "whole" else P("dp", "cp")


def inputs(mesh, variant: str, seed: int = 0):
    _, _, segments, sinks, _ = VARIANTS[variant]
    rng = np.random.default_rng(seed)
    args = tuple(jax.device_put(rng.standard_normal((B, S, H, D)).astype(np.float32), NamedSharding(mesh, SEQ))
                 for _ in range(3))
    if segments:
        ids = np.broadcast_to(np.repeat(np.arange(3), [21, 30, 13]).astype(np.int32), (B, S)).copy()
        args += (jax.device_put(ids, NamedSharding(mesh, _ids_spec(segments))),)
    if sinks:
        args += (jax.device_put(np.array([0.5, -0.25], np.float32), NamedSharding(mesh, P())),)
    return args

"""What ring-reorder's default (`@autofix_shardings`, ring_reorder="auto") decides for the ring kernels people
run, forward and under jax.grad, on jax.make_mesh's default axes (dp=2 x cp=4, Explicit): for each kernel, every
ring region's verdict (proved and rewritten, proved and left as written with the reason, or refused at an op), the
layout applied and the tiles on the critical path as written / after / ideal, as counted at compile time.

    python bench/ring_decisions.py [--markdown]

Runs where ejkernel is installed (requirements-oldest.txt: ejkernel needs jax~=0.10); Liu et al.'s RingAttention
and the kernels of tests/support/ring_user_programs.py run anywhere. Each program is only lowered, not run: the
tests hold the results equal to jax.jit's (tests/clients/, tests/test_ring_user_programs.py).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterator

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from shardfix import autofix_shardings  # noqa: E402

# build(mesh, grad) -> (fn, args); with grad, a function jax.grad can differentiate (a custom_vjp entry)
REFUSED = re.compile(r"not provably safe: (?P<op>'[^']+')(?: at \S+(?: \(in \S+\))?)?:? (?P<reason>.*)", re.S)
Build = Callable[[jax.sharding.Mesh, bool], tuple[Callable, tuple]]

# The programs of tests/support/ring_user_programs.py shown, one per kind of mask and structure.
USER = ("blockwise-causal", "blockwise-python-causal", "blockwise-causal-segments", "blockwise-window40",
        "blockwise-window8", "blockwise-alibi", "blockwise-prefix20", "blockwise-chunked16", "blockwise-sinks",
        "fori-causal", "fori-causal-rope-table", "fori-causal-prefill-offset", "fori-causal-softmax-aux",
        "fori-bidirectional", "nested-blockwise-causal", "project-scan-vjp", "vjp-causal", "variant-full-init",
        "variant-full-init-window20", "variant-carried-source", "variant-ppermuted-source@auto",
        "refuse-all-gather-into-buffer", "refuse-device-keyed-dropout", "refuse-sorted-keys",
        "refuse-positions-left-behind", "refuse-int-truncated-sum", "refuse-carried-source-wrong-modulus",
        "lse-logaddexp", "refuse-lse-sigmoid-peeled", "refuse-lse-guarded-sigmoid-inf", "blockwise-causal-lse",
        "vjp-lse-logaddexp", "lse-max-log1p", "refuse-lse-decayed", "refuse-lse-sigmoid-sentinel-start")


def _ejkernel(mesh, variant: str, grad: bool):
    from support import ejkernel_masks as em
    # plain causal (no window, sinks or segment ids) next to the mask variants the client tests use
    em.VARIANTS.setdefault("causal", (None, 0, None, False, "public"))
    return em.sharded(mesh, variant, differentiable=grad), em.inputs(mesh, variant)


def kernels() -> Iterator[tuple[str, Build, bool]]:
    """(name, build, differentiable)."""
    from support import liu_ring
    for segments in (False, True):
        name = "Liu et al. RingAttention, causal" + (", segment ids" if segments else "")
        yield name, lambda m, g, s=segments: (liu_ring.sharded(m, 8, s), liu_ring.inputs(m, s)), True
    # as LWM runs it: bfloat16 q, k, v and compute dtype
    yield "Liu et al. RingAttention, causal, bfloat16", lambda m, g: (
        liu_ring.sharded(m, 8, False, dtype=jnp.bfloat16),
        tuple(x.astype(jnp.bfloat16) for x in liu_ring.inputs(m, False))), True
    try:
        import ejkernel  # noqa: F401
    except ImportError:
        pass
    else:
        for variant in ("causal", "window24", "window8", "streaming-sinks", "softmax-aux-sinks", "segments",
                        "segments-sharded"):
            # under jax.grad through its custom_vjp function (the public call has no vjp rule)
            yield f"ejkernel ring_attention, {variant}", \
                lambda m, g, v=variant: _ejkernel(m, v, g), variant != "segments-sharded"
    from support import ring_user_programs as up
    meshes = up.meshes()
    by_name = {p.name: p for p in up.PROGRAMS}
    for name in USER:
        program = by_name[name]
        yield f"own: {name}", lambda m, g, p=program: p.build(meshes[p.mesh]), not name.startswith("refuse")


def _cell(decision) -> str:
    if decision.applied:
        return f"{decision.strategy}: {decision.critical_before} -> {decision.critical_after} (ideal {decision.ideal:g})"
    refused = REFUSED.match(decision.why)
    if refused:  # the locations are the user's lines: the table keeps the op and the reason
        reason = refused["reason"].split(". ")[0]
        if "without a custom_vjp" in reason:
            reason = "the backward jax.grad made, no custom_vjp (its forward proved)"
            if "merges log-sum-exps and JAX differentiates" in decision.why:
                reason += ": it differentiates max, min or abs where the merge's operands may tie"
        return f"refused at {refused['op']}: {reason}"
    if decision.why.startswith("not provably safe: reordered together with"):
        return "refused with the region it is reordered with"
    why = decision.why.split(": ")[0].split(". ")[0]
    if decision.critical_before is not None and "tiles" not in why:
        why += f" ({decision.critical_before}, ideal {decision.ideal:g})"
    return "left: " + why


def decide(build: Build, grad: bool, mesh) -> list:
    fn, args = build(mesh, grad)
    if grad:
        forward = fn
        fn = jax.grad(lambda *a: jnp.sum(forward(*a).astype(jnp.float32) ** 2), argnums=(0, 1, 2))
    return autofix_shardings(fn, on_fix="ignore").lower(*args).rings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    options = parser.parse_args(argv)
    mesh = jax.make_mesh((2, 4), ("dp", "cp"))
    rows = []
    for name, build, differentiable in kernels():
        for grad in (False, True) if differentiable else (False,):
            try:
                cells = "; ".join(_cell(d) for d in decide(build, grad, mesh)) or "no ring found"
            except Exception as error:  # a kernel that JAX itself rejects: say so, keep going
                cells = f"error: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
            rows.append((name, "jax.grad" if grad else "forward", cells))
            if not options.markdown:
                print(f"{name:52s} {rows[-1][1]:9s} {cells}", flush=True)
    if options.markdown:
        print("| kernel | call | each ring region: layout, tiles on the critical path as written -> after (ideal) |")
        print("|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())

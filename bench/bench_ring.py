"""ring-reorder on the ring attention people run: ejkernel's XLA `ring_attention` (causal; blockwise lax.scan over
chunks, skipping a (query chunk, key chunk) tile when every key follows every query), unmodified.

Balance: the tiles each device computes at each ring step, counted on the running program (tests/support/tiles.py
threads a log through the kernel's skip conditionals), before and after the pass; the bytes the permutation adds;
the error against dense causal attention.

Cost: ring-reorder (strategy=auto, what the decorator runs: proof, tile counts, layout) + hoist-permutations
against sdy-propagation-pipeline on the same module, a training step (value_and_grad) at 4, 16, 64 and 256 layers
of three stacks: residual attention layers and Llama-style blocks with one ejkernel ring attention per layer (the
layers call the same kernel functions), and attention layers each under its own jax.shard_map of a blockwise
custom_vjp ring kernel (tests/support/ring_kernels.py), so that no two layers share a callee.

ejkernel needs jax~=0.10: run this in the oldest environment (`make bench-ring`); `--models own` runs on any.

    python bench/bench_ring.py [--layers 4 16 64 256] [--rounds 3] [--models attention llama own] [--no-balance]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import common  # noqa: F401  (sets XLA_FLAGS first, puts tests/ on the path)

BALANCE = "## ring-reorder: balance of ejkernel's causal ring attention (goal: critical path / ideal at most 1.05)"
COST = "## ring-reorder + hoist-permutations vs sdy-propagation-pipeline on a ring-attention training step"
CHUNK = 8
PERMUTATION = "shardfix.sequence_permutation"
MODELS = ("attention", "llama", "own")
PIPELINES = ("ring-reorder{strategy=auto},hoist-permutations", "sdy-propagation-pipeline")


def _mesh(cp: int):
    import jax
    return jax.make_mesh((8 // cp, cp), ("dp", "cp"))  # Explicit axes: jax.make_mesh's default


def balance_rows() -> list[dict]:
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardfix import autofix_shardings
    from support import ejkernel_models as ejk
    from support import tiles
    from support.hlo import collective_bytes

    rows = []
    for cp in (4, 8):
        mesh = _mesh(cp)
        length = 2 * CHUNK * cp  # two chunks a device
        spec = P("dp", "cp", None, None)
        q, k, v = (jax.device_put(x, NamedSharding(mesh, spec)) for x in ejk.inputs(mesh, length)[:3])
        dense = np.asarray(ejk.dense_causal(*(np.asarray(x) for x in (q, k, v))))
        logged = tiles.with_skip_log(lambda q, k, v: ejk.ring_attention(q, k, v, axis="cp", chunk=CHUNK), mesh,
                                     (spec,) * 3, spec, entries=cp * 4)
        plain = jax.jit(logged).lower(q, k, v)
        fixed = autofix_shardings(logged).lower(q, k, v)
        assert [r.applied for r in fixed.rings] == [True], [r.why for r in fixed.rings]
        (decision,) = fixed.rings
        shard = q.nbytes // mesh.size
        before = collective_bytes(plain.compile().as_text())
        for name, program in (("contiguous (as written)", plain), ("zigzag (@autofix_shardings)", fixed)):
            out, log = tiles.instrumented(program).compile()(q, k, v)
            counts = tiles.tiles_per_step(np.asarray(log), cp)
            counted = decision.critical_before if name.startswith("contiguous") else decision.critical_after
            assert counted == int(counts[:cp].max(axis=0).sum()), (counted, counts)  # dp=0's ring, as run
            after = collective_bytes(program.compile().as_text())
            added = sorted(after.get("collective-permute", []) + after.get("all-to-all", [])
                           + after.get("all-gather", []))
            for b in before.get("collective-permute", []):
                added.remove(b)
            rows.append({"cp": cp, "layout": name, "first": counts[0].tolist(), "last": counts[cp - 1].tolist(),
                         "busiest": counts.max(axis=0).tolist(), "ratio": tiles.critical_path_over_ideal(counts),
                         "tiles": int(counts.sum()), "moved": sum(added),
                         "counted": counted, "ideal": decision.ideal,
                         "shard": shard, "error": float(np.abs(np.asarray(out) - dense).max())})
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def render_balance(rows: list[dict]) -> str:
    table = ["| cp | layout | device 0's tiles per step | last device's tiles per step | busiest device per step "
             "| critical path / ideal | tiles in all | permutation bytes per device (in and out) | one local shard "
             "(bytes) | max error vs dense |",
             "|---:|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['cp']} | {r['layout']} | {r['first']} | {r['last']} | {r['busiest']} | {r['ratio']:.3f} "
                     f"| {r['counted']} ({r['ideal']:g}) | {r['tiles']} | {r['moved']} | {r['shard']} "
                     f"| {r['error']:.1e} |")
    return (f"{BALANCE}\n\n"
            "Command: `make bench-ring` (`python bench/bench_ring.py` in `.venv-oldest`: ejkernel 0.0.80.3 needs "
            "jax~=0.10). dp x cp = 8 simulated CPU devices, chunk 8, two chunks a device, batch 2, 2 heads of 16. "
            "A tile is a (query chunk, key chunk) pair the kernel computes; the counts are read from the running "
            "program. *critical path / ideal*: the sum over ring steps of the busiest device's tiles over the "
            "total spread evenly (1.0 is perfect balance). *counted at compile time*: the figures of the decision "
            "(RingDecision.critical_before / critical_after / ideal) that ring-reorder's default strategy=auto "
            "counts from the kernel's own skip conditionals before choosing zigzag: they are the running "
            "program's. *permutation bytes*: what the inserted permutations add "
            "to the collectives of the compiled program, per device, for q, k, v in and the output out (two "
            "half-shard collective permutes each: one local shard per tensor at most).\n\n" + "\n".join(table) + "\n")


def own_shard_map_loss(mesh, cp: int):
    """A stack of attention layers, each its own jax.shard_map of a fresh blockwise ring kernel (so no two layers
    share a function): x [batch, S, d] -> x + attention(x wq, x wk, x wv) wo; loss = mean(x ** 2)."""
    import jax.numpy as jnp

    from support import ring_kernels

    def loss(weights, x):
        for w in weights:
            attention = ring_kernels.sharded(ring_kernels.scan_ring_attention("cp", cp, CHUNK), mesh)
            q, k, v = (x @ w[name] for name in ("wq", "wk", "wv"))
            x = x + attention(q, k, v) @ w["wo"]
        return jnp.mean(x ** 2)

    return loss


def own_inputs(mesh, layers: int, length: int, batch: int = 2, d_model: int = 16):
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    rng = np.random.default_rng(0)
    weights = [{name: (rng.standard_normal((d_model, d_model)) / np.sqrt(d_model * (layers if name == "wo" else 1)))
                .astype(np.float32) for name in ("wq", "wk", "wv", "wo")} for _ in range(layers)]
    x = rng.standard_normal((batch, length, d_model)).astype(np.float32)
    return (jax.device_put(weights, NamedSharding(mesh, P())),
            jax.device_put(x, NamedSharding(mesh, P("dp", "cp", None))))


def lowered_text(model: str, layers: int, mesh) -> str:
    import jax
    if model == "own":
        loss, (weights, x) = own_shard_map_loss(mesh, mesh.shape["cp"]), own_inputs(mesh, layers, 64)
    else:
        from support import ejkernel_models as ejk
        build, inputs = (ejk.model_loss, ejk.model_inputs) if model == "attention" else (ejk.llama_loss,
                                                                                          ejk.llama_inputs)
        loss, (weights, x) = build(ejk.sharded(mesh, CHUNK, False, entry="vjp")), inputs(mesh, layers, 64)
    return jax.jit(jax.value_and_grad(loss)).lower(weights, x).as_text(debug_info=True)


def _cost_row(model: str, layers: int, rounds: int, mesh, ctx) -> dict:
    from shardfix.ir import parse_module
    from shardfix.pipeline import PassContext, build_pass_manager, parse_pipeline

    text = lowered_text(model, layers, mesh)
    times: dict[str, list[float]] = {p: [] for p in PIPELINES}
    for i in range(rounds):
        for pipeline in (PIPELINES if i % 2 == 0 else PIPELINES[::-1]):
            module = parse_module(text, ctx, "<lowered>")
            pass_ctx = PassContext()
            pm = build_pass_manager(parse_pipeline(pipeline), ctx, pass_ctx, verify_each=False)
            start = time.process_time()
            with ctx:
                pm.run(module)
            times[pipeline].append(time.process_time() - start)
            if pipeline.startswith("ring"):
                report, permutations = pass_ctx.report, str(module).count(PERMUTATION)
    ring, prop = (statistics.median(times[p]) for p in PIPELINES)
    return {"model": model, "layers": layers, "kib": len(text) // 1024, "rings": len(report.rings),
            "applied": sum(r.applied for r in report.rings), "permutations": permutations, "ring": ring,
            "prop": prop}


def cost_rows(layers_list: list[int], rounds: int, models=MODELS) -> list[dict]:
    from shardfix.ir import make_context

    mesh, ctx, rows = _mesh(4), make_context(), []
    for model in models:
        for layers in layers_list:
            rows.append(_cost_row(model, layers, rounds, mesh, ctx))
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def render_cost(rows: list[dict], rounds: int) -> str:
    table = ["| model | layers | module (KiB) | ring regions (reordered) | permutations left | ring-reorder + hoist "
             "(s) | sdy-propagation-pipeline (s) | ratio | ms per layer |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['model']} | {r['layers']} | {r['kib']} | {r['rings']} ({r['applied']}) "
                     f"| {r['permutations']} | {r['ring']:.3f} | {r['prop']:.3f} | {r['ring'] / r['prop']:.3f}x "
                     f"| {r['ring'] / r['layers'] * 1e3:.2f} |")
    return (f"{COST} (goal: at most 0.25x at 64 and 256 layers, linear)\n\n"
            f"Command: `make bench-ring` (`python bench/bench_ring.py` in `.venv-oldest`; CPU seconds, median of "
            f"{rounds} runs, each pipeline on a freshly parsed module, the two alternating). Training steps "
            "(value_and_grad), dp=2 x cp=4 on jax.make_mesh's default (Explicit) axes, lowered with debug info, a "
            "forward and a backward ring region per layer, ring-reorder with strategy=auto (proof, tile counts, "
            "layout: what the decorator runs). "
            "*attention*: residual attention layers (q/k/v/o projections) and *llama*: Llama-style blocks (RMSNorm, "
            "attention, RMSNorm, SwiGLU MLP through jax.nn.silu, residual adds), one ejkernel ring attention (its "
            "custom_vjp entry) per layer, all layers calling the same kernel functions "
            "(tests/support/ejkernel_models.py); *own*: attention layers each under its own jax.shard_map of a "
            "fresh blockwise custom_vjp kernel (tests/support/ring_kernels.py, chunk 8), whose bodies are "
            "inline in every region, so no two layers share a function. Tile counts are made once per distinct "
            "kernel (regions are keyed by their structure); hoist-permutations looks at each op between the rings "
            "once each way, and asks the rule table once per kind of op.\n\n"
            + "\n".join(table) + "\n")


def main(argv=None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 16, 64, 256])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--no-balance", action="store_true", help="the cost table only (ejkernel-free with --models own)")
    args = ap.parse_args([] if argv is None and __name__ != "__main__" else argv)
    balance = "" if args.no_balance else render_balance(balance_rows()) + "\n"
    return balance + render_cost(cost_rows(args.layers, args.rounds, tuple(args.models)), args.rounds)


if __name__ == "__main__":
    print(main())

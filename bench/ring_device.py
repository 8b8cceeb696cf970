"""Balance of a ring on a real accelerator, one ring device's program at a time.

A machine with one accelerator can't run a ring of eight, but the work of each ring device can be timed alone:
what decides which tiles a device computes is its ring coordinate and the hop counter (positions), not the data
that travels. So for each coordinate r the ring region is cut out of the module as its own function, every
`partition_id` becomes the constant r (or, for the user kernels, the program's argument, so that one compile serves
every r) and every `collective_permute` passes its operand through (the device keeps its own block: same shapes,
same skips), and that program is compiled and timed. The ring's critical path is the slowest r; max over mean says
how even the work is. Timed alone, a device doesn't wait for its neighbours at each ring step, and the permutation
into a layout is not run: the slowest r compares with the busiest device's tiles, not with ring-reorder's
step-synchronised critical path, and the permutation's cost is left out.

Two steps, because the kernel's client and the accelerator may sit in different environments:

    python bench/ring_device.py extract OUT_DIR [--kernel ejkernel|liu|user|user-python] [--grad] [--cp 8]
            [--tokens 8192] [--heads 8] [--dim 128] [--chunk 1024] [--masks causal,alibi,...]
        (ejkernel's causal ring attention (in .venv-oldest: it needs jax~=0.10) or Liu et al.'s RingAttention
        (PyPI ringattention), lowered on cp simulated CPU devices as written and through @autofix_shardings;
        writes one module per layout and coordinate, and manifest.json. `user`: the blockwise kernels of
        tests/support/ring_user_kernels.py, one directory a mask kind, each with the program as written, in the
        layout ring-reorder's defaults pick (its decision and tile figures recorded), and in every other layout
        the pass can be forced to, with the tiles each coordinate computes in each. `user --grad`: jax.grad of
        sum(kernel ** 2), plain autodiff, so each layout has a forward and a backward ring region, cut out as two
        programs; the backward's arguments include the residuals the forward saves (among them the case index of
        every chunk pair, which its skips read), and the manifest says which forward result feeds which, so that
        the timing runs the backward on what the forward at the same coordinate computed, never on made-up
        indices. Forced layouts go through the decorator: the ties of a ring to its backward are recorded while
        it traces, and a module from jax.jit's text lacks them. `user-python`: the same with the kernels of
        ring_user_kernels.blockwise_python_ring, their chunk loops written as Python loops inside a lax.fori_loop
        over ring steps; its sections are headed apart from `user`'s)
    python bench/ring_device.py time OUT_DIR [--rounds 20 (10 for user)] [--section]
        (where the accelerator is: jax, jaxlib, numpy and this repository's python/ on PYTHONPATH; compiles and
        times every program on jax.devices()[0]; prints the table, with --section writes it to bench/RESULTS.md;
        for user: whether the picked layout's slowest coordinate is the fastest, and measured against tiles; a
        gradient suite writes a section of its own. Plain autodiff saves every chunk pair's scores: at the default
        sizes the forward hands the backward about 44 GiB a coordinate, which the timing holds on the device)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = {"ejkernel": "ejkernel's causal ring attention", "liu": "Liu et al.'s causal RingAttention",
           "user": "the blockwise kernels users write, each mask kind",
           "user-python": "the blockwise kernels users write, chunk loops as Python loops"}
TITLE = "## ring-reorder on an accelerator: each ring device's program of {}, timed alone"
PERMUTATION_ATTR = "shardfix.sequence_permutation"


# ---------------------------------------------------------------------------------------------------------------
# extract (any JAX that runs the kernel; CPU is enough: nothing is compiled)


def _ops(block):
    """Every operation of a block and of the regions nested in it, in order."""
    for op in block.operations:
        yield op
        for region in op.regions:
            for inner in region.blocks:
                yield from _ops(inner)


def _ring_regions(main) -> list:
    """The manual computations of `main` that hold rings (those that aren't permutations shardfix inserted), in
    program order: the forward ring, then (for a gradient) the backward one."""
    return [op for op in main.regions[0].blocks[0].operations
            if op.operation.name == "sdy.manual_computation" and PERMUTATION_ATTR not in op.attributes]


def count_regions(text: str) -> int:
    from jaxlib.mlir import ir

    from shardfix.ir import make_context
    with make_context():
        module = ir.Module.parse(text)
        return len(_ring_regions(_main(module)))


def _main(module):
    from jaxlib.mlir import ir
    return next(op for op in module.body.operations if op.operation.name == "func.func"
                and ir.StringAttr(op.attributes["sym_name"]).value == "main")


def device_program(text: str, coordinate: int | None, which: int = 0) -> str:
    """Ring region number `which` of `text` (a lowered module) as a single-device module for ring coordinate
    `coordinate`; with None, for any coordinate: `partition_id` becomes the program's last argument (one compile
    serves every coordinate; the skips still run on the device, as they do with a constant)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import func

    from shardfix.ir import make_context

    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(text)
        top = module.body
        main = _main(module)
        region_op = _ring_regions(main)[which]
        body = region_op.regions[0].blocks[0]
        terminator = next(op for op in body.operations if op.operation.name == "sdy.return")
        results = [value.type for value in terminator.operands]  # the local (per-device) types
        inputs = [a.type for a in body.arguments]
        if coordinate is None:
            inputs.append(ir.RankedTensorType.get([], ir.IntegerType.get_unsigned(32)))
        with ir.InsertionPoint(main):
            program = func.FuncOp("ring_device", (inputs, results))
        entry = program.add_entry_block()
        with ir.InsertionPoint(entry):
            anchor = func.ReturnOp([])
        for old, new in zip(body.arguments, entry.arguments):
            old.replace_all_uses_with(new)
        for op in list(body.operations):
            if op.operation.name != "sdy.return":
                op.move_before(anchor)
        with ir.InsertionPoint(anchor):
            func.ReturnOp(list(terminator.operands))
        anchor.erase()
        main.erase()
        program.attributes["sym_name"] = ir.StringAttr.get("main")
        program.attributes["sym_visibility"] = ir.StringAttr.get("public")
        for op in list(top.operations):
            if op.operation.name == "sdy.mesh":
                op.erase()
        for fn in top.operations:
            for op in list(_ops(fn.regions[0].blocks[0])) if fn.regions else ():
                if op.operation.name == "stablehlo.partition_id" and coordinate is None:
                    if ir.StringAttr(fn.attributes["sym_name"]).value != "main":  # a callee would need it passed down
                        raise ValueError("partition_id outside the ring region's own body")
                    op.result.replace_all_uses_with(entry.arguments[-1])
                    op.erase()
                elif op.operation.name == "stablehlo.partition_id":
                    kind = ir.RankedTensorType(op.result.type)
                    value = ir.DenseElementsAttr.get_splat(kind, ir.IntegerAttr.get(kind.element_type, coordinate))
                    with ir.InsertionPoint(op):
                        constant = ir.Operation.create("stablehlo.constant", results=[kind],
                                                       attributes={"value": value})
                    op.result.replace_all_uses_with(constant.result)
                    op.erase()
                elif op.operation.name == "stablehlo.collective_permute":
                    op.result.replace_all_uses_with(op.operands[0])
                    op.erase()
        attrs = module.operation.attributes
        for name in ("mhlo.num_partitions", "mhlo.num_replicas"):
            if name in attrs:
                attrs[name] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1)
        assert module.operation.verify()
        return str(module)


def region_feeds(text: str, which: int) -> list:
    """For each argument of ring region `which`'s program (device_program(text, r, which), the coordinate argument
    left out): [k, j] where the region reads result j of ring region k < which (a residual the forward saved, such
    as the case index of each skipped chunk pair), else None (data the timing may make up). A backward's skips read
    the forward's saved case indices, so an integer or boolean operand that isn't such a residual is refused."""
    from jaxlib.mlir import ir

    from shardfix.ir import make_context
    with make_context():
        module = ir.Module.parse(text)
        regions = _ring_regions(_main(module))
        feeds = []
        for value in regions[which].operands:
            feed = None
            if isinstance(value, ir.OpResult):
                for k, region in enumerate(regions[:which]):
                    if value.owner.operation == region.operation:
                        feed = [k, ir.OpResult(value).result_number]
            if feed is None and not isinstance(ir.RankedTensorType(value.type).element_type, ir.FloatType):
                raise ValueError(f"ring region {which} reads {value.type} from outside the earlier ring regions: "
                                 "timed alone it would need the value the ring computes")
            feeds.append(feed)
        return feeds


def extract(out_dir: str, cp: int, tokens: int, heads: int, dim: int, chunk: int, batch: int, grad: bool,
            kernel: str = "ejkernel", dtype: str = "bfloat16") -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardfix import autofix_shardings
    mesh = jax.make_mesh((1, cp), ("dp", "cp"))
    spec = P("dp", "cp", None, None)
    if kernel == "liu":  # its custom_vjp entry, causal_block_size=1, as LWM calls it
        from support import liu_ring
        attention = liu_ring.sharded(mesh, chunk, False, dtype=jnp.dtype(dtype))
        described = "Liu et al.'s RingAttention (ringattention 0.1.2, causal)"
    else:
        from support import ejkernel_models as ejk
        attention = ejk.sharded(mesh, chunk, False, entry="vjp")
        described = "ejkernel 0.0.80.3 XLA ring_attention (causal, custom_vjp entry)"
    args = [jax.ShapeDtypeStruct((batch, tokens * cp, heads, dim), jnp.dtype(dtype),
                                 sharding=NamedSharding(mesh, spec))] * 3
    if grad:  # forward and backward rings (the kernel's custom_vjp)
        program = jax.grad(lambda q, k, v: attention(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))
    else:
        program = attention
    texts, decisions = {"contiguous": jax.jit(program).lower(*args).as_text()}, {}
    for layout in ("zigzag", "striped"):
        fixed = autofix_shardings(program, ring_reorder=layout).lower(*args)
        decisions[layout] = [(r.strategy, r.applied, r.why) for r in fixed.rings]
        if all(r.applied for r in fixed.rings):
            texts[layout] = fixed.as_text()
    os.makedirs(out_dir, exist_ok=True)
    files = {}
    for layout, text in texts.items():
        for r in range(cp):  # one list per coordinate: its programs (forward ring, backward ring) run one after another
            names = []
            for k in range(count_regions(text)):
                names.append(f"{layout}_k{k}_r{r}.mlir")
                with open(os.path.join(out_dir, names[-1]), "w") as f:
                    f.write(device_program(text, r, k))
            files.setdefault(layout, []).append(names)
    kind = "jax.grad (forward and backward rings)" if grad else "forward"
    manifest = {"kernel": f"{described}, {kind}", "kernel_id": kernel,
                "cp": cp, "tokens_per_device": tokens, "heads": heads, "dim": dim, "chunk": chunk,
                "batch": batch, "dtype": dtype, "grad": grad, "decisions": decisions, "files": files,
                "lowered_with": f"jax {jax.__version__}"}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(json.dumps(manifest, indent=1))


# The blockwise kernels users write (tests/support/ring_user_kernels.blockwise_ring: a lax.cond skips each (q chunk,
# kv chunk) pair its mask hides), with each mask kind scaled to the block n of tokens a device and the chunk.
USER = ("causal", "alibi", "window", "sinks", "prefix", "chunked", "short-window")
# Their builders in tests/support/ring_user_kernels.py: {name: (the --kernel that extracts it, what the manifest's
# kernel and the section's title add to "the blockwise kernels users write", how its loops run)}.
USER_BUILDERS = {
    "blockwise_ring": ("user", "", ("lax.scan over ring steps and over q and kv chunks, a chunk pair skipped by "
                                    "lax.cond when its mask hides it whole")),
    "blockwise_python_ring": ("user-python", " with Python chunk loops",
                              ("lax.fori_loop over ring steps, Python loops over the q and kv chunks inside it, "
                               "each q chunk with a running state of its own, a chunk pair skipped by lax.cond when "
                               "its mask hides it whole")),
}


def _user_mask(name: str, n: int, chunk: int):
    """(mask, chunk-pair predicate, description) of user kernel `name`."""
    from support import ring_user_kernels as uk
    return {"causal": (uk.causal, uk.live_causal, "causal"),
            "alibi": (uk.alibi, uk.live_causal, "causal with an ALiBi bias"),
            "window": (uk.window(3 * n), uk.live_window(3 * n), f"sliding window of {3 * n} tokens"),
            "sinks": (uk.sinks(4, 2 * n), uk.live_sinks(4, 2 * n), f"StreamingLLM: 4 sinks + a window of {2 * n}"),
            "prefix": (uk.prefix_lm(2 * n), uk.live_prefix(2 * n), f"prefix-LM, a prefix of {2 * n} tokens"),
            "chunked": (uk.chunked(4 * n), uk.live_chunked(4 * n), f"chunked-local, chunks of {4 * n} tokens"),
            "short-window": (uk.window(chunk), uk.live_window(chunk), f"sliding window of {chunk} tokens"),
            }[name]


def _passed(text: str, pipeline: str) -> tuple[str, list]:
    """`text` after shardfix's `pipeline`, and its ring decisions."""
    from jaxlib.mlir import ir

    from shardfix.ir import make_context
    from shardfix.pipeline import PassContext, parse_pipeline, run_pipeline
    ctx, pass_ctx = make_context(), PassContext()
    with ctx:
        module = ir.Module.parse(text)
    run_pipeline(module.operation, parse_pipeline(pipeline), ctx, pass_ctx)
    with ctx:
        return str(module), pass_ctx.report.rings


def tiles_per_device(text: str, cp: int) -> tuple[list[int], int]:
    """(tiles each ring coordinate computes, the pass's critical path: sum over steps of the busiest device's
    tiles) of the first ring region of `text`, counted from its skip conditionals as ring-reorder counts them."""
    from jaxlib.mlir import ir

    from shardfix.ir import make_context
    from shardfix.ring.cost import Counter
    from shardfix.ring.detect import module_funcs
    with make_context():
        module = ir.Module.parse(text)
        region = _ring_regions(_main(module))[0]
        tiles = Counter(module_funcs(module.operation), set()).count(region, list(range(cp)), [], None, "")
    return [sum(row) for row in tiles.counts], tiles.critical


def ring_tiles(text: str, cp: int) -> list[dict]:
    """For each ring region of `text` in program order, {"tiles": tiles each ring coordinate computes, "critical":
    the pass's critical path, "ideal": the total spread evenly}, counted as ring-reorder counts them. A later
    region's skips may read results of an earlier one (a backward reading the case indices its forward saved):
    those are counted on the forward and handed to the backward's count, as the pass's layout choice does."""
    from jaxlib.mlir import ir

    from shardfix.ir import make_context
    from shardfix.ring.cost import Counter
    from shardfix.ring.detect import module_funcs
    feeds = [region_feeds(text, k) for k in range(count_regions(text))]
    with make_context():
        module = ir.Module.parse(text)
        regions = _ring_regions(_main(module))
        counter = Counter(module_funcs(module.operation), set())
        pids = list(range(cp))
        keep = [frozenset(feeds[j][i][1] for j in range(k + 1, len(regions)) for i in counter.reads(regions[j])
                          if feeds[j][i] is not None and feeds[j][i][0] == k) for k in range(len(regions))]
        counted, out = [], []
        for k, region in enumerate(regions):
            given = {i: [kept.get(feeds[k][i][1]) for kept in counted[feeds[k][i][0]].kept]
                     for i in counter.reads(region) if feeds[k][i] is not None}
            tiles = counter.count(region, pids, [], None, "", given, keep[k])
            counted.append(tiles)
            out.append({"tiles": [sum(row) for row in tiles.counts], "critical": tiles.critical,
                        "ideal": tiles.ideal})
        return out


def _candidates(contiguous: str, tokens: int, cp: int, run=None) -> tuple[dict[str, str], dict[str, str],
                                                                         dict[str, list]]:
    """({layout name: module} for every layout ring-reorder can be forced to: strategy=zigzag, striped with its
    smallest stripe and each multiple of it that fits (a block holds cp stripes or more), {layout: why not},
    {layout: the forced run's ring decisions}). A module with several rings (a gradient's forward and backward)
    counts only where every ring is rewritten. `run(strategy, stripe)`: (module, ring decisions), or a reason it
    can't be run; by default the pass forced on `contiguous`."""
    texts, refused, decisions = {}, {}, {}
    if run is None:
        def run(strategy: str, stripe: int):
            return _passed(contiguous, f"ring-reorder{{strategy={strategy} stripe={stripe}}},hoist-permutations")

    def force(strategy: str, stripe: int) -> str | None:
        outcome = run(strategy, stripe)
        if isinstance(outcome, str):
            refused[f"{strategy} stripe={stripe}"] = outcome
            return None
        text, rings = outcome
        if all(r.applied for r in rings):
            texts[rings[0].strategy], decisions[rings[0].strategy] = text, rings
            return rings[0].strategy
        refused[f"{strategy} stripe={stripe}"] = "; ".join(
            (f"ring {k}: " if len(rings) > 1 else "") + r.why for k, r in enumerate(rings) if not r.applied)
        return None

    force("zigzag", 0)
    smallest = force("striped", 0)
    if smallest is not None:
        unit = int(smallest.split("=")[1].rstrip("}"))
        for stripe in range(2 * unit, tokens // cp + 1, unit):
            if tokens % (cp * stripe) == 0:
                force("striped", stripe)
    return texts, refused, decisions


def _picked(rings: list) -> str:
    """The layout a module's ring decisions amount to: as written, one strategy every ring applied, or a mix."""
    if not any(r.applied for r in rings):
        return "contiguous"
    strategies = {r.strategy for r in rings}
    if all(r.applied for r in rings) and len(strategies) == 1:
        return strategies.pop()
    return "mixed: " + ", ".join(r.strategy if r.applied else "contiguous" for r in rings)


def _pair_tiles(rings: list, after: bool) -> dict | None:
    """{critical: [each ring's critical path in tiles], ideal: [each ring's ideal]} of a module's ring decisions,
    as written (after=False) or in the layout they apply; None where the pass counted no tiles."""
    if not rings or any(r.critical_before is None or r.critical_after is None or r.ideal is None for r in rings):
        return None
    return {"critical": [r.critical_after if after else r.critical_before for r in rings],
            "ideal": [r.ideal for r in rings]}


def _file_name(layout: str, suffix: str = "") -> str:
    return f"{layout.replace('{', '_').replace('=', '').replace('}', '').replace(': ', '_').replace(', ', '+')}" \
        f"{suffix}.mlir"


def extract_user(out_dir: str, names: list[str], cp: int, tokens: int, heads: int, dim: int, chunk: int,
                 batch: int, grad: bool = False, builder: str = "blockwise_ring") -> None:
    """For each user kernel, a directory of programs: as written, the layout ring-reorder's defaults pick, and
    every other layout it can be forced to; each program takes the ring coordinate as its last argument. With
    `grad`, jax.grad of sum(kernel ** 2) (plain autodiff: a forward ring region, then a backward one that reads the
    forward's residuals): each layout a forward program and a backward program, the backward's residual arguments
    fed from the forward's results at timing (manifest "feeds"). `builder`: which of USER_BUILDERS makes the
    kernels (ring_user_kernels.blockwise_ring, or blockwise_python_ring with its chunk loops as Python loops); the
    manifests name it."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardfix import autofix_shardings
    from support import ring_user_kernels as uk
    from support.ring_user_programs import sharded
    mesh = jax.make_mesh((1, cp), ("dp", "cp"))
    # q, k, v [batch * heads, S, dim] (the kernel's [b, n, d] form: the heads folded into the batch), float32
    args = [jax.ShapeDtypeStruct((batch * heads, tokens * cp, dim), jnp.float32,
                                 sharding=NamedSharding(mesh, P("dp", "cp", None)))] * 3
    for name in names:
        mask, live, described = _user_mask(name, tokens, chunk)
        program = sharded(mesh, getattr(uk, builder)(cp, chunk, mask, live), 3)
        if grad:
            forward = program

            def program(q, k, v, forward=forward):
                return jax.grad(lambda q, k, v: (forward(q, k, v) ** 2).sum(), argnums=(0, 1, 2))(q, k, v)
        contiguous = jax.jit(program).lower(*args).as_text()
        fixed = autofix_shardings(program, on_fix="ignore").lower(*args)
        rings = list(fixed.rings)
        if len(rings) != (2 if grad else 1):
            raise ValueError(f"{name}: {len(rings)} ring decision(s)")
        picked = _picked(rings)
        texts = {"contiguous": contiguous, picked: fixed.as_text()}
        source = "the pass's decisions under the defaults"
        pair = {"contiguous": _pair_tiles(rings, False), picked: _pair_tiles(rings, True)}
        pair = {layout: figures and {**figures, "from": source} for layout, figures in pair.items()}
        def traced(strategy: str, stripe: int, program=program):
            """Forced through the decorator: the ties of each ring to its backward are recorded as it traces (the
            pass refuses a backward it finds no tie for, and a module from jax.jit's text has none)."""
            if stripe:
                return "the decorator forces only the smallest stripe"
            forced_run = autofix_shardings(program, ring_reorder=strategy, on_fix="ignore").lower(*args)
            return forced_run.as_text(), list(forced_run.rings)

        forced, refused, forced_rings = _candidates(contiguous, tokens, cp, traced if grad else None)
        for layout, text in forced.items():
            texts.setdefault(layout, text)
            figures = _pair_tiles(forced_rings[layout], True)
            pair.setdefault(layout, figures and {**figures, "from": "the pass's decisions forced to this layout"})
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        files, tiles, backward, feeds = {}, {}, {}, {}
        for layout, text in texts.items():
            regions = count_regions(text)
            if regions != len(rings):
                raise ValueError(f"{name} {layout}: {regions} ring region(s), {len(rings)} decision(s)")
            suffixes = ("_fwd", "_bwd") if grad else ("",)
            names_ = [_file_name(layout, suffix) for suffix in suffixes]
            for k, file in enumerate(names_):
                with open(os.path.join(out_dir, name, file), "w") as f:
                    f.write(device_program(text, None, k))
            files[layout] = [names_] * cp  # the coordinate is the programs' argument; a coordinate's programs add up
            tiles[layout] = tiles_per_device(text, cp)  # the first (forward) ring region's
            if grad:
                feeds[layout] = [region_feeds(text, k) for k in range(len(names_))]
                counted = ring_tiles(text, cp)  # the backward's count fed the case indices the forward's computed
                if counted[0]["tiles"] != tiles[layout][0]:
                    raise AssertionError(f"{name} {layout}: forward counts differ: {counted[0]} {tiles[layout]}")
                backward[layout] = [counted[1]["tiles"], counted[1]["critical"]]
                if pair.get(layout) is not None and pair[layout]["critical"] != [c["critical"] for c in counted]:
                    print(f"{name} {layout}: the pass's critical paths {pair[layout]['critical']}, counted here "
                          f"{[c['critical'] for c in counted]}", file=sys.stderr, flush=True)
                if pair.get(layout) is None:
                    pair[layout] = {"critical": [c["critical"] for c in counted],
                                    "ideal": [c["ideal"] for c in counted],
                                    "from": "counted here on this layout's module"}
        kind = "jax.grad of sum(attention ** 2), plain autodiff (forward and backward rings)" if grad else "forward"
        manifest = {"kernel": f"blockwise ring attention{USER_BUILDERS[builder][1]} as users write it: {described}, "
                              f"{kind}", "kernel_id": name, "builder": builder,
                    "cp": cp, "tokens_per_device": tokens, "heads": heads, "dim": dim, "chunk": chunk,
                    "batch": batch, "dtype": "float32", "grad": grad, "coordinate_argument": True,
                    "picked": picked, "decision": "; ".join(
                        (("forward ring " if k == 0 else "backward ring ") if grad else "") + _decision_text(r)
                        for k, r in enumerate(rings)),
                    "refused": refused, "tiles": tiles, "files": files, "lowered_with": f"jax {jax.__version__}"}
        if grad:
            manifest.update(tiles_backward=backward, pair_tiles=pair, feeds=feeds)
        with open(os.path.join(out_dir, name, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        print(name, picked, manifest["decision"], {k: (max(v[0]), v[1]) for k, v in tiles.items()},
              {k: (max(v[0]), v[1]) for k, v in backward.items()} if grad else "",
              {k: (v["critical"], v["from"]) for k, v in pair.items()} if grad else "", flush=True)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump({"suite": list(names), "grad": grad, "builder": builder}, f)


def _decision_text(r) -> str:
    tiles = "" if r.critical_before is None else (
        f"; tiles on the critical path {r.critical_before} -> {r.critical_after}, ideal {r.ideal:g}")
    return f"{r.strategy}: {'applied' if r.applied else 'not applied'} ({r.why}{tiles})"


# ---------------------------------------------------------------------------------------------------------------
# time (where the accelerator is)


def _numpy_dtype(element: str):
    import jax.numpy as jnp
    return {"bf16": jnp.bfloat16, "f16": jnp.float16, "f32": jnp.float32, "i32": jnp.int32, "ui32": jnp.uint32,
            "i1": jnp.bool_}[element]


def compiled_program(text: str):
    """(compiled executable, argument ShapeDtypeStructs) for a single-device module with a public @main."""
    import jax
    import jax.numpy as jnp
    from jaxlib.mlir import ir

    from shardfix.ir import make_context
    from shardfix.jit import _jax

    with make_context():
        module = ir.Module.parse(text)
        main = _main(module)
        ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)

        def struct(t):
            ranked = ir.RankedTensorType(t)
            return jax.ShapeDtypeStruct(tuple(ranked.shape), _numpy_dtype(str(ranked.element_type)))

        ins, outs = [struct(t) for t in ftype.inputs], [struct(t) for t in ftype.results]

    def stand_in(*args):  # JAX's lowering of the right signature, whose module is then replaced
        return tuple(jnp.zeros(o.shape, o.dtype) for o in outs)

    lowered = jax.jit(stand_in, keep_unused=True).lower(*ins)
    shardings = _jax.compile_shardings(lowered)
    return _jax.relowered(lowered, module, *shardings, jax.stages.Lowered).compile(), ins


def time_programs(out_dir: str, rounds: int) -> dict:
    """Each coordinate's program compiled (once where the coordinate is an argument) and timed alone: the median of
    `rounds` runs after two warm-up runs, in ms; several programs of one coordinate (forward, backward) add up. A
    program's arguments are random, but those the manifest's "feeds" name: the results of the coordinate's earlier
    program (a backward's residuals, its skips' case indices among them), from one more run of that program."""
    import jax
    import numpy as np

    with open(os.path.join(out_dir, "manifest.json")) as f:
        manifest = json.load(f)
    rng = np.random.default_rng(0)
    compiled: dict[str, tuple] = {}
    inputs: dict[tuple, list] = {}  # one set of device arrays a signature
    times: dict[str, list[float]] = {}
    each: dict[str, list[list[float]]] = {}
    started = time.perf_counter()
    coordinate = manifest.get("coordinate_argument")
    for layout, per_coordinate in manifest["files"].items():
        feeds = manifest.get("feeds", {}).get(layout)
        for r, names in enumerate(per_coordinate):
            parts, kept = [], {}  # kept: results of this coordinate's earlier programs that a later one reads
            for j, name in enumerate(names):
                if name not in compiled:
                    with open(os.path.join(out_dir, name)) as f:
                        compiled[name] = compiled_program(f.read())
                program, ins = compiled[name]
                if coordinate:
                    ins = ins[:-1]
                feed = feeds[j] if feeds else [None] * len(ins)
                assert len(feed) == len(ins), (name, len(feed), len(ins))
                free = [s for s, source in zip(ins, feed) if source is None]
                key = tuple((s.shape, str(s.dtype)) for s in free)
                if key not in inputs:
                    inputs[key] = [jax.device_put(rng.standard_normal(s.shape).astype(s.dtype)) for s in free]
                made = iter(inputs[key])
                args = [next(made) if source is None else kept[source[0]][source[1]] for source in feed]
                args += [jax.device_put(np.uint32(r))] if coordinate else []
                for _ in range(2):
                    jax.block_until_ready(program(*args))
                samples = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    jax.block_until_ready(program(*args))
                    samples.append(time.perf_counter() - start)
                parts.append(statistics.median(samples) * 1e3)
                if feeds and any(source and source[0] == j for later in feeds[j + 1:] for source in later):
                    kept[j] = jax.block_until_ready(program(*args))
                del args
            kept.clear()
            total = sum(parts)
            print(f"{manifest['kernel_id']} {layout} r={r}: {total:.2f} ms"
                  + (f" ({' + '.join(f'{part:.2f}' for part in parts)})" if len(parts) > 1 else "")
                  + f" ({time.perf_counter() - started:.0f} s in)", file=sys.stderr, flush=True)
            times.setdefault(layout, []).append(total)
            each.setdefault(layout, []).append(parts)
    device = jax.devices()[0]
    return {**manifest, "ms": times, "ms_each": each, "rounds": rounds,
            "device": getattr(device, "device_kind", str(device)), "timed_with": f"jax {jax.__version__}"}


def title(result: dict) -> str:
    kind = ": jax.grad (forward and backward rings)" if result.get("grad") else ": forward"
    return TITLE.format(KERNELS[result.get("kernel_id", "ejkernel")]) + kind


def render(result: dict) -> str:
    ms = result["ms"]
    rows = ["| layout | ms per coordinate r = 0 .. cp-1 | slowest (critical path, ms) | max / mean |",
            "|---|---|---:|---:|"]
    for layout, values in ms.items():
        rows.append(f"| {layout} | {', '.join(f'{v:.1f}' for v in values)} | {max(values):.1f} "
                    f"| {max(values) / statistics.mean(values):.2f} |")
    speedups = "; ".join(f"{layout}: {max(ms['contiguous']) / max(values):.2f}x" for layout, values in ms.items()
                         if layout != "contiguous")
    return (f"{title(result)}\n\n"
            f"Device: {result['device']} ({result['timed_with']}; modules lowered with {result['lowered_with']}). "
            f"{result['kernel']}: cp={result['cp']}, {result['tokens_per_device']} tokens a device, batch "
            f"{result['batch']}, {result['heads']} heads of {result['dim']}, chunk {result['chunk']}, "
            f"{result['dtype']}. Each coordinate's program (the ring region with partition_id = r and the "
            f"collective_permutes passing their operand through) compiled for the one device and timed alone, "
            f"median of {result['rounds']} runs. Decisions: {result['decisions']}.\n\n"
            + "\n".join(rows) + f"\n\nCritical path against contiguous, shorter by: {speedups}.\n\n"
            f"Commands: `python bench/ring_device.py extract DIR {_extract_flags(result)}`, then "
            "`python bench/ring_device.py time DIR --section` on the accelerator.\n")


USER_TITLE = ("## ring-reorder on an accelerator: the layout the tile count picks, for the blockwise kernels users "
              "write{} (forward)")
TIE = 0.03  # two layouts whose slowest coordinates are within 3% of each other are as fast (timing noise)


def _picked_verdict(ms: dict, picked: str, decision: str) -> tuple[dict, str, str]:
    """(each layout's slowest coordinate, the fastest layout, whether the picked one is it: the summary's
    words) from the ms a device of each layout."""
    slowest = {layout: max(values) for layout, values in ms.items()}
    fastest = min(slowest, key=slowest.get)
    verdict = "yes" if slowest[picked] <= slowest[fastest] * (1 + TIE) else "no"
    verdict += f" ({slowest[picked] / slowest[fastest] - 1:+.1%})"
    if slowest[picked] > slowest[fastest] * (1 + TIE) and "permutation costs" in decision:
        verdict += ": left alone for the permutation's cost, which these timings leave out"
    return slowest, fastest, verdict


def _user_rows(result: dict) -> tuple[str, str]:
    """(summary row, the kernel's table) of one user kernel's timings."""
    ms, tiles, picked = result["ms"], result["tiles"], result["picked"]
    slowest, fastest, verdict = _picked_verdict(ms, picked, result["decision"])
    busiest = {layout: max(tiles[layout][0]) for layout in ms}
    measured, counted = (slowest["contiguous"] / slowest[picked], busiest["contiguous"] / busiest[picked])
    summary = (f"| {result['kernel_id']} | {picked} | {fastest} ({slowest[fastest]:.1f} ms) | {verdict} "
               f"| {measured:.2f}x | {counted:.2f}x |")
    rows = [f"### {result['kernel_id']}: {result['kernel'].split(': ', 1)[1]}", "",
            f"Decision under the defaults: {result['decision']}." + (
                f" Not forced: {result['refused']}." if result.get("refused") else ""), "",
            "| layout | tiles a device, r = 0 .. cp-1 (critical path) | ms a device, r = 0 .. cp-1 | slowest (ms) "
            "| max / mean | contiguous / this: measured, by tiles |", "|---|---|---|---:|---:|---|"]
    for layout, values in ms.items():
        mark = " (picked)" if layout == picked else ""
        rows.append(f"| {layout}{mark} | {', '.join(map(str, tiles[layout][0]))} ({tiles[layout][1]}) "
                    f"| {', '.join(f'{v:.1f}' for v in values)} | {slowest[layout]:.1f} "
                    f"| {slowest[layout] / statistics.mean(values):.2f} "
                    f"| {slowest['contiguous'] / slowest[layout]:.2f}x, "
                    f"{busiest['contiguous'] / busiest[layout]:.2f}x |")
    return summary, "\n".join(rows)


USER_GRAD_TITLE = ("## ring-reorder on an accelerator: the layout the tile count picks, for the blockwise kernels "
                   "users write{} (jax.grad: forward and backward rings, plain autodiff)")


def _builder(result: dict) -> str:
    """The builder of a user kernel's results (blockwise_ring where its manifest, from before there were two, names
    none)."""
    return result.get("builder", "blockwise_ring")


def user_title(result: dict) -> str:
    """The section heading of a user suite's results: its builder's (blockwise_ring's as it always was), forward or
    gradient."""
    return (USER_GRAD_TITLE if result.get("grad") else USER_TITLE).format(USER_BUILDERS[_builder(result)][1])


def _pair_text(pair: dict | None) -> str:
    if pair is None:
        return "not counted"
    source = "counted" if pair["from"].startswith("counted") else "decision"
    return (f"{' + '.join(map(str, pair['critical']))} (ideal "
            f"{' + '.join(f'{i:g}' for i in pair['ideal'])}; {source})")


def _ratio(before, after) -> str:
    return f"{before / after:.2f}x" if before and after else "n/a"


def _user_grad_rows(result: dict) -> tuple[str, str]:
    """(summary row, the kernel's table) of one user kernel's gradient timings: each coordinate's forward and
    backward programs added up."""
    ms, each, picked = result["ms"], result["ms_each"], result["picked"]
    forward, backward, pair = result["tiles"], result["tiles_backward"], result["pair_tiles"]
    slowest, fastest, verdict = _picked_verdict(ms, picked, result["decision"])
    busiest = {layout: max(f + b for f, b in zip(forward[layout][0], backward[layout][0])) for layout in ms}
    critical = {layout: sum(pair[layout]["critical"]) if pair.get(layout) else None for layout in ms}
    summary = (f"| {result['kernel_id']} | {picked} | {fastest} ({slowest[fastest]:.1f} ms) | {verdict} "
               f"| {slowest['contiguous'] / slowest[picked]:.2f}x "
               f"| {_ratio(critical['contiguous'], critical[picked])} "
               f"| {_ratio(busiest['contiguous'], busiest[picked])} |")
    rows = [f"### {result['kernel_id']}: {result['kernel'].split(': ', 1)[1]}", "",
            f"Decisions under the defaults: {result['decision']}." + (
                f" Not forced: {result['refused']}." if result.get("refused") else ""), "",
            "| layout | tiles a device, r = 0 .. cp-1: forward; backward (each ring's critical path) "
            "| the pair's critical paths, forward + backward (ideal; source) "
            "| ms a device (forward + backward), r = 0 .. cp-1 | slowest (ms): forward + backward | max / mean "
            "| contiguous / this: measured, by the pair's critical paths, by the busiest device's tiles |",
            "|---|---|---|---|---|---:|---|"]
    for layout, values in ms.items():
        mark = " (picked)" if layout == picked else ""
        worst = values.index(slowest[layout])
        rows.append(f"| {layout}{mark} | {', '.join(map(str, forward[layout][0]))} ({forward[layout][1]}); "
                    f"{', '.join(map(str, backward[layout][0]))} ({backward[layout][1]}) "
                    f"| {_pair_text(pair.get(layout))} "
                    f"| {', '.join(f'{v:.1f}' for v in values)} "
                    f"| {slowest[layout]:.1f} ({' + '.join(f'{p:.1f}' for p in each[layout][worst])}, r={worst}) "
                    f"| {slowest[layout] / statistics.mean(values):.2f} "
                    f"| {slowest['contiguous'] / slowest[layout]:.2f}x, "
                    f"{_ratio(critical['contiguous'], critical[layout])}, "
                    f"{_ratio(busiest['contiguous'], busiest[layout])} |")
    return summary, "\n".join(rows)


def render_user(results: list[dict]) -> str:
    first = results[0]
    grad = bool(first.get("grad"))
    builder = _builder(first)
    if any(_builder(r) != builder for r in results):
        raise ValueError(f"one suite, several builders: {sorted({_builder(r) for r in results})}")
    kernel, _, loops = USER_BUILDERS[builder]
    summaries, tables = zip(*((_user_grad_rows if grad else _user_rows)(r) for r in results))
    if grad:
        what = ("jax.grad of sum(attention ** 2) with respect to q, k and v, plain autodiff (no custom_vjp): a "
                "forward ring region and a backward ring region, ")
        how = ("Each layout's forward and backward ring regions compiled once each for the one device with "
               "partition_id as an argument and collective_permutes passing their operand through; for each "
               "coordinate r the forward is timed, run once more, and its results (the residuals the backward "
               "reads, the case index of each skipped chunk pair among them) fed to the backward, which is then "
               f"timed; a coordinate's time is the sum of the two medians of {first['rounds']} runs. Tiles: the "
               "chunk pairs each coordinate computes in the forward ring and in the backward ring, counted by "
               "ring-reorder's counter on that layout's module (the backward's skips read the case indices the "
               "forward saved: its count is fed those the forward's count computed, as the pass's own count is); "
               "in brackets each ring's critical path, the sum over ring steps of the busiest device's tiles. The "
               "pair's critical paths are the pass's figures from its decisions under the defaults (as written "
               "and in the layout picked; \"decision\"), or, for a layout only forced (the decorator's forced runs "
               "report no figures), the same counter's on that layout's module (\"counted\"). A backward tile "
               "costs about twice a forward one, so the tile ratios, which add the two rings' tiles, weigh them "
               "alike.")
        header = ("| kernel | picked (defaults) | fastest measured (slowest coordinate, forward + backward) "
                  "| picked is the fastest | contiguous / picked: measured | by the pair's critical paths "
                  "(forward + backward) | by the busiest device's tiles (forward + backward) |\n"
                  "|---|---|---|---|---:|---:|---:|\n")
        flags = " --grad"
    else:
        what, flags = "", ""
        how = (f"Each layout's ring region compiled once for the one device with partition_id as an argument and "
               f"collective_permutes passing their operand through, run as each coordinate r, median of "
               f"{first['rounds']} runs. Tiles: the chunk pairs each coordinate computes, counted by ring-reorder's "
               f"counter on that layout's module (in brackets the pass's critical path, the sum over ring steps of "
               f"the busiest device's).")
        header = ("| kernel | picked (defaults) | fastest measured (slowest coordinate) | picked is the fastest "
                  "| contiguous / picked: measured | by tiles (busiest device) |\n|---|---|---|---|---:|---:|\n")
    return (f"{user_title(first)}\n\n"
            f"Device: {first['device']} ({first['timed_with']}; modules lowered with {first['lowered_with']}). "
            f"tests/support/ring_user_kernels.{builder} ({loops}), {what}each mask kind: cp={first['cp']}, "
            f"{first['tokens_per_device']} tokens a device, {first['batch'] * first['heads']} heads of "
            f"{first['dim']} (in the kernel's batch), chunk {first['chunk']}, float32. {how} The "
            f"slowest coordinate is the critical path of a ring whose steps don't wait on one another; a picked "
            f"layout within {TIE:.0%} of the fastest counts as the fastest.\n\n"
            + header + "\n".join(summaries) + "\n\n" + "\n\n".join(tables)
            + f"\n\nCommands: `python bench/ring_device.py extract DIR --kernel {kernel}{flags}` (in .venv-oldest), "
            "then `python bench/ring_device.py time DIR --section` on the accelerator.\n")


def _extract_flags(result: dict) -> str:
    kernel = result.get("kernel_id", "ejkernel")
    flags = f"--kernel {kernel} --dtype {result['dtype']}" + (" --grad" if result.get("grad") else "")
    return flags + (" (in .venv-oldest)" if kernel == "ejkernel" else "")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="lower the ring and write each coordinate's program")
    ex.add_argument("out_dir")
    for name, default in (("cp", 8), ("tokens", 8192), ("heads", 8), ("dim", 128), ("chunk", 1024), ("batch", 1)):
        ex.add_argument(f"--{name}", type=int, default=default)
    ex.add_argument("--grad", action="store_true", help="jax.grad of the attention: forward and backward rings")
    ex.add_argument("--kernel", choices=sorted(KERNELS), default="ejkernel")
    ex.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ex.add_argument("--masks", default=",".join(USER), help=f"--kernel user, user-python: which of {', '.join(USER)}")
    tm = sub.add_parser("time", help="compile and time each coordinate's program on jax.devices()[0]")
    tm.add_argument("out_dir")
    tm.add_argument("--rounds", type=int, help="runs timed a program (a suite: 10 unless given)")
    tm.add_argument("--section", action="store_true", help="write the table to bench/RESULTS.md")
    tm.add_argument("--json", help="also write the raw figures here")
    args = ap.parse_args(argv)
    if args.command == "extract":
        os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.cp}")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
        users = {kernel: builder for builder, (kernel, _, _) in USER_BUILDERS.items()}
        if args.kernel in users:
            extract_user(args.out_dir, args.masks.split(","), args.cp, args.tokens, args.heads, args.dim, args.chunk,
                         args.batch, args.grad, users[args.kernel])
        else:
            extract(args.out_dir, args.cp, args.tokens, args.heads, args.dim, args.chunk, args.batch, args.grad,
                    args.kernel, args.dtype)
        return
    with open(os.path.join(args.out_dir, "manifest.json")) as f:
        suite = json.load(f).get("suite")
    if suite:
        result = [time_programs(os.path.join(args.out_dir, name), args.rounds or 10) for name in suite]
        heading, section = user_title(result[0]), render_user(result)
    else:
        result = time_programs(args.out_dir, args.rounds or 20)
        heading, section = title(result), render(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(section)
    if args.section:
        sys.path.insert(0, HERE)
        import results
        results.replace_section(heading, section)


if __name__ == "__main__":
    main()

"""Balance of a ring on a real accelerator, one ring device's program at a time.

A machine with one accelerator can't run a ring of eight, but the work of each ring device can be timed alone:
what decides which tiles a device computes is its ring coordinate and the hop counter (positions), not the data
that travels. So for each coordinate r the ring region is cut out of the module as its own function, every
`partition_id` becomes the constant r and every `collective_permute` passes its operand through (the device keeps
its own block: same shapes, same skips), and that program is compiled and timed. The ring's critical path is the
slowest r; max over mean says how even the work is.

Two steps, because the kernel's client and the accelerator may sit in different environments:

    python bench/ring_device.py extract OUT_DIR [--kernel ejkernel|liu] [--grad] [--cp 8] [--tokens 8192]
            [--heads 8] [--dim 128] [--chunk 1024]
        (ejkernel's causal ring attention (in .venv-oldest: it needs jax~=0.10) or Liu et al.'s RingAttention
        (PyPI ringattention), lowered on cp simulated CPU devices as written and through @autofix_shardings;
        writes one module per layout and coordinate, and manifest.json)
    python bench/ring_device.py time OUT_DIR [--rounds 20] [--section]
        (where the accelerator is: compiles and times every program on jax.devices()[0]; prints the table,
        with --section writes it to bench/RESULTS.md)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = {"ejkernel": "ejkernel's causal ring attention", "liu": "Liu et al.'s causal RingAttention"}
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


def device_program(text: str, coordinate: int, which: int = 0) -> str:
    """Ring region number `which` of `text` (a lowered module) as a single-device module for ring coordinate
    `coordinate`."""
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
        with ir.InsertionPoint(main):
            program = func.FuncOp("ring_device", ([a.type for a in body.arguments], results))
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
                if op.operation.name == "stablehlo.partition_id":
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


def extract(out_dir: str, cp: int, tokens: int, heads: int, dim: int, chunk: int, batch: int, grad: bool,
            kernel: str = "ejkernel", dtype: str = "bfloat16") -> None:
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={cp}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
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


# ---------------------------------------------------------------------------------------------------------------
# time (where the accelerator is)


def _numpy_dtype(element: str):
    import jax.numpy as jnp
    return {"bf16": jnp.bfloat16, "f16": jnp.float16, "f32": jnp.float32, "i32": jnp.int32, "i1": jnp.bool_}[element]


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
    import jax
    import numpy as np

    with open(os.path.join(out_dir, "manifest.json")) as f:
        manifest = json.load(f)
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {}
    for layout, per_coordinate in manifest["files"].items():
        for names in per_coordinate:
            total = 0.0
            for name in names:
                with open(os.path.join(out_dir, name)) as f:
                    compiled, ins = compiled_program(f.read())
                args = [jax.device_put(rng.standard_normal(s.shape).astype(s.dtype)) for s in ins]
                for _ in range(3):
                    jax.block_until_ready(compiled(*args))
                samples = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    jax.block_until_ready(compiled(*args))
                    samples.append(time.perf_counter() - start)
                total += statistics.median(samples) * 1e3
                print(layout, name, f"{statistics.median(samples) * 1e3:.2f} ms", file=sys.stderr, flush=True)
            times.setdefault(layout, []).append(total)
    device = jax.devices()[0]
    return {**manifest, "ms": times, "rounds": rounds, "device": getattr(device, "device_kind", str(device)),
            "timed_with": f"jax {jax.__version__}"}


def title(result: dict) -> str:
    return TITLE.format(KERNELS[result.get("kernel_id", "ejkernel")]) + (": jax.grad (forward and backward rings)" if result.get("grad") else ": forward")


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
    tm = sub.add_parser("time", help="compile and time each coordinate's program on jax.devices()[0]")
    tm.add_argument("out_dir")
    tm.add_argument("--rounds", type=int, default=20)
    tm.add_argument("--section", action="store_true", help="write the table to bench/RESULTS.md")
    tm.add_argument("--json", help="also write the raw figures here")
    args = ap.parse_args(argv)
    if args.command == "extract":
        extract(args.out_dir, args.cp, args.tokens, args.heads, args.dim, args.chunk, args.batch, args.grad, args.kernel, args.dtype)
        return
    result = time_programs(args.out_dir, args.rounds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    section = render(result)
    print(section)
    if args.section:
        sys.path.insert(0, HERE)
        import results
        results.replace_section(title(result), section)


if __name__ == "__main__":
    main()

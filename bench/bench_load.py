"""Load + walk + print with shardfix against MLIR's plain parse + print, on lowered modules of three sizes."""

from __future__ import annotations

import common  # noqa: F401  (sets XLA_FLAGS first)
from common import interleaved, layered_model, mesh_2x4


def main() -> str:
    from jax._src.lib.mlir import ir

    from shardfix.ir import make_context, parse_module, walk_shardings

    ctx = make_context()
    mesh = mesh_2x4(explicit=False)  # the layers' indivisible constraints reach the module
    rows = ["| layers | module size (KiB) | sharding sites | plain parse+print (ms) | shardfix load+walk+print (ms) "
            "| ratio |", "|---:|---:|---:|---:|---:|---:|"]
    for layers in (8, 64, 256):
        fn, args = layered_model(mesh, layers)
        text = fn.lower(*args).as_text(debug_info=True)

        def plain():
            with ctx:
                return str(ir.Module.parse(text))

        sites = []

        def ours():
            module = parse_module(text, ctx, "<lowered>")
            sites[:] = walk_shardings(module)
            with ctx:
                return module.get_asm(assume_verified=True)

        t_plain, t_ours = interleaved(plain, ours)
        rows.append(f"| {layers} | {len(text) / 1024:.0f} | {len(sites)} | {t_plain * 1e3:.1f} | {t_ours * 1e3:.1f} "
                    f"| {t_ours / t_plain:.2f}x |")
    return "## Load + walk + print vs plain parse + print\n\n" + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(main())

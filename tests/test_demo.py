"""The demo's before/after table (examples/demo.py, part 2) says per argument what was written, what runs, and the
bytes each device holds."""

import importlib.util
import os

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_boundary_table():
    spec = importlib.util.spec_from_file_location("demo", os.path.join(ROOT, "examples", "demo.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    args = (np.ones((6, 8), np.float32), np.ones((3000, 2), np.float32))
    running = (NamedSharding(mesh, P(None, "tp")), NamedSharding(mesh, P()))
    assert demo.boundary_table(("w", "table"), args, (P("fsdp", "tp"), None), running) == [
        "argument  shape      you wrote        runs as        bytes a device (whole array)",
        "w         (6, 8)     P('fsdp', 'tp')  P(None, 'tp')  48 B (192 B, 1/4)",
        "table     (3000, 2)  None             P()            23.4 KB (23.4 KB, replicated)",
    ]

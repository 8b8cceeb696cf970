"""Two processes with 4 CPU devices each (jax.distributed on localhost) give the one-process result."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from multiprocess_model import W, X, model
from shardfix import autofix_shardings

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one(tmp_path):
    out_path = tmp_path / "out.npy"
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in sys.path if p])
    workers = [subprocess.Popen([sys.executable, os.path.join(HERE, "multiprocess_worker.py"), str(i), port,
                                 str(out_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for i in range(2)]
    logs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n----\n".join(logs)
    assert "fixes: [('in_shardings[0] (shape (6, 8))', \"P('dp', None)\")" in logs[0]

    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    single = autofix_shardings(model(mesh), mesh=mesh, in_shardings=(P("dp", "sp"), P()), on_fix="ignore")(X, W)
    np.testing.assert_array_equal(np.load(out_path), np.asarray(single))
    np.testing.assert_allclose(np.load(out_path), np.tanh(X @ W) * 2.0 + 1.0, rtol=1e-6)

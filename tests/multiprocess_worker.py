"""One of two processes (4 CPU devices each) running a decorated function over the global 8-device mesh.

Usage: multiprocess_worker.py PROCESS_ID PORT OUT.npy
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id, port, out_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                           initialization_timeout=120)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from multiprocess_model import X, W, model  # noqa: E402
from shardfix import autofix_shardings  # noqa: E402

assert jax.device_count() == 8 and jax.local_device_count() == 4
mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
f = autofix_shardings(model(mesh), mesh=mesh, in_shardings=(P("dp", "sp"), P()), on_fix="ignore")
x = jax.make_array_from_callback(X.shape, NamedSharding(mesh, P("dp")), lambda idx: X[idx])
w = jax.make_array_from_callback(W.shape, NamedSharding(mesh, P()), lambda idx: W[idx])
lowered = f.lower(x, w)
out = multihost_utils.process_allgather(f(x, w), tiled=True)
if process_id == 0:
    np.save(out_path, np.asarray(out))
    print("fixes:", [(fx.site, fx.after) for fx in lowered.fixes])
jax.distributed.shutdown()

"""The decorated function's boundary: arguments committed to another sharding than their in_sharding are moved
(and the move is reported), in/out sharding trees that don't fit the arguments or results and a `mesh=` that is no
mesh fail with a message naming the place, and unreduced/reduced axes survive in/out sharding correction."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from shardfix import ShardingFixWarning, autofix_shardings

MESH = jax.make_mesh((2, 4), ("dp", "tp"))
X = np.arange(64, dtype=np.float32).reshape(8, 8) / 10.0
W = np.arange(32, dtype=np.float32).reshape(8, 4) / 10.0


def matmul(x, w):
    return x @ w


def params_times_batch(params, batch):
    return params["w"] @ batch


@pytest.mark.parametrize("mesh", [MESH, jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)],
                         ids=["explicit", "auto"])
def test_argument_committed_elsewhere_is_moved_and_reported(mesh):
    x = jax.device_put(X, NamedSharding(mesh, P(None, "tp")))
    f = autofix_shardings(matmul, in_shardings=(P("dp"), P()), mesh=mesh)
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        first = f(x, W)  # the call
        second = f(x, W)
    for out in (first, second):
        np.testing.assert_allclose(np.asarray(out), X @ W, rtol=1e-6)
    call_line = next(i for i, line in enumerate(open(__file__), 1) if line.rstrip().endswith("# the call"))
    told = [w for w in told if issubclass(w.category, ShardingFixWarning)]
    assert [(w.filename, w.lineno) for w in told] == [(__file__, call_line)]  # once: the second call is cached
    assert str(told[0].message) == (
        "shardfix changed 1 sharding(s) of matmul:\n"
        f"  {__file__}:{call_line}: argument x (shape (8, 8)): P(None, 'tp') -> P('dp',) [moved-argument]\n"
        "      committed to P(None, 'tp'); moved to P('dp',), its in_sharding, on each call\n"
        "      per device: 64 -> 128 bytes (x2.00)")
    assert x.sharding.spec == P(None, "tp")  # the caller's array is left where it was


def test_calls_that_move_arguments_correct_and_trace_once():
    traced = []

    def scaled(x, w):
        traced.append(x.shape)  # runs each time JAX traces the function
        return x @ w * 2.0

    x = jax.device_put(X, NamedSharding(MESH, P(None, "tp")))
    f = autofix_shardings(scaled, in_shardings=(P("dp"), P()), out_shardings=P("dp"), mesh=MESH, on_fix="ignore")
    f(x, W)
    first = len(traced)  # the result shapes for out_shardings, then the program
    for _ in range(3):
        out = f(x, W)  # back in Python to move x, but neither corrected nor traced again
    assert len(traced) == first and f.cache_misses == 4
    np.testing.assert_allclose(np.asarray(out), X @ W * 2.0, rtol=1e-6)
    assert out.sharding.spec == P("dp") and x.sharding.spec == P(None, "tp")


def test_the_same_function_decorated_again_reports_again():
    messages = []
    for _ in range(2):  # the same function with the same options, decorated twice: each tells its first call
        f = autofix_shardings(matmul, in_shardings=(P("dp", "fsdp"), P()), mesh=MESH)
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            f(X, W)
            f(X, W)
        messages.append([str(w.message) for w in told if issubclass(w.category, ShardingFixWarning)])
    assert messages[0] == messages[1] and len(messages[0]) == 1
    assert "in_shardings[0] (shape (8, 8)): P('dp', 'fsdp') -> P('dp', None) [unknown-axis]" in messages[0][0]


MISMATCHES = [
    (matmul, (P("dp"), P(), P()), (X, W),
     "in_shardings must be a tree prefix of the function's positional arguments: in_shardings is a tuple of length 3 "
     "but the function takes 2 positional argument(s) (x, w); give one entry per argument, or one PartitionSpec or "
     "Sharding for all"),
    (matmul, ({"a": P()}, P()), (X, W),
     "in_shardings must be a tree prefix of the function's positional arguments: in_shardings[0] is a dict with keys "
     "['a'], but the argument it applies to, x, is an array of shape (8, 8)"),
    (params_times_batch, ({"w": P(), "b": P()}, P()), ({"w": W.T, "c": W}, X),
     "in_shardings must be a tree prefix of the function's positional arguments: in_shardings[0] is a dict with keys "
     "['b', 'w'], but the argument it applies to, params, is a dict with keys ['c', 'w']"),
    (params_times_batch, ({"w": (P(), P())}, P()), ({"w": W.T}, X),
     "in_shardings must be a tree prefix of the function's positional arguments: in_shardings[0]['w'] is a tuple of "
     "length 2, but the argument it applies to, params['w'], is an array of shape (4, 8)"),
]


@pytest.mark.parametrize("fun, in_shardings, args, message", MISMATCHES)
def test_in_shardings_that_do_not_fit_the_arguments(fun, in_shardings, args, message):
    f = autofix_shardings(fun, in_shardings=in_shardings, mesh=MESH)
    where = f"{__file__}:{fun.__code__.co_firstlineno}"
    with pytest.raises(ValueError) as raised:
        f(*args)
    assert str(raised.value) == f"{where}: {message}"


def test_out_shardings_that_do_not_fit_the_result():
    f = autofix_shardings(matmul, out_shardings=(P(), P()), mesh=MESH)
    with pytest.raises(ValueError) as raised:
        f(X, W)
    assert str(raised.value) == (
        f"{__file__}:{matmul.__code__.co_firstlineno}: out_shardings must be a tree prefix of the function's result: "
        "out_shardings is a tuple of length 2, but the value it applies to, result, is an array of shape (8, 4)")


@pytest.mark.parametrize("mesh, shown", [("dp=2,tp=4", "str 'dp=2,tp=4'"), ((2, 4), "tuple (2, 4)"),
                                         (MESH.abstract_mesh, f"AbstractMesh {MESH.abstract_mesh!r}")])
def test_bad_mesh_fails_at_decoration(mesh, shown):
    for decorate in (lambda: autofix_shardings(matmul, mesh=mesh), lambda: autofix_shardings(mesh=mesh)(matmul)):
        with pytest.raises(TypeError) as raised:
            decorate()
        assert str(raised.value) == ("autofix_shardings(mesh=...) takes a jax.sharding.Mesh, such as "
                                     f"jax.make_mesh((2, 4), ('dp', 'tp')); got {shown}")


def test_unreduced_survives_out_shardings():
    def partial_sums(x, w):  # each tp shard's partial product, left unreduced over tp
        x, w = jax.sharding.reshard(x, P(None, "tp")), jax.sharding.reshard(w, P("tp", None))
        return jnp.einsum("ij,jk->ik", x, w, out_sharding=P(None, None, unreduced={"tp"}))

    spec = P("dp", "fsdp", unreduced={"tp"})  # an unknown axis beside the unreduced one
    f = autofix_shardings(partial_sums, out_shardings=spec, mesh=MESH)
    with jax.set_mesh(MESH), pytest.warns(ShardingFixWarning):
        lowered = f.lower(X, W)
        total = jax.jit(lambda x, w: jax.sharding.reshard(f(x, w), P()))(X, W)  # summed by the reshard
    fix, = lowered.fixes
    assert (fix.site, fix.before, fix.after) == ("out_shardings (shape (8, 4))", str(spec),
                                                 str(P("dp", None, unreduced={"tp"})))
    np.testing.assert_allclose(np.asarray(total), X @ W, rtol=1e-6)

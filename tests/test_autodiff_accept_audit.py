"""Plain-autodiff backward rings that ring-reorder rewrites with their forward (prove._accept_autodiff), held
against jax.jit: each program's gradient through @autofix_shardings must equal jax.jit's where the backward is
rewritten, and the programs whose backward recomputes positions or depends on a running maximum must stay
refused. The programs attack the ties (a ring called twice, a backward called twice by hand with a cotangent
that varies with the position, one result of three dropped and one returned as aux, a ring reading another's
result), the residuals (a mask only the derivative of a square reads), the stabiliser (a result that is the
log-sum-exp, -inf masks, every score of a row tied) and the positions of the backward (jax.checkpoint)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from shardfix import autofix_shardings
from shardfix.ring import ties
from support import ring_user_kernels as uk
from support.ring_user_programs import meshes

CP = 4
SPEC = P("dp", "cp", None)
NEG = -1e30
_W = np.random.default_rng(7).standard_normal((2, 32, 4)).astype(np.float32)
_POS = np.arange(2 * 32 * 4, dtype=np.float32).reshape(2, 32, 4) / 100  # a cotangent that varies with the position


def _kernel(hook=None, final=None, step_wrap=None, neg=NEG, merge=uk.merge_online):
    """A causal fori ring (positions from axis_index); hook(s, keep, q_pos, k_pos) masks the scores, final(o, m, l)
    makes the result, step_wrap wraps the ring step (jax.checkpoint)."""
    def body(q, k, v):
        n = q.shape[1]
        me = lax.axis_index("cp")
        q_pos = (me * n + jnp.arange(n))[:, None]

        def step(i, carry):
            acc, k, v = carry
            k_pos = (((me - i) % CP) * n + jnp.arange(n))[None, :]
            s, keep = uk.scores(q, k), q_pos >= k_pos
            s = jnp.where(keep, s, neg) if hook is None else hook(s, keep, q_pos, k_pos)
            acc = merge(acc, s, v, i)
            return (acc,) + tuple(lax.ppermute(t, "cp", uk.ring(CP)) for t in (k, v))

        m, l = uk.row_stats(q, neg)
        m, l, o = lax.fori_loop(0, CP, step if step_wrap is None else step_wrap(step),
                                ((m, l, jnp.zeros_like(q)), k, v))[0]
        return o / l[..., None] if final is None else final(o / l[..., None], m, l)
    return body


def _loss(y):
    return jnp.sum(y * _W + y * y / 2)


def _ring(mesh, body, outs=1):
    return jax.shard_map(body, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC if outs == 1 else (SPEC,) * outs)


def _args(mesh, tied: bool = False):
    """q, k, v [2, 32, 4]; tied: every key one vector (each query's scores all tie)."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 32, 4)).astype(np.float32) for _ in range(3))
    if tied:
        k = np.broadcast_to(rng.standard_normal((1, 1, 4)), q.shape).astype(np.float32)
    return [jax.device_put(x, NamedSharding(mesh, SPEC)) for x in (q, k, v)]


def _grad(f):
    return jax.grad(lambda q, k, v: _loss(f(q, k, v)), argnums=(0, 1, 2))


def _called_twice(mesh):
    f = _ring(mesh, _kernel())
    return jax.grad(lambda q, k, v: _loss(f(q, k, v)) + _loss(f(k, q, v) * 0.5), argnums=(0, 1, 2))


def _vjp_twice(mesh):
    """jax.vjp by hand, its backward called twice, with cotangents that vary with the position."""
    f = _ring(mesh, _kernel())

    def program(q, k, v):
        y, back = jax.vjp(f, q, k, v)
        return back(y * _POS), back(jnp.cos(y) * 3 + _POS[:, ::-1])
    return program


def _three_results(mesh):
    """Three results of one type, the second dropped from the loss and returned as aux, the third read first."""
    def body(q, k, v):
        return _kernel()(q, k, v), _kernel()(k, q, v) * 3.0, _kernel()(v, k, q) * 2.0 + q
    f = _ring(mesh, body, outs=3)

    def loss(q, k, v):
        a, b, c = f(q, k, v)
        return _loss(c * 0.5) + jnp.sum(jnp.cos(a) * _W), b
    return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)


def _stacked(mesh):
    f = _ring(mesh, _kernel())
    return _grad(lambda q, k, v: f(f(q, k, v), k, v))


def _mask_squared(mesh):
    """(where(keep, s, 0))**2 in the scores: the derivative reads the mask as a residual."""
    return _grad(_ring(mesh, _kernel(hook=lambda s, keep, qp, kp: jnp.where(keep, s, NEG)
                                     + 0.1 * jnp.where(keep, s, 0.0) ** 2)))


def _lse_result(mesh):
    """o + lse (m + log l): the same for any value of the running maxima."""
    return _grad(_ring(mesh, _kernel(final=lambda o, m, l: o + (m + jnp.log(l))[..., None])))


def _window_guarded(mesh):
    """-inf masks, a window of 6 (rows see no key at some steps) and the guarded merge."""
    return _grad(_ring(mesh, _kernel(hook=lambda s, keep, qp, kp: jnp.where(keep & (qp - kp < 6), s, -jnp.inf),
                                     neg=-jnp.inf, merge=uk.merge_guarded)))


def _soft_capped(mesh):
    """Logit soft-capping, cap * tanh(s / cap), as Gemma writes it: tanh's derivative is the derivative of what it
    lowers to (JAX 0.12 computes it with `one_minus_square`, a standard primitive)."""
    return _grad(_ring(mesh, _kernel(hook=lambda s, keep, qp, kp: jnp.where(keep, 5.0 * jnp.tanh(s / 5.0), NEG))))


def _checkpointed(policy):
    def program(mesh):
        return _grad(_ring(mesh, _kernel(step_wrap=lambda step: jax.checkpoint(step, policy=policy))))
    return program


def _plus_max(mesh):
    """The running maximum itself in the result: its cotangent is not zero."""
    return _grad(_ring(mesh, _kernel(final=lambda o, m, l: o + 0.1 * m[..., None])))


_CACHE: dict = {}


def _compare(make, strategy: str = "zigzag", mesh_name: str = "explicit", tied: bool = False):
    """(ring decisions, max |fixed - jax.jit| over the program's outputs, max |jax.jit|)."""
    key = (make, strategy, mesh_name, tied)
    if key not in _CACHE:
        mesh = meshes()[mesh_name]
        program, args = make(mesh), _args(mesh, tied)
        low = autofix_shardings(program, ring_reorder=strategy, on_fix="ignore").lower(*args)
        got = low.compile()(*args)
        with jax.set_mesh(mesh):
            want = jax.jit(program)(*args)
        pairs = [(np.asarray(a, np.float64), np.asarray(b, np.float64))
                 for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
        diff = max(float(np.max(np.abs(a - b))) for a, b in pairs)
        top = max(float(np.max(np.abs(b))) for _, b in pairs)
        _CACHE[key] = [(r.applied, r.why) for r in low.rings], diff, top
    return _CACHE[key]


@pytest.mark.parametrize("make, strategy, mesh_name, tied", [
    (_called_twice, "zigzag", "explicit", False),
    (_vjp_twice, "zigzag", "auto", False),
    (_three_results, "striped", "explicit", False),
    (_stacked, "zigzag", "explicit", False),
    (_mask_squared, "zigzag", "explicit", True),
    (_lse_result, "zigzag", "explicit", True),
    (_window_guarded, "zigzag", "explicit", False),
    (_soft_capped, "zigzag", "explicit", False),
    (_checkpointed(jax.checkpoint_policies.everything_saveable), "zigzag", "explicit", False),
])
def test_an_accepted_plain_autodiff_backward_gives_jax_jits_gradient(make, strategy, mesh_name, tied):
    rings, diff, top = _compare(make, strategy, mesh_name, tied)
    assert rings and all(applied for applied, _ in rings), rings
    assert diff <= 1e-6 * max(top, 1.0), (diff, top)


@pytest.mark.parametrize("make, why", [
    (_checkpointed(None), "recomputes positions"),
    (_plus_max, "which fails here: result 0"),
])
def test_a_backward_that_recomputes_positions_or_reads_a_running_maximum_stays_refused(make, why):
    rings, diff, _ = _compare(make)
    assert not any(applied for applied, _ in rings) and any(why in text for _, text in rings), rings
    assert diff == 0.0


def test_a_refusal_names_no_tie_scope():
    """FINDING (a4161b3, jax 0.12.0.1 and 0.10.2): a ring in a jitted helper is refused (conservative), and the
    refusal's location is the region's name stack with the tie scopes in it ("'sdy.manual_computation' at
    shardfix_tie1/shardfix_tie3/shard_map operand 2 ..."): names of shardfix's own making, which the module is
    stripped of, shown to the user as where the region is."""
    def helper(mesh):
        return _grad(jax.jit(_ring(mesh, _kernel())))

    rings, diff, _ = _compare(helper)
    assert diff == 0.0
    assert not any(ties.PREFIX in why for _, why in rings), rings

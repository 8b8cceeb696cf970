"""JAX's own errors about in/out shardings (a plain string where a PartitionSpec goes, UNCONSTRAINED in
in_shardings) come from the decorator and the plugin exactly as from jax.jit: the same error, and with JAX's
traceback filtering no shardfix frame (shardfix's directory is excluded as JAX excludes its own)."""

import os
import traceback

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import shardfix
from shardfix import autofix_shardings

MESH = jax.make_mesh((2, 4), ("dp", "tp"))
PACKAGE = os.path.dirname(shardfix.__file__) + os.sep
BAD = {"plain string": ("tp",), "unconstrained": (P(P.UNCONSTRAINED),)}
WAYS = {
    "jax.jit": lambda spec: jax.jit(lambda x: x, in_shardings=spec)(jnp.ones((8, 8))),
    "decorator": lambda spec: autofix_shardings(lambda x: x, in_shardings=spec)(jnp.ones((8, 8))),
    "decorator with options": lambda spec: autofix_shardings(in_shardings=spec)(lambda x: x)(jnp.ones((8, 8))),
    "plugin": lambda spec: jax.jit(lambda x: x, in_shardings=spec)(jnp.ones((8, 8))),
}


@pytest.fixture(autouse=True)
def remove_frames():
    before = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "remove_frames")
    yield
    jax.config.update("jax_traceback_filtering", before)


def error_of(way: str, spec):
    with jax.set_mesh(MESH):
        if way == "plugin":
            with shardfix.enabled():
                return _raised(lambda: WAYS[way](spec))
        return _raised(lambda: WAYS[way](spec))


def _raised(call):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    return info.value


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("way", ["decorator", "decorator with options", "plugin"])
def test_jax_error_as_jax_jit_gives_it(way, bad):
    want = error_of("jax.jit", BAD[bad])
    got = error_of(way, BAD[bad])
    assert (type(got), str(got)) == (type(want), str(want))
    frames = [f.filename for f in traceback.extract_tb(got.__traceback__)]
    assert not [f for f in frames if f.startswith(PACKAGE)], frames

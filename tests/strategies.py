"""Hypothesis strategies for meshes and shardings (valid or not)."""

from hypothesis import strategies as st

from shardfix.sharding import AxisRef, DimSharding, Mesh, TensorSharding

AXIS_NAMES = ["a", "b", "c", "x"]


@st.composite
def meshes(draw, min_axes=1):
    names = draw(st.lists(st.sampled_from(AXIS_NAMES), min_size=min_axes, max_size=3, unique=True))
    return Mesh(tuple((n, draw(st.sampled_from([1, 2, 3, 4, 6, 8]))) for n in names))


def axis_refs(names=AXIS_NAMES + ["z"]):
    full = st.builds(AxisRef, st.sampled_from(names))
    sub = st.builds(AxisRef, st.sampled_from(names), st.integers(1, 8), st.integers(1, 8))
    return st.one_of(full, full, sub)


def dims(names=AXIS_NAMES + ["z"]):
    return st.builds(DimSharding, st.lists(axis_refs(names), max_size=3).map(tuple), st.booleans(),
                     st.one_of(st.none(), st.integers(0, 3)))


def tensor_shardings(mesh_names=("mesh",), names=AXIS_NAMES + ["z"], max_rank=4):
    return st.builds(TensorSharding, st.sampled_from(mesh_names), st.lists(dims(names), max_size=max_rank).map(tuple),
                     st.lists(axis_refs(names), max_size=2).map(tuple), st.lists(axis_refs(names), max_size=2).map(tuple))

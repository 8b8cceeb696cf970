"""get_corrected_named_sharding returns exactly what ejkernel's returns, on hypothesis-generated (shape, spec, mesh)
triples: the same NamedSharding with the same PartitionSpec (entry for entry), or the same error. ejkernel is a
test-only dependency of the oldest leg (it needs jax~=0.10); conftest collects this file there only."""

import itertools

import jax
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from ejkernel.xla_utils.shardings import get_corrected_named_sharding as ejkernel_corrected
from shardfix import get_corrected_named_sharding

NAMES = ("dp", "tp", "sp")
EXAMPLES = 2500
generated = []  # one entry per example compared, checked by the last test


def _meshes():
    sizes = [1, 2, 4, 8]
    out = []
    for rank in (1, 2, 3):
        for shape in itertools.product(sizes, repeat=rank):
            if 1 <= jax.numpy.prod(jax.numpy.asarray(shape)) <= jax.device_count():
                for types in (AxisType.Explicit, AxisType.Auto):
                    out.append(jax.make_mesh(shape, NAMES[:rank], axis_types=(types,) * rank))
    return out


MESHES = _meshes()
AXES = st.sampled_from(NAMES + ("fsdp",))  # "fsdp": an axis no mesh has
ENTRIES = st.one_of(st.none(), AXES, st.lists(AXES, min_size=1, max_size=3).map(tuple),
                    st.just(P.UNCONSTRAINED))
SHAPES = st.lists(st.sampled_from([0, 1, 2, 3, 4, 6, 8, 12, 16, 50257]), max_size=4).map(tuple)


def outcome(function, shape, spec, mesh):
    try:
        result = function(shape, spec, mesh)
    except Exception as error:  # ejkernel lets JAX's errors through (DuplicateSpecError, ...)
        return "raises", type(error), str(error)
    return "returns", result, result.spec, tuple(result.spec.partitions)


@settings(max_examples=EXAMPLES, deadline=None, database=None)
@given(shape=SHAPES, entries=st.lists(ENTRIES, max_size=5), mesh=st.sampled_from(MESHES))
def test_equals_ejkernel(shape, entries, mesh):
    spec = P(*entries)
    generated.append((shape, spec, mesh.shape))
    assert outcome(get_corrected_named_sharding, shape, spec, mesh) == outcome(ejkernel_corrected, shape, spec, mesh)


@settings(max_examples=300, deadline=None, database=None)
@given(shape=SHAPES, entries=st.lists(ENTRIES, max_size=5), mesh=st.sampled_from(MESHES),
       unreduced=st.sets(st.sampled_from(NAMES), min_size=1, max_size=2))
def test_unreduced_kept(shape, entries, mesh, unreduced):
    """On a spec with unreduced axes (which ejkernel refuses, or drops with the rest of an empty spec), ours corrects
    the partitions as ejkernel corrects the spec without them and keeps the unreduced axes: the result is what
    JAX makes of ejkernel's partitions with those unreduced axes (JAX's error where it refuses them)."""
    unreduced = {a for a in unreduced if a in mesh.axis_names}
    entries = [_without(e, unreduced) for e in entries]
    plain = outcome(ejkernel_corrected, shape, P(*entries), mesh)
    ours = outcome(get_corrected_named_sharding, shape, P(*entries, unreduced=unreduced), mesh)
    if plain[0] == "raises":  # the same error (its text shows the spec, unreduced axes included)
        assert ours[:2] == plain[:2]
    else:
        assert ours == outcome(lambda *_: NamedSharding(mesh, P(*plain[3], unreduced=unreduced)), shape, None, mesh)


def _without(entry, names):
    if isinstance(entry, str):
        return None if entry in names else entry
    if isinstance(entry, tuple):
        kept = tuple(a for a in entry if a not in names)
        return kept or None
    return entry


def test_enough_examples_were_compared():
    if not generated:  # run apart from it (another worker ran it): compare them here
        test_equals_ejkernel()
    assert len(generated) >= 2000, len(generated)

"""Loading (strict and lenient) and the sharding-site walker."""

import os

import pytest

from shardfix.ir import LoadError, parse_module, source_loc, transform_shardings, walk_shardings
from shardfix.ir.loader import load_module
from shardfix.lenient import looks_valid
from shardfix.sdy_syntax import parse_tensor_sharding

HERE = os.path.dirname(__file__)
EVERY_SITE = os.path.join(HERE, "data", "every_site.mlir")


def load(ctx, path=EVERY_SITE, **kw):
    with open(path) as f:
        return parse_module(f.read(), ctx, path, **kw)


def test_walker_visits_every_site_kind(ctx):
    sites = walk_shardings(load(ctx))
    seen = [(s.kind, s.description, s.sharding.body(), sorted(s.bound_axes), sorted(s.manual_axes),
             s.is_entry_boundary, s.shape) for s in sites]
    assert seen == [
        ("arg", "argument 0 of @main", '<@mesh, [{"a"}, {}]>', [], [], True, (8, 8)),
        ("result", "result 0 of @main", '<@mesh, [{}, {"b"}]>', [], [], True, (8, 8)),
        ("op-result", "result 0 of 'stablehlo.tanh'", '<@mesh, [{"a", "b"}, {}]>', [], [], False, (8, 8)),
        ("constraint", "'sdy.sharding_constraint' sharding", '<@mesh, [{"a", "b"}, {}]>', [], [], False, (8, 8)),
        ("reshard", "'sdy.reshard' sharding", '<@mesh, [{"b"}, {}]>', [], [], False, (8, 8)),
        ("manual-in", "operand 0 of 'sdy.manual_computation'", '<@mesh, [{"b"}, {}]>', [], ["b"], False, (8, 8)),
        ("manual-out", "result 0 of 'sdy.manual_computation'", '<@mesh, [{"b"}, {}]>', [], ["b"], False, (8, 8)),
        ("constraint", "'sdy.sharding_constraint' sharding", '<@mesh, [{}, {"a"}]>', ["b"], [], False, (2, 8)),
        ("named-in", "operand 0 of 'sdy.named_computation'", '<@mesh, [{"a"}, {}]>', [], [], False, (8, 8)),
        ("named-out", "result 0 of 'sdy.named_computation'", '<@mesh, [{}, {"a"}]>', [], [], False, (8, 8)),
        ("edge", "'sdy.data_flow_edge' sharding", '<@mesh, [{}, {"a"}]>', [], [], False, (8, 8)),
        ("constraint", "'sdy.sharding_constraint' sharding", '<@mesh, [{"a", "b"}, {}]>', [], [], False, (8, 8)),
        ("collective", "'sdy.all_gather' out_sharding", '<@mesh, [{"a"}, {}]>', [], [], False, (8, 8)),
        ("arg", "argument 0 of @helper", '<@mesh, [{"a"}, {}]>', [], [], False, (8, 8)),
    ]


def test_walker_locations(ctx):
    sites = walk_shardings(load(ctx))
    assert str(sites[2].loc) == "model.py:12"  # a Python file: file:line, as JAX users read it
    assert str(sites[3].loc) == f"{EVERY_SITE}:5:8"
    assert str(sites[0].loc).startswith(f"{EVERY_SITE}:3:")


def test_replace_every_site(ctx):
    """A pass is a function from sharding to sharding: replacing each site lands in the right attribute."""
    module = load(ctx)
    marker = parse_tensor_sharding('<@mesh, [{}, {}]>')
    # Manual computations and the all_gather (with the constraint feeding it, line 15) must agree with their
    # neighbours; everything else can take any sharding.
    keep = {"manual-in", "manual-out", "collective"}
    changed = transform_shardings(module, lambda s: marker if s.kind not in keep and s.loc.line != 15
                                  and s.shape == (8, 8) else None)
    assert changed == 9
    module.verify()
    text = str(module)
    assert text.count("<@mesh, [{}, {}]>") == 9
    assert 'manual_axes={"b"}' in text and 'sdy.all_gather [{"b"}, {}] %6 out_sharding=<@mesh, [{"a"}, {}]>' in text


INVALID = {
    "unknown axis": ('[{"c"}, {}]', 'unknown axis name: "c"'),
    "duplicate in dim": ('[{"a", "a"}, {}]', 'duplicate axis ref: "a"'),
    "duplicate vs replicated": ('[{"a"}, {}], replicated={"a"}', 'duplicate axis ref: "a"'),
    "rank mismatch": ('[{"a"}, {}, {}]', "sharding doesn't match tensor rank: 3 != 2"),
    "sub-axis size 1": ('[{"a":(2)1}, {}]', "sub-axis sizes must be greater than 1"),
    "sub-axis = axis": ('[{"b":(1)4}, {}]', "sub-axis size is equal to the full axis size"),
    "bad pre-size": ('[{"b":(3)2}, {}]', "sub-axis next pre-size 6 doesn't divide the size of the full axis"),
    "mergeable": ('[{"b":(1)2, "b":(2)2}, {}]', "two consecutive sub-axes can be merged"),
    "sub and full": ('[{"b":(1)2}, {"b"}]', "both sub-axis and full-axis are used"),
    "unordered": ('[{}, {}], replicated={"b", "a"}', "replicated axes are not ordered w.r.t. mesh"),
    "priority on empty": ('[{}p1, {}]', "dim 0 is empty and closed but has a priority"),
}


@pytest.mark.parametrize("dims, message", INVALID.values(), ids=INVALID.keys())
@pytest.mark.parametrize("where", ["arg", "constraint", "per-value", "manual-free"])
def test_lenient_loading_keeps_each_invalid_class(ctx, dims, message, where):
    sharding = f"<@mesh, {dims}>"
    body = {
        "arg": ("%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding" + sharding + "}", "return %arg0 : tensor<8x8xf32>"),
        "constraint": ("%arg0: tensor<8x8xf32>", f"%0 = sdy.sharding_constraint %arg0 {sharding} : tensor<8x8xf32>\n"
                       "  return %0 : tensor<8x8xf32>"),
        "per-value": ("%arg0: tensor<8x8xf32>", "%0 = stablehlo.tanh %arg0 {sdy.sharding = #sdy.sharding_per_value<["
                      + sharding + "]>} : tensor<8x8xf32>\n  return %0 : tensor<8x8xf32>"),
        "manual-free": ("%arg0: tensor<8x8xf32>", '%0 = sdy.manual_computation(%arg0) in_shardings=[' + sharding +
                        '] out_shardings=[<@mesh, [{}, {}]>] manual_axes={} (%x: tensor<8x8xf32>) {\n'
                        '    sdy.return %x : tensor<8x8xf32>\n  } : (tensor<8x8xf32>) -> tensor<8x8xf32>\n'
                        '  return %0 : tensor<8x8xf32>'),
    }[where]
    text = ('sdy.mesh @mesh = <["a"=2, "b"=4]>\n'
            f'func.func @f({body[0]}) -> tensor<8x8xf32> {{\n  {body[1]}\n}}\n')
    with pytest.raises(LoadError) as strict:
        parse_module(text, ctx, "t.mlir")
    assert message in strict.value.diagnostics[0].message
    assert str(strict.value.diagnostics[0].loc).startswith("t.mlir:")
    module = parse_module(text, ctx, "t.mlir", lenient=True)
    held = [s.sharding for s in walk_shardings(module)]
    assert parse_tensor_sharding(sharding) in held  # the module holds the original, unchanged


def test_lenient_loading_bound_manual_axis_and_token(ctx):
    text = ('sdy.mesh @mesh = <["a"=2]>\n'
            'func.func @f(%arg0: tensor<16x32xf32>, %t: !stablehlo.token {sdy.sharding = #sdy.sharding<@mesh, [{"a"}]>}) -> tensor<16x32xf32> {\n'
            '  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"a"}, {}]>] out_shardings=[<@mesh, [{"a"}, {}]>] manual_axes={"a"} (%x: tensor<8x32xf32>) {\n'
            '    %1 = sdy.sharding_constraint %x <@mesh, [{"a"}, {}]> : tensor<8x32xf32>\n'
            '    sdy.return %1 : tensor<8x32xf32>\n'
            '  } : (tensor<16x32xf32>) -> tensor<16x32xf32>\n'
            '  return %0 : tensor<16x32xf32>\n}\n')
    with pytest.raises(LoadError):
        parse_module(text, ctx, "t.mlir")
    sites = walk_shardings(parse_module(text, ctx, "t.mlir", lenient=True))
    assert [s.sharding.body() for s in sites] == ['<@mesh, [{"a"}]>', '<@mesh, [{"a"}, {}]>', '<@mesh, [{"a"}, {}]>',
                                                   '<@mesh, [{"a"}, {}]>']
    assert sites[0].shape is None and sites[3].bound_axes == {"a"}


def test_unloadable_module_is_a_located_error(ctx):
    with pytest.raises(LoadError) as e:
        parse_module('sdy.mesh @mesh = <["a"=2]>\nfunc.func @f() {\n  %0 = stablehlo.bogus\n}', ctx, "x.mlir",
                     lenient=True)
    d = e.value.diagnostics[0]
    assert (d.loc.file, d.loc.line) == ("x.mlir", 3) and d.severity == "error"


@pytest.mark.parametrize("mesh", ['sdy.mesh @mesh = <["a"=2]>',
                                  '"sdy.mesh"() <{mesh = #sdy.mesh<["a"=2]>, sym_name = "mesh"}> : () -> ()',
                                  '#m = #sdy.mesh<["a"=2]>\n"sdy.mesh"() <{mesh = #m, sym_name = "mesh"}> : () -> ()'])
def test_a_sharding_a_collective_reads_stays_as_written(ctx, mesh):
    # A valid module loads as it is; an invalid sharding that an sdy collective checks is held aside only where the
    # collective verifies without it, or without the axes the mesh lacks: it gathers "a", which an operand without
    # a sharding doesn't have but {"a", "zz"} without "zz" does, and {"zz"} without "zz" doesn't.
    text = (f"{mesh}\nfunc.func @f(%1: tensor<8xf32> {{sdy.sharding = #sdy.sharding<@mesh, [{{\"a\"}}]>}}) "
            f"-> tensor<8xf32> {{\n"
            f"  %g = sdy.all_gather [{{\"a\"}}] %1 out_sharding=<@mesh, [{{}}]> : tensor<8xf32>\n"
            f"  return %g : tensor<8xf32>\n}}\n")
    module, held = load_module(text, ctx, "t.mlir", lenient=True)
    assert not held and len(walk_shardings(module)) == 2 and module.verify()
    module, held = load_module(text.replace('[{"a"}]>}', '[{"a", "zz"}]>}'), ctx, "t.mlir", lenient=True)
    assert held and '[{"a", "zz"}]' in str(module)  # as written, for fix-shardings to repair and report
    with pytest.raises(LoadError) as e:
        load_module(text.replace('[{"a"}]>}', '[{"zz"}]>}'), ctx, "t.mlir", lenient=True)
    assert e.value.diagnostics[0].render().startswith(f"t.mlir:{mesh.count(chr(10)) + 2}:")  # the function's line
    assert e.value.diagnostics[0].message.startswith(
        "fix-shardings can't repair this: a sharding that an sdy collective reads (or the collective's own) is wrong, "
        "and no repair of the sharding alone makes the collective agree with it;")


@pytest.mark.parametrize("string", ['<@mesh, [{\\"q\\"}]>', '{sdy.sharding = #sdy.sharding<@mesh, [{\\"q\\"}]>}'])
def test_strings_and_comments_are_not_shardings(ctx, string):
    # the second string is written as a key in a dictionary is: renaming keys as text would change it
    text = ('sdy.mesh @mesh = <["a"=2]>\n'
            '// a comment mentioning <@mesh, [{"zz"}]> {sdy.sharding = #sdy.sharding<@mesh, [{"zz"}]>}\n'
            'func.func @f(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"zz"}]>, '
            f'jax.result_info = "{string}"}}) -> tensor<8xf32> {{\n  return %arg0 : tensor<8xf32>\n}}\n')
    module = parse_module(text, ctx, "t.mlir", lenient=True)
    assert [s.sharding.body() for s in walk_shardings(module)] == ['<@mesh, [{"zz"}]>']
    assert f'jax.result_info = "{string.replace(chr(92) + chr(34), chr(92) + "22")}"' in \
        str(module.get_asm(assume_verified=True))


def test_source_loc_reads_jax_call_sites():
    loc = 'loc(callsite("f"("/home/u/model.py":9:8 to :79) at "<module>"("/home/u/model.py":12:6 to :82)))'
    assert str(source_loc(loc)) == "/home/u/model.py:9"
    assert str(source_loc('loc("x")')) == "x" and source_loc('loc("x")').name == "x"
    assert not source_loc("loc(unknown)")


@pytest.mark.parametrize("sharding, looks", [('[{"a"}, {}]', True), ('[{"a"}, {}], replicated={"b"}', True),
                                             ('[{"zz"}, {}]', False), ('[{"a", "a"}, {}]', False),
                                             ('[{"a":(1)2}, {}]', False), ('[{}, {}], replicated={"zz"}', False)])
def test_the_quick_look_before_a_large_strict_parse(sharding, looks):
    # above 4 MiB it decides whether the strict parse comes first; wrong either way, the load only takes longer
    text = (f'sdy.mesh @mesh = <["a"=2, "b"=2]>\nfunc.func @f(%x: tensor<8x8xf32> {{sdy.sharding = '
            f'#sdy.sharding<@mesh, {sharding}>}}) -> tensor<8x8xf32> {{\n  return %x : tensor<8x8xf32>\n}}\n')
    assert looks_valid(text) is looks
    assert not looks_valid(text.replace("@mesh, [", "@other, ["))  # a mesh the text doesn't define
    assert not looks_valid(text.replace("@mesh, [", 'mesh<["a"=2]>, ['))  # an inline mesh isn't looked at

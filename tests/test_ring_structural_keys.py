"""Structural keys (ring/structural.py): equal exactly when the printed programs are the same up to the names of
the functions they call. A function takes over the key of one printed before when their bytecode, without
locations, is the same name for name; every key here is checked against the key made by printing every function."""

import pytest

from shardfix.ir import make_context, parse_module
from shardfix.ring.detect import module_funcs
from shardfix.ring import bytecode
from shardfix.ring.structural import StructuralKeys


def _kernel(name: str, helper: str, scale: str = "2.0", tag: str = "none", loc: str = "unknown") -> str:
    return f"""
func.func private @{helper}(%x: tensor<4xf32>) -> tensor<4xf32> {{
  %c = stablehlo.constant dense<{scale}> : tensor<4xf32> loc({loc})
  %y = stablehlo.multiply %x, %c : tensor<4xf32> loc({loc})
  return %y : tensor<4xf32>
}}
func.func private @{name}(%x: tensor<4xf32>) -> tensor<4xf32> {{
  %y = func.call @{helper}(%x) {{mhlo.frontend_attributes = {{tag = "{tag}"}}}} : (tensor<4xf32>) -> tensor<4xf32>
  %z = stablehlo.add %y, %x : tensor<4xf32> loc({loc})
  return %z : tensor<4xf32>
}}
"""


MODULE = "\n".join([
    _kernel("layer_0", "helper_0", loc='"a.py":1:1'),
    _kernel("layer_1", "helper_1", loc='"b.py":7:3'),  # the same program, other locations
    _kernel("layer_2", "helper_2", scale="3.0"),  # another constant in its helper
    _kernel("layer_3", "helper_3", tag="helper_1"),  # a string naming an equal function, where layer_1 has "none"
    _kernel("layer_4", "helper_4", tag="helper_0"),  # the same string as layer_5's
    _kernel("layer_5", "helper_5", tag="helper_0"),
    _kernel("layer_6", "helper_6", tag="helper_4"),  # names an equal function, not the same one: printed
])


@pytest.fixture(scope="module")
def keyed():
    ctx = make_context()
    module = parse_module(MODULE, ctx)
    with ctx:
        funcs = module_funcs(module)
        fast, printed = StructuralKeys(funcs), StructuralKeys(funcs)
        printed._signature = lambda name, calling: None  # every function printed: the reference keys
        yield ({name: fast._function(name, set()) for name in funcs},
               {name: printed._function(name, set()) for name in funcs}, fast)


def test_keys_are_the_printed_keys(keyed):
    fast, reference, _ = keyed
    assert fast == reference


def test_equal_programs_share_a_key_and_differences_keep_them_apart(keyed):
    keys, _, _ = keyed
    assert keys["layer_0"] == keys["layer_1"] == keys["layer_4"].replace(b'"helper_0"', b'"none"')
    assert keys["layer_4"] == keys["layer_5"]
    assert len({keys["layer_0"], keys["layer_2"], keys["layer_3"], keys["layer_4"], keys["layer_6"]}) == 5


def test_functions_equal_without_locations_are_printed_once(keyed):
    _, _, fast = keyed
    # helper_1, 3..6 take helper_0's key over, layer_1 layer_0's; layer_3, 4, 5 and 6 hold strings that name
    # functions (equal ones, whose keys the strings would be compared by), so each is printed
    assert sorted(fast.printed) == ["helper_0", "helper_2", "layer_0", "layer_2", "layer_3", "layer_4", "layer_5",
                                    "layer_6"]


def _region(callee: str, scale: str = "1.0", tag: str = "none", loc: str = "unknown") -> str:
    """A manual computation calling `callee`, with a constant and a string attribute of its own."""
    return f"""
  %r_{callee}_{scale[0]}_{tag} = sdy.manual_computation(%a, %b) in_shardings=[<@mesh, [{{"x"}}]>, <@mesh, [{{"x"}}]>]
      out_shardings=[<@mesh, [{{"x"}}]>] manual_axes={{"x"}} (%x: tensor<4xf32>, %y: tensor<4xf32>) {{
    %c = stablehlo.constant dense<{scale}> : tensor<4xf32> loc({loc})
    %s = stablehlo.multiply %x, %c {{mhlo.frontend_attributes = {{tag = "{tag}"}}}} : tensor<4xf32> loc({loc})
    %z = func.call @{callee}(%s) : (tensor<4xf32>) -> tensor<4xf32> loc({loc})
    %w = stablehlo.add %z, %y : tensor<4xf32>
    sdy.return %w : tensor<4xf32>
  }} : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>"""


REGIONS = [
    _region("layer_0", loc='"a.py":1:1'),
    _region("layer_1", loc='"b.py":2:2'),  # an equal callee, other locations: takes the first one's key over
    _region("layer_2"),  # a callee with another constant
    _region("layer_0", scale="2.0"),  # another constant of its own
    _region("layer_0", tag="helper_0"),  # strings naming equal functions, not as references: printed
    _region("layer_1", tag="helper_1"),
]
REGION_MODULE = 'sdy.mesh @mesh = <["x"=2]>\n' + MODULE + """
func.func @main(%a: tensor<8xf32>, %b: tensor<8xf32>) -> tensor<8xf32> {""" + "".join(REGIONS) + """
  return %a : tensor<8xf32>
}
"""


def _unreadable(op):
    raise bytecode.Unreadable("every region printed: the reference keys")


def test_region_keys_are_the_printed_keys():
    ctx = make_context()
    module = parse_module(REGION_MODULE, ctx)
    with ctx:
        funcs = module_funcs(module)
        regions = [op.operation for op in funcs["main"].regions[0].blocks[0].operations
                   if op.operation.name == "sdy.manual_computation"]
        fast, printed = StructuralKeys(funcs), StructuralKeys(funcs)
        printed._split_op = _unreadable
        keys = [fast.of(r) for r in regions]
        assert keys == [printed.of(r) for r in regions]
    assert printed.printed_ops == 6
    assert fast.printed_ops == 5  # the second region takes the first one's key over
    assert keys[0] == keys[1]
    assert len(set(keys)) == 5

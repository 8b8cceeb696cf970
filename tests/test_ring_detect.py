"""Which manual computations hold a ring: their own collective_permutes and those of the functions they call, through
any chain of calls, but not those of a nested manual computation (its ring is its own) nor of functions only a
nested one calls; and the func.call count of each function, found by the same walk."""

from jaxlib.mlir import ir

from shardfix.ir import manual_axes_of, parse_module
from shardfix.ring.detect import find_ring_regions

# device id = x * 4 + cp: a ring along cp in each group of x, and one along x
CP_RING = "dense<[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>"
X_RING = "dense<[[0, 4], [4, 0], [1, 5], [5, 1], [2, 6], [6, 2], [3, 7], [7, 3]]> : tensor<8x2xi64>"


def _permute(pairs: str, name: str, shape: str) -> str:
    return (f'%{name} = "stablehlo.collective_permute"(%a) <{{channel_handle = #stablehlo.channel_handle<handle = 1, '
            f'type = 1>, source_target_pairs = {pairs}}}> : ({shape}) -> {shape}')


MODULE = f"""
sdy.mesh @mesh = <["x"=2, "cp"=4]>

func.func private @permutes_cp(%a: tensor<2x8xf32>) -> tensor<2x8xf32> {{
  {_permute(CP_RING, "p", "tensor<2x8xf32>")}
  return %p : tensor<2x8xf32>
}}

func.func private @calls_permutes_cp(%a: tensor<2x8xf32>) -> tensor<2x8xf32> {{
  %r = func.call @permutes_cp(%a) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return %r : tensor<2x8xf32>
}}

func.func private @nests_a_ring(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {{
  %r = sdy.manual_computation(%a) in_shardings=[<@mesh, [{{"cp"}}, {{}}]>] out_shardings=[<@mesh, [{{"cp"}}, {{}}]>] manual_axes={{"cp"}} (%b: tensor<1x8xf32>) {{
    {_permute(CP_RING, "p", "tensor<1x8xf32>").replace("(%a)", "(%b)")}
    sdy.return %p : tensor<1x8xf32>
  }} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}}

func.func @main(%arg0: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>) {{
  %through_calls = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{{"cp"}}, {{}}]>] out_shardings=[<@mesh, [{{"cp"}}, {{}}]>] manual_axes={{"x", "cp"}} (%a: tensor<2x8xf32>) {{
    %r = func.call @calls_permutes_cp(%a) : (tensor<2x8xf32>) -> tensor<2x8xf32>
    sdy.return %r : tensor<2x8xf32>
  }} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %outer = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{{"x"}}, {{}}]>] out_shardings=[<@mesh, [{{"x"}}, {{}}]>] manual_axes={{"x"}} (%a: tensor<4x8xf32>) {{
    %inner = sdy.manual_computation(%a) in_shardings=[<@mesh, [{{"cp"}}, {{}}]>] out_shardings=[<@mesh, [{{"cp"}}, {{}}]>] manual_axes={{"cp"}} (%b: tensor<1x8xf32>) {{
      %c = stablehlo.concatenate %b, %b, dim = 0 : (tensor<1x8xf32>, tensor<1x8xf32>) -> tensor<2x8xf32>
      %r = func.call @permutes_cp(%c) : (tensor<2x8xf32>) -> tensor<2x8xf32>
      %s = stablehlo.slice %r [0:1, 0:8] : (tensor<2x8xf32>) -> tensor<1x8xf32>
      sdy.return %s : tensor<1x8xf32>
    }} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    sdy.return %inner : tensor<4x8xf32>
  }} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %calls_a_nest = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{{"x"}}, {{}}]>] out_shardings=[<@mesh, [{{"x"}}, {{}}]>] manual_axes={{"x"}} (%a: tensor<4x8xf32>) {{
    %r = func.call @nests_a_ring(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %b = stablehlo.slice %a [0:2, 0:8] : (tensor<4x8xf32>) -> tensor<2x8xf32>
    {_permute(X_RING, "q", "tensor<2x8xf32>").replace("(%a)", "(%b)")}
    %t = stablehlo.concatenate %q, %q, dim = 0 : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<4x8xf32>
    %u = stablehlo.add %r, %t : tensor<4x8xf32>
    sdy.return %u : tensor<4x8xf32>
  }} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  return %through_calls, %outer, %calls_a_nest : tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>
}}
"""


def _where(region: ir.Operation) -> tuple[str, bool]:
    """The function a region sits in, and whether it sits in another manual computation."""
    parent, nested = region.parent, False
    while parent.name != "func.func":
        nested = nested or parent.name == "sdy.manual_computation"
        parent = parent.parent
    return ir.StringAttr(parent.attributes["sym_name"]).value, nested


def test_a_ring_is_found_through_calls_and_not_through_a_nested_manual_computation(ctx):
    with ctx:
        module = parse_module(MODULE, ctx, "<test>")
        callers: dict[str, int] = {}
        regions = find_ring_regions(module.operation if hasattr(module, "operation") else module, callers)
        found = sorted(_where(r.region) + (tuple(sorted(manual_axes_of(r.region))), r.axis, tuple(r.structure))
                       for r in regions)
    # %through_calls: along cp, through two calls; %inner and the region in @nests_a_ring: their own rings along
    # cp; %calls_a_nest: its own permute along x only (the ring of the region @nests_a_ring holds is not its own);
    # %outer: none (the permute @permutes_cp runs for it is %inner's)
    assert found == sorted([("main", False, ("cp", "x"), "cp", ()), ("main", True, ("cp",), "cp", ()),
                            ("nests_a_ring", False, ("cp",), "cp", ()),
                            ("main", False, ("x",), "x", ())]), found
    assert callers == {"calls_permutes_cp": 1, "permutes_cp": 2, "nests_a_ring": 1}

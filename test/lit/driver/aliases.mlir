// RUN: %opt %s -p fix-shardings | FileCheck %s
// RUN: %opt %s -p fix-shardings --report 2>&1 >/dev/null | FileCheck %s --check-prefix=FIX
// A file of several top-level ops is wrapped in a module as mlir-opt wraps it; the attribute and type alias
// definitions before them stay outside the module, where MLIR reads them, and every line keeps its number.

#replicated = #sdy.sharding<@mesh, [{}]>
!vec = tensor<8xf32>
#bad = #sdy.sharding<@mesh, [{"x", "unknown"}]>

sdy.mesh @mesh = <["x"=2]>

// CHECK-LABEL: func.func @f
// CHECK-SAME: (%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}) -> tensor<8xf32>
func.func @f(%a: !vec {sdy.sharding = #replicated}) -> !vec {
  return %a : !vec
}

// CHECK-LABEL: func.func @g
// CHECK-SAME: (%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) -> tensor<8xf32>
// FIX: aliases.mlir:21:14: unknown-axis: dim 0: axis "unknown" is not in the mesh
func.func @g(%a: !vec {sdy.sharding = #bad}) -> !vec {
  return %a : !vec
}

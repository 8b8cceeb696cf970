// RUN: not %opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// Replicated and unreduced axes are put in mesh order.

sdy.mesh @mesh = <["a"=2, "b"=4, "c"=2]>

// VERIFIER: error: 'func.func' op arg 0 - replicated axes are not ordered w.r.t. mesh
// CHECK-LABEL: func @replicated
// CHECK-SAME: #sdy.sharding<@mesh, [{}, {}], replicated={"a", "c"}>
func.func @replicated(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}], replicated={"c", "a"}>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4, "c"=2]>

// VERIFIER: error: 'sdy.sharding_constraint' op unreduced axes are not ordered w.r.t. mesh
// CHECK-LABEL: func @unreduced
// CHECK: sdy.sharding_constraint %arg0 <@mesh, [{"a"}, {}], unreduced={"b", "c"}>
func.func @unreduced(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"a"}, {}], unreduced={"c", "b"}> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

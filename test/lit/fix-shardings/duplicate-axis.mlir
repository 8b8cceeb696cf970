// RUN: not %opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// The first use of an axis is kept: within a dim, across dims, and against replicated axes.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'func.func' op arg 0 - duplicate axis ref: "a"
// CHECK-LABEL: func @within_dim
// CHECK-SAME: #sdy.sharding<@mesh, [{"a"}, {}]>
func.func @within_dim(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "a"}, {}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'sdy.sharding_constraint' op duplicate axis ref: "b"
// CHECK-LABEL: func @across_dims
// CHECK: sdy.sharding_constraint %arg0 <@mesh, [{"b"}, {"a"}]>
func.func @across_dims(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"b"}, {"b", "a"}]> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'stablehlo.tanh' op result - duplicate axis ref: "a"
// CHECK-LABEL: func @against_replicated
// CHECK: stablehlo.tanh %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"a"}, {}], replicated={"b"}>]>}
func.func @against_replicated(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = stablehlo.tanh %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"a"}, {}], replicated={"a", "b"}>]>} : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

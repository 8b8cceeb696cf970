// RUN: not %opt %s 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s -p fix-shardings --report 2>&1 | FileCheck %s
// Propagation-edge debug attributes name axes too: edges of an axis no mesh has are dropped (a step left without
// edges goes with them); the edges of known axes stay.

sdy.mesh @mesh = <["a"=4]>

// VERIFIER: error: 'stablehlo.add' op expected axis ref to be in one of the meshes
// CHECK: unknown-axis: propagation edges of axes no mesh has ("z") dropped
// CHECK-LABEL: func @edges
// CHECK: stablehlo.add %arg0, %arg0 {sdy.propagation_edges = #sdy.propagation_edges<[{step-1 = [{"a" = operand-0 -> [result-0]}]}]>, sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{?}, {"a", ?}]>]>}
func.func @edges(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = stablehlo.add %arg0, %arg0 {sdy.propagation_edges = #sdy.propagation_edges<[{step-1 = [{"a" = operand-0 -> [result-0]}, {"z" = operand-1 -> [result-0]}]}, {step-2 = [{"z" = operand-0 -> [result-0]}]}]>, sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{?}, {"a", ?}]>]>} : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

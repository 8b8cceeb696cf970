// RUN: not %opt %s 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s -p fix-shardings | FileCheck %s
// A sub-axis that is the whole axis is written as the axis.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'sdy.sharding_constraint' op sub-axis size is equal to the full axis size
// CHECK-LABEL: func @whole_axis
// CHECK: sdy.sharding_constraint %arg0 <@mesh, [{"b"}, {"a"}]>
func.func @whole_axis(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"b":(1)4}, {"a"}]> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

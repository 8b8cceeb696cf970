// RUN: not %opt %s 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s -p fix-shardings | FileCheck %s
// Inside a manual computation, its manual axes are bound: a sharding there can't use them.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'sdy.sharding_constraint' op operates on axis "a" which is already bound by a parent sdy.manual_computation op
// CHECK-LABEL: func @bound
// CHECK: sdy.sharding_constraint %arg1 <@mesh, [{}, {"b"}]>
func.func @bound(%arg0: tensor<16x32xf32>) -> tensor<16x32xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"a"}, {}]>] out_shardings=[<@mesh, [{"a"}, {}]>] manual_axes={"a"} (%arg1: tensor<8x32xf32>) {
    %1 = sdy.sharding_constraint %arg1 <@mesh, [{"a"}, {"b"}]> : tensor<8x32xf32>
    sdy.return %1 : tensor<8x32xf32>
  } : (tensor<16x32xf32>) -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

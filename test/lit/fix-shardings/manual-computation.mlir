// RUN: %opt %s -p 'fix-shardings{policy=subaxis}' | FileCheck %s
// A manual computation's free axes are fixed like any others; its manual axes (which set the body's local
// shapes) are kept.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// CHECK-LABEL: func @manual
// CHECK: sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"a"}, {"b":(1)2}]>] out_shardings=[<@mesh, [{"a"}, {}]>] manual_axes={"a"}
func.func @manual(%arg0: tensor<8x6xf32>) -> tensor<8x6xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"a"}, {"b"}]>] out_shardings=[<@mesh, [{"a"}, {"z"}]>] manual_axes={"a"} (%arg1: tensor<4x6xf32>) {
    // CHECK: sdy.sharding_constraint %arg1 <@mesh, [{"b"}, {}]>
    %1 = sdy.sharding_constraint %arg1 <@mesh, [{"b"}, {}]> : tensor<4x6xf32>
    sdy.return %1 : tensor<4x6xf32>
  } : (tensor<8x6xf32>) -> tensor<8x6xf32>
  return %0 : tensor<8x6xf32>
}

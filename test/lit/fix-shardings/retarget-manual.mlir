// RUN: not %opt %s -p fix-shardings --target-mesh 'a=2,b=2' 2>&1 | FileCheck %s --check-prefix=SIZE
// RUN: not %opt %s -p fix-shardings --target-mesh 'a=2' 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: %opt %s -p fix-shardings --target-mesh 'b=4,a=2,c=2' | FileCheck %s
// A manual axis sets the local shapes inside its manual computation: the target mesh must keep it, same size.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// SIZE: retarget-manual.mlir:[[# @LINE + 5]]:8: error: fix-shardings: a manual computation is manual over "b"=4 but the target mesh has size 2; its body's local shapes would change, so retargeting needs a mesh that keeps "b" at 4
// MISSING: retarget-manual.mlir:[[# @LINE + 4]]:8: error: fix-shardings: a manual computation is manual over "b"=4 but the target mesh has no such axis; its body's local shapes would change, so retargeting needs a mesh that keeps "b" at 4
// CHECK: sdy.mesh @mesh = <["b"=4, "a"=2, "c"=2]>
// CHECK: sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"b"}, {}]>] out_shardings=[<@mesh, [{"b"}, {}]>] manual_axes={"b"}
func.func @f(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"b"}, {}]>] out_shardings=[<@mesh, [{"b"}, {}]>] manual_axes={"b"} (%arg1: tensor<2x8xf32>) {
    sdy.return %arg1 : tensor<2x8xf32>
  } : (tensor<8x8xf32>) -> tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

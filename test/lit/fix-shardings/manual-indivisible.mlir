// RUN: not %opt %s 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: not %opt %s -p fix-shardings 2>&1 | FileCheck %s --check-prefix=VERIFIER
// A manual axis that doesn't divide its dim can't be fixed without changing the body's local shapes:
// fix-shardings leaves it to the verifier's located error, never a silent change.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: manual-indivisible.mlir:[[# @LINE + 2]]:8: error: 'sdy.manual_computation' op operand dimension size 6 is not divisible by the manual axes size 4
func.func @manual(%arg0: tensor<6x8xf32>) -> tensor<6x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"b"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"b"} (%arg1: tensor<1x8xf32>) {
    sdy.return %arg1 : tensor<1x8xf32>
  } : (tensor<6x8xf32>) -> tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

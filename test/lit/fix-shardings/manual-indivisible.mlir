// RUN: not %opt %s 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: not %opt %s -p fix-shardings 2>&1 | FileCheck %s --check-prefix=REFUSED
// A manual axis that doesn't divide its dim can't be fixed without changing the body's local shapes:
// fix-shardings refuses at the op, in its own words with MLIR's after them, never a silent change.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: manual-indivisible.mlir:[[# @LINE + 4]]:8: error: 'sdy.manual_computation' op operand dimension size 6 is not divisible by the manual axes size 4
// REFUSED: manual-indivisible.mlir:[[# @LINE + 3]]:8: error: fix-shardings can't repair this: a manual axis doesn't divide a dimension of this manual computation; it would need a dimension its manual axes divide: another sharding would change the local shapes the body is written for
// REFUSED-NEXT: manual-indivisible.mlir:[[# @LINE + 2]]:8: note: MLIR: 'sdy.manual_computation' op operand dimension size 6 is not divisible by the manual axes size 4
func.func @manual(%arg0: tensor<6x8xf32>) -> tensor<6x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"b"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"b"} (%arg1: tensor<1x8xf32>) {
    sdy.return %arg1 : tensor<1x8xf32>
  } : (tensor<6x8xf32>) -> tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// RUN: not %opt %s 2>&1 | FileCheck %s
// RUN: not %opt %s -p fix-shardings 2>&1 | FileCheck %s
// A syntax error is reported at its place, with exit status 1 and no traceback.

// CHECK: malformed.mlir:[[# @LINE + 3]]:28: error: expected SSA operand
// CHECK-NOT: Traceback
func.func @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %arg0, : tensor<4xf32>
  return %0 : tensor<4xf32>
}

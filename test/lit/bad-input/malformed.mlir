// RUN: not %opt %s 2>&1 | FileCheck %s
// RUN: not %opt %s -p fix-shardings 2>&1 | FileCheck %s --check-prefix=FIX
// A syntax error is reported at its place, with exit status 1 and no traceback; fix-shardings says it can't
// repair a module that doesn't parse.

// CHECK: malformed.mlir:[[# @LINE + 6]]:28: error: expected SSA operand
// CHECK-NOT: Traceback
// FIX: malformed.mlir:[[# @LINE + 4]]:28: error: fix-shardings can't repair this: the text doesn't parse as MLIR here (expected SSA operand); it would need valid MLIR syntax first
// FIX-NEXT: malformed.mlir:[[# @LINE + 3]]:28: note: MLIR: expected SSA operand
// FIX-NOT: Traceback
func.func @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %arg0, : tensor<4xf32>
  return %0 : tensor<4xf32>
}

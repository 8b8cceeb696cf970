// RUN: not %opt %s 2>&1 | FileCheck %s
// RUN: %opt %s --allow-unregistered-dialect | FileCheck %s --check-prefix=ALLOWED

// CHECK: unknown-op.mlir:[[# @LINE + 4]]:24: error: operation being parsed with an unregistered dialect
// ALLOWED-LABEL: func @f
// ALLOWED: "mydialect.frob"(%arg0)
func.func @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "mydialect.frob"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

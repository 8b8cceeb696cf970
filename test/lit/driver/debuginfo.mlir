// RUN: %opt %s --mlir-print-debuginfo | FileCheck %s

// CHECK: stablehlo.add %arg0, %arg0 : tensor<4xf32> loc([[LOC:#loc[0-9]*]])
// CHECK: [[LOC]] = loc("user.py":7:3)
func.func @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32> loc("user.py":7:3)
  return %0 : tensor<4xf32>
}

// RUN: %opt %s -p canonicalize,cse | FileCheck %s
// RUN: %opt %s --pass-pipeline='builtin.module(canonicalize,cse)' | FileCheck %s
// Registered MLIR passes run through the driver: cse merges the two identical adds.

// CHECK-LABEL: func @f
func.func @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  // CHECK: %[[A:.*]] = stablehlo.add %arg0, %arg0
  // CHECK-NEXT: %[[B:.*]] = stablehlo.multiply %[[A]], %[[A]]
  // CHECK-NEXT: return %[[B]]
  %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
  %1 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<4xf32>
  return %2 : tensor<4xf32>
}

// RUN: %opt - < %s | FileCheck %s
// RUN: rm -f %t.out.mlir && %opt %s -o %t.out.mlir && FileCheck %s --input-file=%t.out.mlir
// RUN: %opt %s -o - | FileCheck %s

// CHECK-LABEL: func @id
func.func @id(%arg0: tensor<2xf32>) -> tensor<2xf32> {
  return %arg0 : tensor<2xf32>
}

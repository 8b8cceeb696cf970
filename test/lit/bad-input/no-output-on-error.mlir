// RUN: %python -c "open('%t.out', 'w').write('precious\n')"
// RUN: not %opt %s -o %t.out 2>&1 | FileCheck %s --check-prefix=ERR
// RUN: FileCheck %s --input-file=%t.out --check-prefix=KEPT
// RUN: rm -f %t.new && not %opt %s -o %t.new
// RUN: not ls %t.new
// A failing run neither writes nor changes the output file.

// ERR: error: 'stablehlo.add' op requires the same shape for all operands and results
// KEPT: precious
func.func @f(%arg0: tensor<4xf32>, %arg1: tensor<5xf32>) -> tensor<4xf32> {
  %0 = "stablehlo.add"(%arg0, %arg1) : (tensor<4xf32>, tensor<5xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

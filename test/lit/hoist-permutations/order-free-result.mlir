// RUN: %opt %s -p "ring-reorder{mode=force},hoist-permutations" | FileCheck %s
// A result that doesn't depend on token order (a sum over the sequence, as a mean loss is) needs no inverse.

sdy.mesh @mesh = <["cp"=2]>

// CHECK-LABEL: func @loss
// CHECK:       inverse = false
// CHECK-NOT:   inverse = true
// CHECK:       stablehlo.reduce
// CHECK-SAME:  applies stablehlo.add across dimensions = [0, 1]
func.func @loss(%x: tensor<8x4xf32>) -> tensor<f32> {
  %r = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l1: tensor<4x4xf32>) {
    %p1 = "stablehlo.collective_permute"(%l1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s1 = stablehlo.maximum %l1, %p1 : tensor<4x4xf32>
    sdy.return %s1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %sq = stablehlo.multiply %r, %r : tensor<8x4xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<f32>
  return %sum : tensor<f32>
}

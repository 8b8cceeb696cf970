// RUN: %opt %s --split-input-file -p "ring-reorder{mode=force},hoist-permutations" | FileCheck %s
// A dot_general that sums over the sequence gives the same result whatever order the tokens are in, as long as
// both of its sides are in the same order: the permutations move across it (a layer's weight gradient sums its
// activations against their cotangents over the tokens). Between the two rings nothing is permuted back.

sdy.mesh @mesh = <["cp"=2]>

// CHECK-LABEL: func.func @gram
// CHECK:      %[[IN:.*]] = sdy.manual_computation(%arg0)
// CHECK:      inverse = false
// CHECK-NEXT: %[[R1:.*]] = sdy.manual_computation(%[[IN]])
// CHECK:      shardfix.ring_reorder = "zigzag"
// CHECK-NEXT: %[[G:.*]] = stablehlo.dot_general %[[R1]], %[[R1]], contracting_dims = [0] x [0]
// CHECK-NEXT: %[[B:.*]] = stablehlo.dot_general %[[R1]], %[[G]], contracting_dims = [1] x [0]
// CHECK-NEXT: %[[R2:.*]] = sdy.manual_computation(%[[B]])
// CHECK:      shardfix.ring_reorder = "zigzag"
// CHECK-NEXT: %[[OUT:.*]] = sdy.manual_computation(%[[R2]])
// CHECK:      inverse = true
// CHECK-NEXT: return %[[OUT]]
func.func @gram(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l1: tensor<4x4xf32>) {
    %p1 = "stablehlo.collective_permute"(%l1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s1 = stablehlo.maximum %l1, %p1 : tensor<4x4xf32>
    sdy.return %s1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %g = stablehlo.dot_general %r1, %r1, contracting_dims = [0] x [0] : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
  %b = stablehlo.dot_general %r1, %g, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  %r2 = sdy.manual_computation(%b) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l2: tensor<4x4xf32>) {
    %p2 = "stablehlo.collective_permute"(%l2) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s2 = stablehlo.maximum %l2, %p2 : tensor<4x4xf32>
    sdy.return %s2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r2 : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

// The other side of the contraction is a function argument indexed by token (positional weights): it is put in
// the same order, and the ring's result is not permuted back before the sum.
// CHECK-LABEL: func.func @positional_weights
// CHECK:      %[[W:.*]] = sdy.manual_computation(%arg1)
// CHECK:      inverse = false
// CHECK-NEXT: %[[IN:.*]] = sdy.manual_computation(%arg0)
// CHECK:      inverse = false
// CHECK-NEXT: %[[R:.*]] = sdy.manual_computation(%[[IN]])
// CHECK:      shardfix.ring_reorder = "zigzag"
// CHECK-NEXT: %[[S:.*]] = stablehlo.dot_general %[[R]], %[[W]], contracting_dims = [0] x [0]
// CHECK-NEXT: return %[[S]]
// CHECK-NOT:  inverse = true
func.func @positional_weights(%x: tensor<8x4xf32>, %w: tensor<8x4xf32>) -> tensor<4x4xf32> {
  %r = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l: tensor<4x4xf32>) {
    %p = "stablehlo.collective_permute"(%l) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s = stablehlo.maximum %l, %p : tensor<4x4xf32>
    sdy.return %s : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %sum = stablehlo.dot_general %r, %w, contracting_dims = [0] x [0] : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
  return %sum : tensor<4x4xf32>
}

// RUN: %opt %s --split-input-file -p "ring-reorder{mode=force},hoist-permutations" | FileCheck %s
// Ops that treat every token alike along the sequence dim let the permutations through, so between two rings nothing
// is permuted back: slices, pads and concatenates of another dim (RoPE's halves), positions from an iota (computed
// in the permuted order beside it), an embedding's gather (its indices permuted instead) and its gradient's
// scatter-add by token id (order-free: the permutation is absorbed), calls of functions that are token-wise as a
// whole (log_softmax and its transpose: reductions over the feature dim).
sdy.mesh @mesh = <["cp"=2]>

// CHECK-LABEL: func.func @rope_halves
// CHECK:      inverse = false
// CHECK-NEXT: %[[R1:.*]] = sdy.manual_computation
// CHECK-NOT:  sequence_permutation
// CHECK:      stablehlo.slice %[[R1]] [0:8, 0:2]
// CHECK-NOT:  sequence_permutation
// CHECK:      %[[S:.*]] = stablehlo.add
// CHECK-NEXT: %[[R2:.*]] = sdy.manual_computation(%[[S]])
// CHECK:      sdy.manual_computation(%[[R2]])
// CHECK:      inverse = true
func.func @rope_halves(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %a = stablehlo.slice %r1 [0:8, 0:2] : (tensor<8x4xf32>) -> tensor<8x2xf32>
  %b = stablehlo.slice %r1 [0:8, 2:4] : (tensor<8x4xf32>) -> tensor<8x2xf32>
  %n = stablehlo.negate %b : tensor<8x2xf32>
  %c = stablehlo.concatenate %n, %a, dim = 1 : (tensor<8x2xf32>, tensor<8x2xf32>) -> tensor<8x4xf32>
  %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %q = stablehlo.pad %a, %z, low = [0, 0], high = [0, 2], interior = [0, 0] : (tensor<8x2xf32>, tensor<f32>) -> tensor<8x4xf32>
  %s = stablehlo.add %c, %q : tensor<8x4xf32>
  %r2 = sdy.manual_computation(%s) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr2: tensor<4x4xf32>) {
    %pr2 = "stablehlo.collective_permute"(%lr2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr2 = stablehlo.maximum %lr2, %pr2 : tensor<4x4xf32>
    sdy.return %sr2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r2 : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

// The permuted positions of zigzag over 2 devices: [0, 1, 6, 7, 2, 3, 4, 5].
// CHECK-LABEL: func.func @positions
// CHECK-NOT:  sequence_permutation
// CHECK:      %[[I:.*]] = stablehlo.iota dim = 0 : tensor<8xi32>
// CHECK:      %[[P:.*]] = stablehlo.select
// CHECK-NEXT: stablehlo.convert %[[P]] : (tensor<8xi32>) -> tensor<8xf32>
// CHECK:      %[[COS:.*]] = stablehlo.cosine
// CHECK:      inverse = false
// CHECK-NEXT: %[[R1:.*]] = sdy.manual_computation
// CHECK:      stablehlo.multiply %[[R1]], %[[COS]]
// CHECK:      inverse = true
// CHECK-NOT:  sequence_permutation
func.func @positions(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %i = stablehlo.iota dim = 0 : tensor<8xi32>
  %f = stablehlo.convert %i : (tensor<8xi32>) -> tensor<8xf32>
  %j = stablehlo.iota dim = 0 : tensor<4xi32>
  %g = stablehlo.convert %j : (tensor<4xi32>) -> tensor<4xf32>
  %fb = stablehlo.broadcast_in_dim %f, dims = [0] : (tensor<8xf32>) -> tensor<8x4xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<4xf32>) -> tensor<8x4xf32>
  %angle = stablehlo.multiply %fb, %gb : tensor<8x4xf32>
  %cos = stablehlo.cosine %angle : tensor<8x4xf32>
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %m = stablehlo.multiply %r1, %cos : tensor<8x4xf32>
  %r2 = sdy.manual_computation(%m) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr2: tensor<4x4xf32>) {
    %pr2 = "stablehlo.collective_permute"(%lr2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr2 = stablehlo.maximum %lr2, %pr2 : tensor<4x4xf32>
    sdy.return %sr2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r2 : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

// CHECK-LABEL: func.func @embedding_gradient
// CHECK:      %[[IDS:.*]] = sdy.manual_computation(%arg1)
// CHECK:      inverse = false
// CHECK:      %[[X:.*]] = sdy.manual_computation(%arg0)
// CHECK:      inverse = false
// CHECK-NEXT: %[[R1:.*]] = sdy.manual_computation(%[[X]])
// CHECK-NOT:  sequence_permutation
// CHECK:      "stablehlo.scatter"(%{{.*}}, %[[IDS]], %[[R1]])
func.func @embedding_gradient(%x: tensor<8x4xf32>, %ids: tensor<8x1xi32>) -> tensor<5x4xf32> {
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %table = stablehlo.broadcast_in_dim %z, dims = [] : (tensor<f32>) -> tensor<5x4xf32>
  %g = "stablehlo.scatter"(%table, %ids, %r1) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%u: tensor<f32>, %v: tensor<f32>):
    %w = stablehlo.add %u, %v : tensor<f32>
    stablehlo.return %w : tensor<f32>
  }) : (tensor<5x4xf32>, tensor<8x1xi32>, tensor<8x4xf32>) -> tensor<5x4xf32>
  return %g : tensor<5x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

// CHECK-LABEL: func.func @embedding_lookup
// CHECK:      %[[IDS:.*]] = sdy.manual_computation(%arg1)
// CHECK:      inverse = false
// CHECK:      %[[E:.*]] = "stablehlo.gather"(%arg0, %[[IDS]])
// CHECK-NEXT: sdy.manual_computation(%[[E]])
func.func @embedding_lookup(%table: tensor<5x4xf32>, %ids: tensor<8x1xi32>) -> tensor<8x4xf32> {
  %e = "stablehlo.gather"(%table, %ids) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 4>}> : (tensor<5x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
  %r1 = sdy.manual_computation(%e) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r1 : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

// CHECK-LABEL: func.func @log_softmax_between_rings
// CHECK:      inverse = false
// CHECK-NEXT: %[[R1:.*]] = sdy.manual_computation
// CHECK:      shardfix.ring_reorder = "zigzag"
// CHECK-NEXT: %[[L:.*]]:2 = call @log_softmax(%[[R1]])
// CHECK-NEXT: %[[T:.*]] = call @log_softmax_transpose(%[[L]]#0, %[[L]]#1, %[[R1]])
// CHECK-NEXT: %[[R2:.*]] = sdy.manual_computation(%[[T]])
func.func @log_softmax_between_rings(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %l:2 = call @log_softmax(%r1) : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x1xf32>)
  %t = call @log_softmax_transpose(%l#0, %l#1, %r1) : (tensor<8x4xf32>, tensor<8x1xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  %r2 = sdy.manual_computation(%t) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr2: tensor<4x4xf32>) {
    %pr2 = "stablehlo.collective_permute"(%lr2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr2 = stablehlo.maximum %lr2, %pr2 : tensor<4x4xf32>
    sdy.return %sr2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r2 : tensor<8x4xf32>
}
func.func private @log_softmax(%a: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x1xf32>) {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %m = stablehlo.reduce(%a init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
  %mb = stablehlo.broadcast_in_dim %m, dims = [0] : (tensor<8xf32>) -> tensor<8x4xf32>
  %d = stablehlo.subtract %a, %mb : tensor<8x4xf32>
  %e = stablehlo.exponential %d : tensor<8x4xf32>
  %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %s = stablehlo.reduce(%e init: %z) applies stablehlo.add across dimensions = [1] : (tensor<8x4xf32>, tensor<f32>) -> tensor<8xf32>
  %s1 = stablehlo.reshape %s : (tensor<8xf32>) -> tensor<8x1xf32>
  %lg = stablehlo.log %s1 : tensor<8x1xf32>
  %lb = stablehlo.broadcast_in_dim %lg, dims = [0, 1] : (tensor<8x1xf32>) -> tensor<8x4xf32>
  %r = stablehlo.subtract %d, %lb : tensor<8x4xf32>
  return %r, %s1 : tensor<8x4xf32>, tensor<8x1xf32>
}
func.func private @log_softmax_transpose(%y: tensor<8x4xf32>, %s: tensor<8x1xf32>, %g: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %sb = stablehlo.broadcast_in_dim %s, dims = [0, 1] : (tensor<8x1xf32>) -> tensor<8x4xf32>
  %q = stablehlo.divide %g, %sb : tensor<8x4xf32>
  %r = stablehlo.multiply %q, %y : tensor<8x4xf32>
  return %r : tensor<8x4xf32>
}

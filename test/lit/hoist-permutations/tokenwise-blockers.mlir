// RUN: %opt %s --split-input-file --verify-diagnostics -p "ring-reorder{mode=force},hoist-permutations"
// What is not token-wise along the sequence stops the motion, said at the op: a slice or concatenate of the sequence
// dim, a scatter whose result depends on the order of its updates, a callee that sums over the sequence or reads
// positions from an iota of its own (its arguments are permuted, its iota is not).

sdy.mesh @mesh = <["cp"=2]>

func.func @slice_of_the_sequence(%x: tensor<8x4xf32>) -> tensor<4x4xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // expected-remark @+1 {{an inverse zigzag permutation stops at 'stablehlo.slice': it slices or pads the sequence dim}}
  %a = stablehlo.slice %r1 [0:4, 0:4] : (tensor<8x4xf32>) -> tensor<4x4xf32>
  return %a : tensor<4x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

func.func @concatenate_along_the_sequence(%x: tensor<8x4xf32>) -> tensor<16x4xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // expected-remark @+1 {{an inverse zigzag permutation stops at 'stablehlo.concatenate': it concatenates along the sequence dim}}
  %c = stablehlo.concatenate %r1, %r1, dim = 0 : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<16x4xf32>
  return %c : tensor<16x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

func.func @scatter_that_keeps_the_last_update(%x: tensor<8x4xf32>, %ids: tensor<8x1xi32>) -> tensor<5x4xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %table = stablehlo.broadcast_in_dim %z, dims = [] : (tensor<f32>) -> tensor<5x4xf32>
  // expected-remark @+1 {{an inverse zigzag permutation stops at 'stablehlo.scatter': it scatters in an order-sensitive way}}
  %g = "stablehlo.scatter"(%table, %ids, %r1) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
  ^bb0(%u: tensor<f32>, %v: tensor<f32>):
    stablehlo.return %v : tensor<f32>
  }) : (tensor<5x4xf32>, tensor<8x1xi32>, tensor<8x4xf32>) -> tensor<5x4xf32>
  return %g : tensor<5x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

func.func @callee_sums_the_sequence(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // expected-remark @+1 {{an inverse zigzag permutation stops at 'func.call' to '@centre': it calls a function that reduces over the sequence}}
  %c = call @centre(%r1) : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %c : tensor<8x4xf32>
}
func.func private @centre(%a: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %s = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = [0] : (tensor<8x4xf32>, tensor<f32>) -> tensor<4xf32>
  %b = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<4xf32>) -> tensor<8x4xf32>
  %r = stablehlo.subtract %a, %b : tensor<8x4xf32>
  return %r : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

func.func @callee_reads_positions(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // expected-remark @+1 {{an inverse zigzag permutation stops at 'func.call' to '@add_position': it is not known to treat tokens alike}}
  %c = call @add_position(%r1) : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %c : tensor<8x4xf32>
}
func.func private @add_position(%a: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %i = stablehlo.iota dim = 0 : tensor<8x4xi32>
  %f = stablehlo.convert %i : (tensor<8x4xi32>) -> tensor<8x4xf32>
  %r = stablehlo.add %a, %f : tensor<8x4xf32>
  return %r : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

// The callee reads the first token inside a branch (captured, not an operand): that depends on the order.
func.func @callee_reads_one_token_in_a_branch(%x: tensor<8x4xf32>, %p: tensor<i1>) -> tensor<8x4xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // expected-remark @+1 {{an inverse zigzag permutation stops at 'func.call' to '@add_first_token': it calls a function holding a region other than a reduction's}}
  %c = call @add_first_token(%r1, %p) : (tensor<8x4xf32>, tensor<i1>) -> tensor<8x4xf32>
  return %c : tensor<8x4xf32>
}
func.func private @add_first_token(%a: tensor<8x4xf32>, %p: tensor<i1>) -> tensor<8x4xf32> {
  %first = "stablehlo.if"(%p) ({
    %s = stablehlo.slice %a [0:1, 0:4] : (tensor<8x4xf32>) -> tensor<1x4xf32>
    stablehlo.return %s : tensor<1x4xf32>
  }, {
    %z = stablehlo.constant dense<0.000000e+00> : tensor<1x4xf32>
    stablehlo.return %z : tensor<1x4xf32>
  }) : (tensor<i1>) -> tensor<1x4xf32>
  %b = stablehlo.broadcast_in_dim %first, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<8x4xf32>
  %r = stablehlo.add %a, %b : tensor<8x4xf32>
  return %r : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

// Indices promised sorted would no longer be once permuted.
func.func @lookup_by_sorted_ids(%table: tensor<5x4xf32>, %ids: tensor<8x1xi32>) -> tensor<8x4xf32> {
  // expected-remark @+1 {{a zigzag permutation stops at 'stablehlo.gather': it does not carry the sequence dim through from one operand}}
  %e = "stablehlo.gather"(%table, %ids) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = true, slice_sizes = array<i64: 1, 4>}> : (tensor<5x4xf32>, tensor<8x1xi32>) -> tensor<8x4xf32>
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%e) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%lr1: tensor<4x4xf32>) {
    %pr1 = "stablehlo.collective_permute"(%lr1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %sr1 = stablehlo.maximum %lr1, %pr1 : tensor<4x4xf32>
    sdy.return %sr1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r1 : tensor<8x4xf32>
}

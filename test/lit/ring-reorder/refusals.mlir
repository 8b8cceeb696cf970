// RUN: %opt %s --split-input-file --verify-diagnostics -p ring-reorder
// RUN: %opt %s --split-input-file -p ring-reorder > %t.out.mlir
// RUN: %opt %s --split-input-file > %t.plain.mlir
// RUN: diff %t.plain.mlir %t.out.mlir
// Each reason ring-reorder leaves a ring region alone, said at the region; the IR is unchanged.

sdy.mesh @mesh = <["cp"=4]>

func.func @device_index(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{not applied (not provably safe: 'stablehlo.partition_id' at}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p0 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p1 = "stablehlo.collective_permute"(%p0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %id = stablehlo.partition_id : tensor<ui32>
    %f = stablehlo.convert %id : (tensor<ui32>) -> tensor<f32>
    %b = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
    %y = stablehlo.add %p2, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["cp"=4]>

func.func @index_arithmetic(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{not applied (not provably safe: 'stablehlo.iota' at}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p0 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p1 = "stablehlo.collective_permute"(%p0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %i = stablehlo.iota dim = 0 : tensor<4x8xf32>
    %y = stablehlo.add %p2, %i : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["cp"=4]>

func.func @position_table(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{is a constant table that can encode positions}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p0 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p1 = "stablehlo.collective_permute"(%p0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %c = stablehlo.constant dense<[[1.0], [2.0], [3.0], [4.0]]> : tensor<4x1xf32>
    %b = stablehlo.broadcast_in_dim %c, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %p2, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["cp"=4]>

func.func @order_sensitive(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{is order-sensitive)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p0 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p1 = "stablehlo.collective_permute"(%p0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.reverse %p2, dims = [0] : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["cp"=4]>

func.func @cumulative_sum(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{is order-sensitive (windows, cumulative sums))}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p0 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p1 = "stablehlo.collective_permute"(%p0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %y = "stablehlo.reduce_window"(%p2, %z) <{window_dimensions = array<i64: 4, 1>, padding = dense<[[3, 0], [0, 0]]> : tensor<2x2xi64>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["cp"=4]>

func.func @too_few_steps(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{not applied (not provably safe: the ring makes 2 step(s), fewer than the 3 needed to visit every shard)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p0 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p1 = "stablehlo.collective_permute"(%p0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    sdy.return %p1 : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["cp"=4]>

func.func @indivisible(%arg0: tensor<12x8xf32>) -> tensor<12x8xf32> {
  // expected-remark @+1 {{not applied (operand 0: sequence length 12 is not a multiple of 2*cp = 8)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<3x8xf32>) {
    %p0 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<3x8xf32>) -> tensor<3x8xf32>
    %p1 = "stablehlo.collective_permute"(%p0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<3x8xf32>) -> tensor<3x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<3x8xf32>) -> tensor<3x8xf32>
    sdy.return %p2 : tensor<3x8xf32>
  } : (tensor<12x8xf32>) -> tensor<12x8xf32>
  return %0 : tensor<12x8xf32>
}

// -----

sdy.mesh @mesh = <["cp"=4, "x"=2]>

func.func @mixed_axes(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{not applied (operand 0: dim 0 is sharded on {"cp", "x"} rather than on "cp" alone)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp", "x"}, {}]>] out_shardings=[<@mesh, [{"cp", "x"}, {}]>] manual_axes={"cp", "x"} (%x: tensor<2x8xf32>) {
    %p0 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]> : tensor<8x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
    %p1 = "stablehlo.collective_permute"(%p0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]> : tensor<8x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]> : tensor<8x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
    sdy.return %p2 : tensor<2x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

sdy.mesh @mesh = <["cp"=4]>

func.func @no_sequence_operand(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-remark @+1 {{not applied (no operand is sharded on the ring axis "cp")}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p0 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p1 = "stablehlo.collective_permute"(%p0) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    sdy.return %p2 : tensor<4x8xf32>
  } : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

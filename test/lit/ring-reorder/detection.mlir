// RUN: %opt %s --split-input-file --verify-diagnostics -p ring-reorder
// Which permutes form a ring: one cycle per group along exactly one axis, in either direction, also inside loops
// and called functions; anything else is reported and left alone.

sdy.mesh @mesh = <["dp"=2, "cp"=4]>

// Two rings in opposite directions along "cp" (a bidirectional ring), in a function the body calls.
func.func private @hop(%k: tensor<1x4xf32>) -> tensor<1x4xf32> {
  %f = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>}> : (tensor<1x4xf32>) -> tensor<1x4xf32>
  %b = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[1, 0], [2, 1], [3, 2], [0, 3], [5, 4], [6, 5], [7, 6], [4, 7]]> : tensor<8x2xi64>}> : (tensor<1x4xf32>) -> tensor<1x4xf32>
  %s = stablehlo.add %f, %b : tensor<1x4xf32>
  return %s : tensor<1x4xf32>
}

func.func @bidirectional_in_a_loop(%arg0: tensor<2x16xf32>) -> tensor<2x16xf32> {
  // expected-remark @+1 {{axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"dp"}, {"cp"}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}]>] manual_axes={"dp", "cp"} (%x: tensor<1x4xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = stablehlo.while(%i = %c0, %k = %x) : tensor<i32>, tensor<1x4xf32>
    cond {
      %n = stablehlo.constant dense<3> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %next_k = func.call @hop(%k) : (tensor<1x4xf32>) -> tensor<1x4xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %next = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %next, %next_k : tensor<i32>, tensor<1x4xf32>
    }
    sdy.return %r#1 : tensor<1x4xf32>
  } : (tensor<2x16xf32>) -> tensor<2x16xf32>
  return %0 : tensor<2x16xf32>
}

// -----

sdy.mesh @mesh = <["cp"=4]>

// A shift by two is not a ring over every shard.
func.func @not_a_ring(%arg0: tensor<16xf32>) -> tensor<16xf32> {
  // expected-remark @+1 {{ring-reorder: collective_permutes without a ring: no ring along one mesh axis}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}]>] out_shardings=[<@mesh, [{"cp"}]>] manual_axes={"cp"} (%x: tensor<4xf32>) {
    %1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 2], [1, 3], [2, 0], [3, 1]]> : tensor<4x2xi64>}> : (tensor<4xf32>) -> tensor<4xf32>
    sdy.return %1 : tensor<4xf32>
  } : (tensor<16xf32>) -> tensor<16xf32>
  return %0 : tensor<16xf32>
}

// -----

sdy.mesh @mesh = <["cp"=4]>

// A loop whose trip count isn't a counted range: the ring steps can't be counted.
func.func @uncounted_loop(%arg0: tensor<16xf32>, %stop: tensor<f32>) -> tensor<16xf32> {
  // expected-remark @+1 {{not applied (not provably safe: the number of ring steps could not be determined (a loop that is not a counted loop))}}
  %0 = sdy.manual_computation(%arg0, %stop) in_shardings=[<@mesh, [{"cp"}]>, <@mesh, []>] out_shardings=[<@mesh, [{"cp"}]>] manual_axes={"cp"} (%x: tensor<4xf32>, %s: tensor<f32>) {
    %r = stablehlo.while(%k = %x) : tensor<4xf32>
    cond {
      %first = stablehlo.slice %k [0:1] : (tensor<4xf32>) -> tensor<1xf32>
      %v = stablehlo.reshape %first : (tensor<1xf32>) -> tensor<f32>
      %lt = stablehlo.compare LT, %v, %s, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %p = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4xf32>) -> tensor<4xf32>
      stablehlo.return %p : tensor<4xf32>
    }
    sdy.return %r : tensor<4xf32>
  } : (tensor<16xf32>, tensor<f32>) -> tensor<16xf32>
  return %0 : tensor<16xf32>
}

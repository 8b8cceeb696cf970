// RUN: %opt %s --split-input-file --verify-diagnostics -p 'ring-reorder{strategy=zigzag}'
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=zigzag}' | FileCheck %s
// Which regions hold a ring, and how its steps are counted: collective_permutes one step along one mesh axis in
// either direction, found directly in the region, inside counted loops (a stablehlo.while from fori_loop / scan)
// and in called functions, in full- and partial-manual regions. Every body here is proved (a ring total-sum: each
// block's sum folded into a total once, added to the own tokens) and reordered; the same loop run for one step
// fewer or more than cp is refused (a total missing a block, or one counting a block twice). Permutes that form no
// ring are reported as such and left alone.

// The total-sum as a loop: the block travels (carried %k, one step a trip), its sum is folded into a carried
// total %t; a counted loop (i = 0; i < 4; i += 1) makes the ring steps countable, and after cp = 4 trips every
// block has been added once.
// CHECK-LABEL: func.func @counted_loop
// CHECK:       %[[P:.*]] = sdy.manual_computation(%arg0)
// CHECK:       shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}
// CHECK-NEXT:  %[[R:.*]] = sdy.manual_computation(%[[P]])
// CHECK:       stablehlo.while
// CHECK:       } {shardfix.ring_reorder = "zigzag"}
// CHECK-NEXT:  %[[I:.*]] = sdy.manual_computation(%[[R]])
// CHECK:       shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}
// CHECK-NEXT:  return %[[I]]
sdy.mesh @mesh = <["cp"=4]>

func.func @counted_loop(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %t0 = stablehlo.constant dense<0.0> : tensor<8xf32>
    %r:3 = stablehlo.while(%i = %c0, %t = %t0, %k = %x) : tensor<i32>, tensor<8xf32>, tensor<4x8xf32>
    cond {
      %n = stablehlo.constant dense<4> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %s = stablehlo.reduce(%k init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
      %t1 = stablehlo.add %t, %s : tensor<8xf32>
      %k1 = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %i1 = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %i1, %t1, %k1 : tensor<i32>, tensor<8xf32>, tensor<4x8xf32>
    }
    %b = stablehlo.broadcast_in_dim %r#1, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// Three trips: the total misses the block three steps behind: refused at the loop, as tokens left behind.
// CHECK-LABEL: func.func @three_steps
// CHECK-NOT:   shardfix
sdy.mesh @mesh = <["cp"=4]>

func.func @three_steps(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %t0 = stablehlo.constant dense<0.0> : tensor<8xf32>
    // expected-remark @+1 {{runs 3 of the 4 ring steps: the blocks of 1 device(s) never arrive, so its results leave their tokens out (and which tokens those are changes with the layout))}}
    %r:3 = stablehlo.while(%i = %c0, %t = %t0, %k = %x) : tensor<i32>, tensor<8xf32>, tensor<4x8xf32>
    cond {
      %n = stablehlo.constant dense<3> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %s = stablehlo.reduce(%k init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
      %t1 = stablehlo.add %t, %s : tensor<8xf32>
      %k1 = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %i1 = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %i1, %t1, %k1 : tensor<i32>, tensor<8xf32>, tensor<4x8xf32>
    }
    %b = stablehlo.broadcast_in_dim %r#1, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// Five trips: the fifth adds the own block's sum a second time.
// CHECK-LABEL: func.func @five_steps
// CHECK-NOT:   shardfix
sdy.mesh @mesh = <["cp"=4]>

func.func @five_steps(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %t0 = stablehlo.constant dense<0.0> : tensor<8xf32>
    %r:3 = stablehlo.while(%i = %c0, %t = %t0, %k = %x) : tensor<i32>, tensor<8xf32>, tensor<4x8xf32>
    cond {
      %n = stablehlo.constant dense<5> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %s = stablehlo.reduce(%k init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
      // expected-remark @+1 {{merges two partial results (running sums or maxima) that may both hold the same block, counting its tokens twice (two merges that read the block of one ring step, or one block merged at two steps): merge each block once, the block that ring step brings)}}
      %t1 = stablehlo.add %t, %s : tensor<8xf32>
      %k1 = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %i1 = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %i1, %t1, %k1 : tensor<i32>, tensor<8xf32>, tensor<4x8xf32>
    }
    %b = stablehlo.broadcast_in_dim %r#1, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// The ring the other way round (each device sends to the previous one): blocks arrive from ahead.
// CHECK-LABEL: func.func @reverse_ring
// CHECK:       inverse = false
// CHECK:       shardfix.ring_reorder = "zigzag"
// CHECK:       inverse = true
sdy.mesh @mesh = <["cp"=4]>

func.func @reverse_ring(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %t0 = stablehlo.constant dense<0.0> : tensor<8xf32>
    %r:3 = stablehlo.while(%i = %c0, %t = %t0, %k = %x) : tensor<i32>, tensor<8xf32>, tensor<4x8xf32>
    cond {
      %n = stablehlo.constant dense<4> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %s = stablehlo.reduce(%k init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
      %t1 = stablehlo.add %t, %s : tensor<8xf32>
      %k1 = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[1, 0], [2, 1], [3, 2], [0, 3]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %i1 = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %i1, %t1, %k1 : tensor<i32>, tensor<8xf32>, tensor<4x8xf32>
    }
    %b = stablehlo.broadcast_in_dim %r#1, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// The loop body's ring step in a function it calls (as JAX lowers fori_loop bodies), on a dp x cp mesh: one ring
// per dp shard ([0, 1, 2, 3] and [4, 5, 6, 7]), the sequence on dim 1.
// CHECK-LABEL: func.func @called_step
// CHECK:       source_target_pairs = dense<{{\[}}[0, 0], [1, 2], [2, 3], [3, 1], [4, 4], [5, 6], [6, 7], [7, 5]]>
// CHECK:       shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}
// CHECK:       shardfix.ring_reorder = "zigzag"
// CHECK:       shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}
sdy.mesh @mesh = <["dp"=2, "cp"=4]>

func.func private @step(%t: tensor<1x8xf32>, %k: tensor<1x4x8xf32>) -> (tensor<1x8xf32>, tensor<1x4x8xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%k init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<1x4x8xf32>, tensor<f32>) -> tensor<1x8xf32>
  %t1 = stablehlo.add %t, %s : tensor<1x8xf32>
  %k1 = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>}> : (tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  return %t1, %k1 : tensor<1x8xf32>, tensor<1x4x8xf32>
}

func.func @called_step(%arg0: tensor<2x16x8xf32>) -> tensor<2x16x8xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"dp"}, {"cp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}, {}]>] manual_axes={"dp", "cp"} (%x: tensor<1x4x8xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %t0 = stablehlo.constant dense<0.0> : tensor<1x8xf32>
    %r:3 = stablehlo.while(%i = %c0, %t = %t0, %k = %x) : tensor<i32>, tensor<1x8xf32>, tensor<1x4x8xf32>
    cond {
      %n = stablehlo.constant dense<4> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %next:2 = func.call @step(%t, %k) : (tensor<1x8xf32>, tensor<1x4x8xf32>) -> (tensor<1x8xf32>, tensor<1x4x8xf32>)
      %one = stablehlo.constant dense<1> : tensor<i32>
      %i1 = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %i1, %next#0, %next#1 : tensor<i32>, tensor<1x8xf32>, tensor<1x4x8xf32>
    }
    %b = stablehlo.broadcast_in_dim %r#1, dims = [0, 2] : (tensor<1x8xf32>) -> tensor<1x4x8xf32>
    %y = stablehlo.add %x, %b : tensor<1x4x8xf32>
    sdy.return %y : tensor<1x4x8xf32>
  } : (tensor<2x16x8xf32>) -> tensor<2x16x8xf32>
  return %0 : tensor<2x16x8xf32>
}

// -----

// Both directions at once, in a called function: one step forward, one step back and two steps forward reach the
// blocks one, three and two steps behind, which with the own block make the total.
// CHECK-LABEL: func.func @bidirectional
// CHECK:       inverse = false
// CHECK:       shardfix.ring_reorder = "zigzag"
// CHECK:       inverse = true
sdy.mesh @mesh = <["cp"=4]>

func.func private @hop(%k: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %f = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %b = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[1, 0], [2, 1], [3, 2], [0, 3]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %f, %b : tensor<4x8xf32>, tensor<4x8xf32>
}

func.func @bidirectional(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %h1:2 = func.call @hop(%x) : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>)
    %h2:2 = func.call @hop(%h1#0) : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>)
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s0 = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %s1 = stablehlo.reduce(%h1#0 init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %s3 = stablehlo.reduce(%h1#1 init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %s2 = stablehlo.reduce(%h2#0 init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s0, %s1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %s3 : tensor<8xf32>
    %t = stablehlo.add %t2, %s2 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// A partial-manual region, as jax 0.10.2 lowers (lowered.as_text(), no debug info) the looped total-sum under
// shard_map(body, mesh, in_specs=P(None, "cp"), out_specs=P(None, "cp"), axis_names={"cp"}, check_vma=False) on
// jax.make_mesh((2, 4), ("dp", "cp"), axis_types=(AxisType.Auto,) * 2), x of shape (2, 16):
//   def body(x):
//     def step(i, carry):
//       t, cur = carry
//       return t + jnp.sum(cur, axis=1, keepdims=True), jax.lax.ppermute(cur, "cp", [(j, (j + 1) % 4) for j in range(4)])
//     t, _ = jax.lax.fori_loop(0, 4, step, (jnp.zeros((x.shape[0], 1), x.dtype), x))
//     return x + t
// The region is manual over "cp" only, with open shardings, and Shardy puts sdy.sharding_constraint on the loop
// counter (in the condition and the increment), which the counted-loop match looks through.
// CHECK-LABEL: func.func public @main
// CHECK:       %[[P:.*]] = sdy.manual_computation(%arg0)
// CHECK:       shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}
// CHECK-NEXT:  %[[R:.*]] = sdy.manual_computation(%[[P]]) in_shardings=[<@mesh, [{?}, {"cp", ?}]>] out_shardings=[<@mesh, [{?}, {"cp", ?}]>] manual_axes={"cp"}
// CHECK:       sdy.sharding_constraint %iterArg <@mesh, []> : tensor<i32>
// CHECK:       } {shardfix.ring_reorder = "zigzag"}
// CHECK-NEXT:  sdy.manual_computation(%[[R]])
// CHECK:       shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}
module @jit_body attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["dp"=2, "cp"=4]> {stablehlo.mesh = {axes = [{name = "dp", size = 2 : i64}, {name = "cp", size = 4 : i64}]}}
  func.func public @main(%arg0: tensor<2x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}]>}) -> (tensor<2x16xf32> {jax.result_info = "result"}) {
    // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored)}}
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{?}, {"cp", ?}]>] out_shardings=[<@mesh, [{?}, {"cp", ?}]>] manual_axes={"cp"} (%arg1: tensor<2x4xf32>) {
      %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %1 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x1xf32>
      %2 = sdy.sharding_constraint %1 <@mesh, [{?}, {?}]> : tensor<2x1xf32>
      %c = stablehlo.constant dense<0> : tensor<i32>
      %3:3 = stablehlo.while(%iterArg = %c, %iterArg_0 = %2, %iterArg_1 = %arg1) : tensor<i32>, tensor<2x1xf32>, tensor<2x4xf32>
      cond {
        %c_2 = stablehlo.constant dense<4> : tensor<i32>
        %11 = sdy.sharding_constraint %iterArg <@mesh, []> : tensor<i32>
        %12 = sdy.sharding_constraint %c_2 <@mesh, []> : tensor<i32>
        %13 = stablehlo.compare LT, %11, %12, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %13 : tensor<i1>
      } do {
        %11:2 = func.call @closed_call(%iterArg_0, %iterArg_1) : (tensor<2x1xf32>, tensor<2x4xf32>) -> (tensor<2x1xf32>, tensor<2x4xf32>)
        %c_2 = stablehlo.constant dense<1> : tensor<i32>
        %12 = sdy.sharding_constraint %iterArg <@mesh, []> : tensor<i32>
        %13 = sdy.sharding_constraint %c_2 <@mesh, []> : tensor<i32>
        %14 = stablehlo.add %12, %13 : tensor<i32>
        %15 = sdy.sharding_constraint %14 <@mesh, []> : tensor<i32>
        stablehlo.return %15, %11#0, %11#1 : tensor<i32>, tensor<2x1xf32>, tensor<2x4xf32>
      }
      %4 = sdy.sharding_constraint %3#0 <@mesh, []> : tensor<i32>
      %5 = sdy.sharding_constraint %3#1 <@mesh, [{?}, {?}]> : tensor<2x1xf32>
      %6 = sdy.sharding_constraint %3#2 <@mesh, [{?}, {?}]> : tensor<2x4xf32>
      %7 = stablehlo.broadcast_in_dim %5, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x4xf32>
      %8 = sdy.sharding_constraint %7 <@mesh, [{?}, {?}]> : tensor<2x4xf32>
      %9 = stablehlo.add %arg1, %8 : tensor<2x4xf32>
      %10 = sdy.sharding_constraint %9 <@mesh, [{?}, {?}]> : tensor<2x4xf32>
      sdy.return %10 : tensor<2x4xf32>
    } : (tensor<2x16xf32>) -> tensor<2x16xf32>
    return %0 : tensor<2x16xf32>
  }
  func.func private @closed_call(%arg0: tensor<2x1xf32>, %arg1: tensor<2x4xf32>) -> (tensor<2x1xf32>, tensor<2x4xf32>) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.reduce(%arg1 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<2xf32>
    %1 = sdy.sharding_constraint %0 <@mesh, [{?}]> : tensor<2xf32>
    %2 = stablehlo.broadcast_in_dim %1, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
    %3 = sdy.sharding_constraint %2 <@mesh, [{?}, {?}]> : tensor<2x1xf32>
    %4 = stablehlo.add %arg0, %3 : tensor<2x1xf32>
    %5 = sdy.sharding_constraint %4 <@mesh, [{?}, {?}]> : tensor<2x1xf32>
    %6 = "stablehlo.collective_permute"(%arg1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>}> : (tensor<2x4xf32>) -> tensor<2x4xf32>
    return %5, %6 : tensor<2x1xf32>, tensor<2x4xf32>
  }
}

// -----

// Permutes that form no ring: a chain that doesn't close (device 3 sends nowhere, device 0 receives nothing), and a
// step along "cp" that also crosses "dp" (a diagonal). Reported, and left alone.
// CHECK-LABEL: func.func @chain
// CHECK-NOT:   shardfix
sdy.mesh @mesh = <["cp"=4]>

func.func @chain(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-remark @+1 {{ring-reorder: collective_permutes without a ring: no collective_permute forms a ring along one mesh axis: in the first, not every device along "cp" takes part exactly once (3 pairs); ring-reorder balances rings}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3]]> : tensor<3x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %p : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// CHECK-LABEL: func.func @diagonal
// CHECK-NOT:   shardfix
sdy.mesh @mesh = <["dp"=2, "cp"=4]>

func.func @diagonal(%arg0: tensor<2x16xf32>) -> tensor<2x16xf32> {
  // expected-remark @+1 {{ring-reorder: collective_permutes without a ring: no collective_permute forms a ring along one mesh axis: the first moves blocks along several mesh axes at once (dp, cp); ring-reorder balances rings}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"dp"}, {"cp"}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}]>] manual_axes={"dp", "cp"} (%x: tensor<1x4xf32>) {
    %p = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 5], [1, 6], [2, 7], [3, 4], [4, 1], [5, 2], [6, 3], [7, 0]]> : tensor<8x2xi64>}> : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %y = stablehlo.add %x, %p : tensor<1x4xf32>
    sdy.return %y : tensor<1x4xf32>
  } : (tensor<2x16xf32>) -> tensor<2x16xf32>
  return %0 : tensor<2x16xf32>
}

// RUN: %opt %s --split-input-file --verify-diagnostics -p ring-reorder
// RUN: %opt %s --split-input-file -p ring-reorder --report 2>%t.report >%t.out.mlir
// RUN: FileCheck %s --check-prefix=REPORT < %t.report
// RUN: FileCheck %s --check-prefix=REMARK < %t.report
// RUN: %opt %s --split-input-file > %t.plain.mlir
// RUN: diff %t.plain.mlir %t.out.mlir
// Every rule the sequence-layout analysis enforces, one small region each, and the structural reasons a ring region
// can't be reordered at all. Each refusal is said at the op that broke the rule (its own line and column; the
// expected-remark pins the place and that nothing else is said, the REPORT line the op's name and the whole
// message), and the IR is unchanged.
// Most cases are the ring total-sum of zigzag.mlir (proved there) with one op changed: each block's sum goes three
// steps around the ring (cp=4) and is added up, %t is every block's total once, %b it broadcast to the block.

// A ring all-reduce: own tokens added elementwise to the block that came three steps around the ring (token i
// of this device plus token i of another: which tokens meet depends on the layout).
sdy.mesh @mesh = <["cp"=4]>

func.func @own_plus_visiting(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.add' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 combines data of different tokens (blocks or positions) elementwise){{$}}
    // expected-remark @+1 {{combines data of different tokens (blocks or positions) elementwise)}}
    %y = stablehlo.add %x, %p3 : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// A ring all-gather: the visiting blocks concatenated along the sequence in arrival order (device order, not
// sequence order, once the sequence is reordered).
sdy.mesh @mesh = <["cp"=4]>

func.func @concatenated_blocks(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.concatenate' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 concatenates tokens that are not consecutive tokens of one block){{$}}
    // expected-remark @+1 {{concatenates tokens that are not consecutive tokens of one block)}}
    %y = stablehlo.concatenate %x, %p1, %p2, %p3, dim = 0 : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<16x8xf32>
    sdy.return %y : tensor<16x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// The total-sum region, but the own tokens are reversed along the sequence first.
sdy.mesh @mesh = <["cp"=4]>

func.func @reverse(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.reverse' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 reverses along the data, which depends on where tokens sit){{$}}
    // expected-remark @+1 {{reverses along the data, which depends on where tokens sit)}}
    %r = stablehlo.reverse %x, dims = [0] : tensor<4x8xf32>
    %y = stablehlo.add %r, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// The total-sum region, but the own tokens go through a cumulative sum along the sequence
// (jnp.cumsum lowers to a reduce_window).
sdy.mesh @mesh = <["cp"=4]>

func.func @cumulative_sum(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.reduce_window' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 slides a window along the data, which depends on where tokens sit){{$}}
    // expected-remark @+1 {{slides a window along the data, which depends on where tokens sit)}}
    %c = "stablehlo.reduce_window"(%x, %zero) <{window_dimensions = array<i64: 4, 1>, padding = dense<[[3, 0], [0, 0]]> : tensor<2x2xi64>}> ({
    ^bb0(%l: tensor<f32>, %r: tensor<f32>):
      %a = stablehlo.add %l, %r : tensor<f32>
      stablehlo.return %a : tensor<f32>
    }) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %y = stablehlo.add %c, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// The device index read as a number: partition_id converted to float and added to the tokens.
sdy.mesh @mesh = <["cp"=4]>

func.func @device_index_as_data(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %id = stablehlo.partition_id : tensor<ui32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.convert' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 reads the device index other than as a coordinate along a mesh axis){{$}}
    // expected-remark @+1 {{reads the device index other than as a coordinate along a mesh axis)}}
    %f = stablehlo.convert %id : (tensor<ui32>) -> tensor<f32>
    %fb = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
    %z = stablehlo.add %x, %b : tensor<4x8xf32>
    %y = stablehlo.add %z, %fb : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// A local index (iota along the sequence) added to token data: it follows places, not tokens.
sdy.mesh @mesh = <["cp"=4]>

func.func @local_index(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %i = stablehlo.iota dim = 0 : tensor<4x8xf32>
    %z = stablehlo.add %x, %b : tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.add' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 combines token data with data that varies with local position along dim 0 (an index within the block{{.*}}){{$}}
    // expected-remark @+1 {{combines token data with data that varies with local position along dim 0 (an index within the block}}
    %y = stablehlo.add %z, %i : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// A non-splat constant along the sequence (a table that can encode positions) added to token data.
sdy.mesh @mesh = <["cp"=4]>

func.func @constant_table(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %c = stablehlo.constant dense<[[1.0], [2.0], [3.0], [4.0]]> : tensor<4x1xf32>
    %cb = stablehlo.broadcast_in_dim %c, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
    %z = stablehlo.add %x, %b : tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.add' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 combines token data with data that varies with local position along dim 0 (an index within the block{{.*}}){{$}}
    // expected-remark @+1 {{combines token data with data that varies with local position along dim 0 (an index within the block}}
    %y = stablehlo.add %z, %cb : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// A ring that stops one step short: the total has folded in three of the four blocks, and which three depends on
// where the device sits (refused where the incomplete total meets the tokens).
sdy.mesh @mesh = <["cp"=4]>

func.func @short_ring(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t = stablehlo.add %t1, %p2 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.add' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 adds data to a partial aggregate){{$}}
    // expected-remark @+1 {{adds data to a partial aggregate)}}
    %y = stablehlo.add %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// A block skipped by comparing two device coordinates ("skip the visiting block unless it comes from an
// earlier device"): the analysis reads the coordinates compared as positions of whole blocks, which the reorder
// doesn't keep in ring order, and says so at the skip.
sdy.mesh @mesh = <["cp"=4]>

func.func @coordinate_skip(%arg0: tensor<16x8xf32>, %arg1: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"cp"}, {}]>, <@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>, %k: tensor<4x8xf32>) {
    %id = stablehlo.partition_id : tensor<ui32>
    %one = stablehlo.constant dense<1> : tensor<ui32>
    %four = stablehlo.constant dense<4> : tensor<ui32>
    %q = stablehlo.divide %id, %one : tensor<ui32>
    %me = stablehlo.remainder %q, %four : tensor<ui32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s0 = stablehlo.dot_general %x, %k, contracting_dims = [1] x [1] : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
    %a0 = stablehlo.reduce(%s0 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
    %k1 = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %src = "stablehlo.collective_permute"(%me) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<ui32>) -> tensor<ui32>
    %earlier = stablehlo.compare LT, %src, %me, UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:11: axis "cp", zigzag: not applied (not provably safe with zigzag: 'stablehlo.if' at {{.*}}refusals.mlir:[[# @LINE + 2]]:11 reads a whole 4-token block as one run of positions (a ring coordinate compared, or a table sliced a block at a time), which a reordered block no longer is: use each token's own position (coordinate * block + index) instead){{$}}
    // expected-remark @+1 {{reads a whole 4-token block as one run of positions (a ring coordinate compared, or a table sliced a block at a time), which a reordered block no longer is: use each token's own position (coordinate * block + index) instead)}}
    %a1 = "stablehlo.if"(%earlier) ({
      %s1 = stablehlo.dot_general %x, %k1, contracting_dims = [1] x [1] : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
      %r1 = stablehlo.reduce(%s1 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
      %n1 = stablehlo.add %a0, %r1 : tensor<4xf32>
      stablehlo.return %n1 : tensor<4xf32>
    }, {
      stablehlo.return %a0 : tensor<4xf32>
    }) : (tensor<i1>) -> tensor<4xf32>
    %k2 = "stablehlo.collective_permute"(%k1) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %k3 = "stablehlo.collective_permute"(%k2) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %s2 = stablehlo.dot_general %x, %k2, contracting_dims = [1] x [1] : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
    %r2 = stablehlo.reduce(%s2 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
    %s3 = stablehlo.dot_general %x, %k3, contracting_dims = [1] x [1] : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
    %r3 = stablehlo.reduce(%s3 init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x4xf32>, tensor<f32>) -> tensor<4xf32>
    %a2 = stablehlo.add %a1, %r2 : tensor<4xf32>
    %a3 = stablehlo.add %a2, %r3 : tensor<4xf32>
    %b = stablehlo.broadcast_in_dim %a3, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
    %y = stablehlo.multiply %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// Own tokens contracted against the visiting block's tokens position by position (a dot_general over the
// sequence dim of two different blocks: token i of one meets token i of the other).
sdy.mesh @mesh = <["cp"=4]>

func.func @contract_own_with_visiting(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.dot_general' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 contracts tokens of one block against tokens of another){{$}}
    // expected-remark @+1 {{contracts tokens of one block against tokens of another)}}
    %g = stablehlo.dot_general %x, %p1, contracting_dims = [0] x [0] : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    %y = stablehlo.dot_general %x, %g, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// An all_gather along the ring axis next to the ring: the gathered sequence is in device order.
sdy.mesh @mesh = <["cp"=4]>

func.func @all_gather_on_ring_axis(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.all_gather' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 moves data in device order){{$}}
    // expected-remark @+1 {{moves data in device order)}}
    %y = "stablehlo.all_gather"(%x) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids}> : (tensor<4x8xf32>) -> tensor<16x8xf32>
    sdy.return %y : tensor<16x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// A result declared replicated over the ring axis that is the device's own block sum (it differs from device
// to device, and which tokens it sums depends on the layout). The remark is at the op that makes the result.
sdy.mesh @mesh = <["cp"=4]>

func.func @replicated_result(%arg0: tensor<16x8xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:26: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.reduce' at {{.*}}refusals.mlir:[[# @LINE + 2]]:26 result 0 is replicated over "cp" but depends on which tokens a device holds){{$}}
    // expected-remark @+1 {{result 0 is replicated over "cp" but depends on which tokens a device holds}}
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    sdy.return %s : tensor<8xf32>
  } : (tensor<16x8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

// The block one step behind added twice to the total: partial sums that may count the same tokens twice.
sdy.mesh @mesh = <["cp"=4]>

func.func @double_count(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:11: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.add' at {{.*}}refusals.mlir:[[# @LINE + 2]]:11 merges two partial results (running sums or maxima) that may both hold the same block, counting its tokens twice (two merges that read the block of one ring step, or one block merged at two steps): merge each block once, the block that ring step brings){{$}}
    // expected-remark @+1 {{merges two partial results (running sums or maxima) that may both hold the same block, counting its tokens twice (two merges that read the block of one ring step, or one block merged at two steps): merge each block once, the block that ring step brings}}
    %t2 = stablehlo.add %t1, %p1 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// The block three steps behind returned as the result: the ring doesn't bring it home. The remark is at the last
// step it travels.
sdy.mesh @mesh = <["cp"=4]>

func.func @visiting_block_result(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:11: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.collective_permute' at {{.*}}refusals.mlir:[[# @LINE + 2]]:11 result 0 holds the tokens of another block (or only some of its own): a block that travels comes home after 4 ring steps){{$}}
    // expected-remark @+1 {{result 0 holds the tokens of another block (or only some of its own): a block that travels comes home after 4 ring steps}}
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    sdy.return %p3 : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// Token data moved two steps at once inside a ring region (a halo exchange, not a ring step): the region has a
// ring (the total-sum), so this is the analysis refusing the permute, not the ring detection (see @not_a_ring).
sdy.mesh @mesh = <["cp"=4]>

func.func @shift_by_two(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.collective_permute' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 moves token data other than one step around the "cp" ring){{$}}
    // expected-remark @+1 {{moves token data other than one step around the "cp" ring)}}
    %h = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<[[0, 2], [1, 3], [2, 0], [3, 1]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %z = stablehlo.add %x, %b : tensor<4x8xf32>
    %y = stablehlo.subtract %z, %h : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// Rows of a replicated table picked by the device index (dynamic_slice at coordinate * 4, a block's length): the
// rows of a block's positions, one run, which a reordered block's tokens no longer are. (Runs that stay whole,
// like Liu et al.'s segment ids sliced a chunk at a time, are proved: segment_table_attention in ring_programs.py.)
sdy.mesh @mesh = <["cp"=4]>

func.func @addressed_by_device_index(%arg0: tensor<16x8xf32>, %arg1: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"cp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>, %w: tensor<16x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %id = stablehlo.partition_id : tensor<ui32>
    %one = stablehlo.constant dense<1> : tensor<ui32>
    %four = stablehlo.constant dense<4> : tensor<ui32>
    %q = stablehlo.divide %id, %one : tensor<ui32>
    %me = stablehlo.remainder %q, %four : tensor<ui32>
    %mi = stablehlo.convert %me : (tensor<ui32>) -> tensor<i32>
    %four32 = stablehlo.constant dense<4> : tensor<i32>
    %row = stablehlo.multiply %mi, %four32 : tensor<i32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:13: axis "cp", zigzag: not applied (not provably safe with zigzag: 'stablehlo.dynamic_slice' at {{.*}}refusals.mlir:[[# @LINE + 2]]:13 reads a whole 4-token block as one run of positions (a ring coordinate compared, or a table sliced a block at a time), which a reordered block no longer is: use each token's own position (coordinate * block + index) instead){{$}}
    // expected-remark @+1 {{reads a whole 4-token block as one run of positions (a ring coordinate compared, or a table sliced a block at a time), which a reordered block no longer is: use each token's own position (coordinate * block + index) instead)}}
    %rows = stablehlo.dynamic_slice %w, %row, %c0, sizes = [4, 8] : (tensor<16x8xf32>, tensor<i32>, tensor<i32>) -> tensor<4x8xf32>
    %z = stablehlo.add %x, %b : tensor<4x8xf32>
    %y = stablehlo.add %z, %rows : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// A proved region (the total-sum) whose sequence, 12 tokens, is not a multiple of 2*cp = 8 (zigzag splits
// every block into two chunks of S/(2*cp) tokens). Said at the region.
sdy.mesh @mesh = <["cp"=4]>

func.func @indivisible(%arg0: tensor<12x8xf32>) -> tensor<12x8xf32> {
  // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:8: axis "cp", zigzag: not applied (sequence length 12 is not a multiple of 2*cp = 8){{$}}
  // expected-remark @+1 {{sequence length 12 is not a multiple of 2*cp = 8)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<3x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<3x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<3x8xf32>
    %y = stablehlo.add %x, %b : tensor<3x8xf32>
    sdy.return %y : tensor<3x8xf32>
  } : (tensor<12x8xf32>) -> tensor<12x8xf32>
  return %0 : tensor<12x8xf32>
}

// -----

// Nothing enters the region sharded on the ring axis: there is no sequence to reorder.
sdy.mesh @mesh = <["cp"=4]>

func.func @no_sequence_operand(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:8: axis "cp", zigzag: not applied (not provably safe: 'sdy.manual_computation' at {{.*}}refusals.mlir:[[# @LINE + 2]]:8 no operand is sharded on the ring axis "cp" along a sequence dim){{$}}
  // expected-remark @+1 {{no operand is sharded on the ring axis "cp" along a sequence dim)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %p1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    sdy.return %p3 : tensor<4x8xf32>
  } : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// The sequence sharded on "cp" and "x" together: a device's block is not one contiguous shard along the ring,
// so there is no sequence operand the permutation could move.
sdy.mesh @mesh = <["cp"=4, "x"=2]>

func.func @ring_axis_with_another(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:8: axis "cp", zigzag: not applied (not provably safe: 'sdy.manual_computation' at {{.*}}refusals.mlir:[[# @LINE + 2]]:8 no operand is sharded on the ring axis "cp" along a sequence dim){{$}}
  // expected-remark @+1 {{no operand is sharded on the ring axis "cp" along a sequence dim)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp", "x"}, {}]>] out_shardings=[<@mesh, [{"cp", "x"}, {}]>] manual_axes={"cp", "x"} (%x: tensor<2x8xf32>) {
    %p1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]> : tensor<8x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]> : tensor<8x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]> : tensor<8x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
    sdy.return %p3 : tensor<2x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// The mesh lists its devices in an explicit order: ring positions are not partition ids / stride.
sdy.mesh @mesh = <["cp"=4], device_ids=[3, 2, 1, 0]>

func.func @explicit_device_order(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // REMARK: remark: {{.*}}refusals.mlir:[[# @LINE + 2]]:8: ring-reorder: collective_permutes without a ring: the mesh has an explicit device order{{$}}
  // expected-remark @+1 {{collective_permutes without a ring: the mesh has an explicit device order}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// A ring along "cp" in a region manual over "dp" only.
sdy.mesh @mesh = <["dp"=2, "cp"=4]>

func.func @ring_axis_not_manual(%arg0: tensor<32x8xf32>) -> tensor<32x8xf32> {
  // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:8: axis "cp", zigzag: not applied (the ring axis "cp" is not manual in the region){{$}}
  // expected-remark @+1 {{the ring axis "cp" is not manual in the region)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"dp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {}]>] manual_axes={"dp"} (%x: tensor<16x8xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %p1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>}> : (tensor<16x8xf32>) -> tensor<16x8xf32>
    %y = stablehlo.add %x, %p1 : tensor<16x8xf32>
    sdy.return %y : tensor<16x8xf32>
  } : (tensor<32x8xf32>) -> tensor<32x8xf32>
  return %0 : tensor<32x8xf32>
}

// -----

// Rings along both mesh axes: which one is the sequence's?
sdy.mesh @mesh = <["dp"=2, "cp"=4]>

func.func @rings_on_two_axes(%arg0: tensor<32x8xf32>) -> tensor<32x8xf32> {
  // REMARK: remark: {{.*}}refusals.mlir:[[# @LINE + 2]]:8: ring-reorder: collective_permutes without a ring: rings along several axes (cp, dp){{$}}
  // expected-remark @+1 {{collective_permutes without a ring: rings along several axes (cp, dp)}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"dp", "cp"}, {}]>] out_shardings=[<@mesh, [{"dp", "cp"}, {}]>] manual_axes={"dp", "cp"} (%x: tensor<4x8xf32>) {
    %p1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %p2 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 4], [4, 0], [1, 5], [5, 1], [2, 6], [6, 2], [3, 7], [7, 3]]> : tensor<8x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %p1, %p2 : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<32x8xf32>) -> tensor<32x8xf32>
  return %0 : tensor<32x8xf32>
}

// -----

// A shift by two along "cp" is not a ring over every shard (two cycles of two).
sdy.mesh @mesh = <["cp"=4]>

func.func @not_a_ring(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // REMARK: remark: {{.*}}refusals.mlir:[[# @LINE + 2]]:8: ring-reorder: collective_permutes without a ring: no collective_permute forms a ring along one mesh axis: the first sends each block 2 devices along "cp" (device i to i + 2), not to the next one; ring-reorder balances rings that pass each block to the next device along one axis (lax.ppermute with perm [(i, (i + 1) % n) for i in range(n)], or the reverse){{$}}
  // expected-remark @+1 {{collective_permutes without a ring: no collective_permute forms a ring along one mesh axis: the first sends each block 2 devices along "cp" (device i to i + 2), not to the next one}}
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %y = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 2], [1, 3], [2, 0], [3, 1]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// A loop whose trip count isn't a counted range (it runs until the data says stop): the ring steps can't be counted.
sdy.mesh @mesh = <["cp"=4]>

func.func @uncounted_loop(%arg0: tensor<16x8xf32>, %stop: tensor<f32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0, %stop) in_shardings=[<@mesh, [{"cp"}, {}]>, <@mesh, []>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>, %s: tensor<f32>) {
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.while' at {{.*}}refusals.mlir:[[# @LINE + 2]]:10 changes values in a loop whose trip count is unknown){{$}}
    // expected-remark @+1 {{changes values in a loop whose trip count is unknown)}}
    %r = stablehlo.while(%k = %x) : tensor<4x8xf32>
    cond {
      %first = stablehlo.slice %k [0:1, 0:1] : (tensor<4x8xf32>) -> tensor<1x1xf32>
      %v = stablehlo.reshape %first : (tensor<1x1xf32>) -> tensor<f32>
      %lt = stablehlo.compare LT, %v, %s, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %p = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
      stablehlo.return %p : tensor<4x8xf32>
    }
    sdy.return %r : tensor<4x8xf32>
  } : (tensor<16x8xf32>, tensor<f32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// -----

// The ring total-sum in a loop counted with an unsigned counter (ui32 `i < 4`): no trip count is read from it, so
// the loop is refused at the loop, saying so (with an i32 counter it is proved).
sdy.mesh @mesh = <["cp"=4]>

func.func @unsigned_counter(%arg0: tensor<16x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<ui32>
    %t0 = stablehlo.constant dense<0.0> : tensor<8xf32>
    // REPORT: ring: {{.*}}refusals.mlir:[[# @LINE + 2]]:12: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.while' at {{.*}}refusals.mlir:[[# @LINE + 2]]:12 counts its iterations with a uint32 counter: `i < n` on unsigned integers (where 0 - 1 is the largest) gives no trip count the analysis reads, only a signed counter's does; count with a signed int32 counter (int32 bounds for lax.fori_loop, an int32 carry for lax.while_loop)){{$}}
    // expected-remark @+1 {{counts its iterations with a uint32 counter: `i < n` on unsigned integers (where 0 - 1 is the largest) gives no trip count the analysis reads, only a signed counter's does; count with a signed int32 counter (int32 bounds for lax.fori_loop, an int32 carry for lax.while_loop)}}
    %r:3 = stablehlo.while(%i = %c0, %t = %t0, %k = %x) : tensor<ui32>, tensor<8xf32>, tensor<4x8xf32>
    cond {
      %n = stablehlo.constant dense<4> : tensor<ui32>
      %lt = stablehlo.compare LT, %i, %n : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %zero = stablehlo.constant dense<0.0> : tensor<f32>
      %s = stablehlo.reduce(%k init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
      %t1 = stablehlo.add %t, %s : tensor<8xf32>
      %k1 = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
      %one = stablehlo.constant dense<1> : tensor<ui32>
      %i1 = stablehlo.add %i, %one : tensor<ui32>
      stablehlo.return %i1, %t1, %k1 : tensor<ui32>, tensor<8xf32>, tensor<4x8xf32>
    }
    %b = stablehlo.broadcast_in_dim %r#1, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=zigzag}' | FileCheck %s
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=zigzag}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT
// Zigzag around a ring region the analysis proves: the ring total-sum. Each device reduces its block over the
// sequence, the partial sums go three steps around the ring (cp=4) and are added up (a function of all tokens,
// each block counted once), and the total is added to the device's own tokens: own tokens plus an order-free total
// keep their values under any order of the sequence.
//
// The permutation moves no more data than it must: each device's two half shards move with two one-to-one
// collective_permutes and a select on the parity of the ring coordinate (partition_id / stride % cp % 2) puts the
// lower chunk first; the inverse selects the even and the odd chunk and sends each home. Nothing is gathered.
// Only sequence-sharded operands and results are permuted: a replicated weight operand and a replicated result (the
// total, which doesn't depend on the order) pass untouched.

sdy.mesh @mesh = <["cp"=4]>

// cp=4, 16 tokens, 4 per device in two halves of 2. First halves go 0->0, 1->2, 2->3, 3->1; second halves
// 0->1, 1->3, 2->2, 3->0 (chunk order 0 7 | 1 6 | 2 5 | 3 4). The inverse sends the even chunk of device r to
// device chunk/2 (0->0, 1->3, 2->1, 3->2) and the odd one likewise (0->3, 1->0, 2->2, 3->1).
// CHECK-LABEL: func.func @total_sum(%arg0: tensor<16x8xf32>, %arg1: tensor<8x8xf32>)
// CHECK-NEXT:   %[[P:.*]] = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%[[X:.*]]: tensor<4x8xf32>) {
// CHECK-NEXT:     %[[A:.*]] = stablehlo.slice %[[X]] [0:2, 0:8] : (tensor<4x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT:     %[[B:.*]] = stablehlo.slice %[[X]] [2:4, 0:8] : (tensor<4x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT:     %[[PID:.*]] = stablehlo.partition_id : tensor<ui32>
// CHECK-NEXT:     %[[STRIDE:.*]] = stablehlo.constant dense<1> : tensor<ui32>
// CHECK-NEXT:     %[[CP:.*]] = stablehlo.constant dense<4> : tensor<ui32>
// CHECK-NEXT:     %[[TWO:.*]] = stablehlo.constant dense<2> : tensor<ui32>
// CHECK-NEXT:     %[[ZERO:.*]] = stablehlo.constant dense<0> : tensor<ui32>
// CHECK-NEXT:     %[[Q:.*]] = stablehlo.divide %[[PID]], %[[STRIDE]] : tensor<ui32>
// CHECK-NEXT:     %[[R:.*]] = stablehlo.remainder %[[Q]], %[[CP]] : tensor<ui32>
// CHECK-NEXT:     %[[PAR:.*]] = stablehlo.remainder %[[R]], %[[TWO]] : tensor<ui32>
// CHECK-NEXT:     %[[EVEN:.*]] = stablehlo.compare EQ, %[[PAR]], %[[ZERO]], UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
// CHECK-NEXT:     %[[P1:.*]] = "stablehlo.collective_permute"(%[[A]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<{{\[}}[0, 0], [1, 2], [2, 3], [3, 1]]> : tensor<4x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT:     %[[P2:.*]] = "stablehlo.collective_permute"(%[[B]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 3], [2, 2], [3, 0]]> : tensor<4x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT:     %[[LO:.*]] = stablehlo.concatenate %[[P1]], %[[P2]], dim = 0 : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:     %[[HI:.*]] = stablehlo.concatenate %[[P2]], %[[P1]], dim = 0 : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:     %[[Y:.*]] = stablehlo.select %[[EVEN]], %[[LO]], %[[HI]] : tensor<i1>, tensor<4x8xf32>
// CHECK-NEXT:     sdy.return %[[Y]] : tensor<4x8xf32>
// CHECK-NEXT:   } {shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}} : (tensor<16x8xf32>) -> tensor<16x8xf32>
// The region reads the permuted sequence and the weights as they were; its body is unchanged.
// CHECK-NEXT:   %[[REG:.*]]:2 = sdy.manual_computation(%[[P]], %arg1) in_shardings=[<@mesh, [{"cp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>, <@mesh, [{}]>] manual_axes={"cp"}
// CHECK:          stablehlo.reduce
// CHECK-COUNT-3:  "stablehlo.collective_permute"({{.*}}source_target_pairs = dense<{{\[}}[0, 1], [1, 2], [2, 3], [3, 0]]>
// CHECK:          stablehlo.dot_general
// CHECK-NEXT:     sdy.return
// CHECK-NEXT:   } {shardfix.ring_reorder = "zigzag"} : (tensor<16x8xf32>, tensor<8x8xf32>) -> (tensor<16x8xf32>, tensor<8xf32>)
// CHECK-NEXT:   %[[I:.*]] = sdy.manual_computation(%[[REG]]#0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%[[Z:.*]]: tensor<4x8xf32>) {
// CHECK-NEXT:     %[[IA:.*]] = stablehlo.slice %[[Z]] [0:2, 0:8] : (tensor<4x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT:     %[[IB:.*]] = stablehlo.slice %[[Z]] [2:4, 0:8] : (tensor<4x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT:     %[[IPID:.*]] = stablehlo.partition_id : tensor<ui32>
// CHECK-NEXT:     %[[ISTRIDE:.*]] = stablehlo.constant dense<1> : tensor<ui32>
// CHECK-NEXT:     %[[ICP:.*]] = stablehlo.constant dense<4> : tensor<ui32>
// CHECK-NEXT:     %[[ITWO:.*]] = stablehlo.constant dense<2> : tensor<ui32>
// CHECK-NEXT:     %[[IZERO:.*]] = stablehlo.constant dense<0> : tensor<ui32>
// CHECK-NEXT:     %[[IQ:.*]] = stablehlo.divide %[[IPID]], %[[ISTRIDE]] : tensor<ui32>
// CHECK-NEXT:     %[[IR:.*]] = stablehlo.remainder %[[IQ]], %[[ICP]] : tensor<ui32>
// CHECK-NEXT:     %[[IPAR:.*]] = stablehlo.remainder %[[IR]], %[[ITWO]] : tensor<ui32>
// CHECK-NEXT:     %[[IEVEN:.*]] = stablehlo.compare EQ, %[[IPAR]], %[[IZERO]], UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
// CHECK-NEXT:     %[[E:.*]] = stablehlo.select %[[IEVEN]], %[[IA]], %[[IB]] : tensor<i1>, tensor<2x8xf32>
// CHECK-NEXT:     %[[O:.*]] = stablehlo.select %[[IEVEN]], %[[IB]], %[[IA]] : tensor<i1>, tensor<2x8xf32>
// CHECK-NEXT:     %[[IP1:.*]] = "stablehlo.collective_permute"(%[[E]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<{{\[}}[0, 0], [1, 3], [2, 1], [3, 2]]> : tensor<4x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT:     %[[IP2:.*]] = "stablehlo.collective_permute"(%[[O]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 2], [3, 1]]> : tensor<4x2xi64>}> : (tensor<2x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT:     %[[IY:.*]] = stablehlo.concatenate %[[IP1]], %[[IP2]], dim = 0 : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:     sdy.return %[[IY]] : tensor<4x8xf32>
// CHECK-NEXT:   } {shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}} : (tensor<16x8xf32>) -> tensor<16x8xf32>
// CHECK-NEXT:   return %[[I]], %[[REG]]#1 : tensor<16x8xf32>, tensor<8xf32>
// REPORT: ring: {{.*}}zigzag.mlir:[[# @LINE + 2]]:10: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored){{$}}
func.func @total_sum(%q: tensor<16x8xf32>, %w: tensor<8x8xf32>) -> (tensor<16x8xf32>, tensor<8xf32>) {
  %0:2 = sdy.manual_computation(%q, %w) in_shardings=[<@mesh, [{"cp"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>, <@mesh, [{}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>, %v: tensor<8x8xf32>) {
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
    %z = stablehlo.dot_general %y, %v, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    sdy.return %z, %t : tensor<4x8xf32>, tensor<8xf32>
  } : (tensor<16x8xf32>, tensor<8x8xf32>) -> (tensor<16x8xf32>, tensor<8xf32>)
  return %0#0, %0#1 : tensor<16x8xf32>, tensor<8xf32>
}

// -----

// The ring axis is not the last mesh axis: partition ids step by 2 along "cp" (the stride the parity divides by),
// there is one ring per "tp" shard (ids [0, 2, 4, 6] and [1, 3, 5, 7]), and the sequence is dim 1.
sdy.mesh @mesh = <["cp"=4, "tp"=2]>

// CHECK-LABEL: func.func @strided_ring(%arg0: tensor<2x16xf32>)
// CHECK-NEXT:   %[[P:.*]] = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"tp"}, {"cp"}]>] out_shardings=[<@mesh, [{"tp"}, {"cp"}]>] manual_axes={"cp", "tp"} (%[[X:.*]]: tensor<1x4xf32>) {
// CHECK-NEXT:     %[[A:.*]] = stablehlo.slice %[[X]] [0:1, 0:2] : (tensor<1x4xf32>) -> tensor<1x2xf32>
// CHECK-NEXT:     %[[B:.*]] = stablehlo.slice %[[X]] [0:1, 2:4] : (tensor<1x4xf32>) -> tensor<1x2xf32>
// CHECK-NEXT:     %[[PID:.*]] = stablehlo.partition_id : tensor<ui32>
// CHECK-NEXT:     %[[STRIDE:.*]] = stablehlo.constant dense<2> : tensor<ui32>
// CHECK-NEXT:     %[[CP:.*]] = stablehlo.constant dense<4> : tensor<ui32>
// CHECK-NEXT:     %[[TWO:.*]] = stablehlo.constant dense<2> : tensor<ui32>
// CHECK-NEXT:     %[[ZERO:.*]] = stablehlo.constant dense<0> : tensor<ui32>
// CHECK-NEXT:     %[[Q:.*]] = stablehlo.divide %[[PID]], %[[STRIDE]] : tensor<ui32>
// CHECK-NEXT:     %[[R:.*]] = stablehlo.remainder %[[Q]], %[[CP]] : tensor<ui32>
// CHECK-NEXT:     %[[PAR:.*]] = stablehlo.remainder %[[R]], %[[TWO]] : tensor<ui32>
// CHECK-NEXT:     %[[EVEN:.*]] = stablehlo.compare EQ, %[[PAR]], %[[ZERO]], UNSIGNED : (tensor<ui32>, tensor<ui32>) -> tensor<i1>
// CHECK-NEXT:     %[[P1:.*]] = "stablehlo.collective_permute"(%[[A]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<{{\[}}[0, 0], [2, 4], [4, 6], [6, 2], [1, 1], [3, 5], [5, 7], [7, 3]]> : tensor<8x2xi64>}> : (tensor<1x2xf32>) -> tensor<1x2xf32>
// CHECK-NEXT:     %[[P2:.*]] = "stablehlo.collective_permute"(%[[B]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<{{\[}}[0, 2], [2, 6], [4, 4], [6, 0], [1, 3], [3, 7], [5, 5], [7, 1]]> : tensor<8x2xi64>}> : (tensor<1x2xf32>) -> tensor<1x2xf32>
// CHECK-NEXT:     %[[LO:.*]] = stablehlo.concatenate %[[P1]], %[[P2]], dim = 1 : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<1x4xf32>
// CHECK-NEXT:     %[[HI:.*]] = stablehlo.concatenate %[[P2]], %[[P1]], dim = 1 : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<1x4xf32>
// CHECK-NEXT:     %[[Y:.*]] = stablehlo.select %[[EVEN]], %[[LO]], %[[HI]] : tensor<i1>, tensor<1x4xf32>
// CHECK-NEXT:     sdy.return %[[Y]] : tensor<1x4xf32>
// CHECK-NEXT:   } {shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}} : (tensor<2x16xf32>) -> tensor<2x16xf32>
// CHECK-NEXT:   %[[REG:.*]] = sdy.manual_computation(%[[P]])
// CHECK:        } {shardfix.ring_reorder = "zigzag"} : (tensor<2x16xf32>) -> tensor<2x16xf32>
// CHECK-NEXT:   %[[I:.*]] = sdy.manual_computation(%[[REG]])
// CHECK:          %[[E:.*]] = stablehlo.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<i1>, tensor<1x2xf32>
// CHECK-NEXT:     %[[O:.*]] = stablehlo.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<i1>, tensor<1x2xf32>
// CHECK-NEXT:     %[[IP1:.*]] = "stablehlo.collective_permute"(%[[E]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<{{\[}}[0, 0], [2, 6], [4, 2], [6, 4], [1, 1], [3, 7], [5, 3], [7, 5]]> : tensor<8x2xi64>}>
// CHECK-NEXT:     %[[IP2:.*]] = "stablehlo.collective_permute"(%[[O]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<{{\[}}[0, 6], [2, 0], [4, 4], [6, 2], [1, 7], [3, 1], [5, 5], [7, 3]]> : tensor<8x2xi64>}>
// CHECK-NEXT:     %[[IY:.*]] = stablehlo.concatenate %[[IP1]], %[[IP2]], dim = 1 : (tensor<1x2xf32>, tensor<1x2xf32>) -> tensor<1x4xf32>
// CHECK-NEXT:     sdy.return %[[IY]] : tensor<1x4xf32>
// CHECK-NEXT:   } {shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}} : (tensor<2x16xf32>) -> tensor<2x16xf32>
// CHECK-NEXT:   return %[[I]] : tensor<2x16xf32>
// REPORT: ring: {{.*}}zigzag.mlir:[[# @LINE + 2]]:8: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored){{$}}
func.func @strided_ring(%q: tensor<2x16xf32>) -> tensor<2x16xf32> {
  %0 = sdy.manual_computation(%q) in_shardings=[<@mesh, [{"tp"}, {"cp"}]>] out_shardings=[<@mesh, [{"tp"}, {"cp"}]>] manual_axes={"cp", "tp"} (%x: tensor<1x4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<1x4xf32>, tensor<f32>) -> tensor<1xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]> : tensor<8x2xi64>}> : (tensor<1xf32>) -> tensor<1xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]> : tensor<8x2xi64>}> : (tensor<1xf32>) -> tensor<1xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 2], [2, 4], [4, 6], [6, 0], [1, 3], [3, 5], [5, 7], [7, 1]]> : tensor<8x2xi64>}> : (tensor<1xf32>) -> tensor<1xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<1xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<1xf32>
    %t = stablehlo.add %t2, %p3 : tensor<1xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [0] : (tensor<1xf32>) -> tensor<1x4xf32>
    %y = stablehlo.add %x, %b : tensor<1x4xf32>
    sdy.return %y : tensor<1x4xf32>
  } : (tensor<2x16xf32>) -> tensor<2x16xf32>
  return %0 : tensor<2x16xf32>
}

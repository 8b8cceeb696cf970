// RUN: %opt %s -p ring-reorder | FileCheck %s
// RUN: %opt %s -p 'ring-reorder{strategy=zigzag}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT
// Zigzag around a ring region (cp=4, 16 tokens, 4 per device): before it, each device's two half shards move with
// two one-to-one collective_permutes (first halves 0->0, 1->2, 2->3, 3->1; second halves 0->1, 1->3, 2->2, 3->0)
// and a select puts the lower chunk first; after it, the inverse. Nothing is gathered.

sdy.mesh @mesh = <["cp"=4]>

// CHECK-LABEL: func @ring
// CHECK:      %[[P:.*]] = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%[[X:.*]]: tensor<4x8xf32>) {
// CHECK-NEXT:   %[[A:.*]] = stablehlo.slice %[[X]] [0:2, 0:8] : (tensor<4x8xf32>) -> tensor<2x8xf32>
// CHECK-NEXT:   %[[B:.*]] = stablehlo.slice %[[X]] [2:4, 0:8] : (tensor<4x8xf32>) -> tensor<2x8xf32>
// CHECK:        %[[EVEN:.*]] = stablehlo.compare EQ
// CHECK-NEXT:   %[[P1:.*]] = "stablehlo.collective_permute"(%[[A]]) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<{{\[}}[0, 0], [1, 2], [2, 3], [3, 1]]> : tensor<4x2xi64>}>
// CHECK-NEXT:   %[[P2:.*]] = "stablehlo.collective_permute"(%[[B]]) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, source_target_pairs = dense<{{\[}}[0, 1], [1, 3], [2, 2], [3, 0]]> : tensor<4x2xi64>}>
// CHECK-NEXT:   %[[LO:.*]] = stablehlo.concatenate %[[P1]], %[[P2]], dim = 0
// CHECK-NEXT:   %[[HI:.*]] = stablehlo.concatenate %[[P2]], %[[P1]], dim = 0
// CHECK-NEXT:   %[[Y:.*]] = stablehlo.select %[[EVEN]], %[[LO]], %[[HI]]
// CHECK-NEXT:   sdy.return %[[Y]]
// CHECK-NEXT: } {shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}}
// CHECK:      %[[R:.*]] = sdy.manual_computation(%[[P]], %{{.*}}, %arg2)
// CHECK:      } {shardfix.ring_reorder = "zigzag"}
// CHECK:      %[[I:.*]] = sdy.manual_computation(%[[R]])
// CHECK:        %[[E:.*]] = stablehlo.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<i1>, tensor<2x8xf32>
// CHECK:        "stablehlo.collective_permute"(%[[E]]) {{.*}} source_target_pairs = dense<{{\[}}[0, 0], [1, 3], [2, 1], [3, 2]]>
// CHECK:        "stablehlo.collective_permute"({{.*}} source_target_pairs = dense<{{\[}}[0, 3], [1, 0], [2, 2], [3, 1]]>
// CHECK:      } {shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}}
// CHECK-NEXT: return %[[I]]
// REPORT: ring: {{.*}}zigzag.mlir:[[# @LINE + 2]]:8: axis "cp", zigzag: applied (2 operand(s) reordered, 1 result(s) restored)
func.func @ring(%q: tensor<16x8xf32>, %pos: tensor<16xi32>, %w: tensor<8x8xf32>) -> tensor<16x8xf32> {
  %0 = sdy.manual_computation(%q, %pos, %w) in_shardings=[<@mesh, [{"cp"}, {}]>, <@mesh, [{"cp"}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>, %p: tensor<4xi32>, %v: tensor<8x8xf32>) {
    %1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %2 = "stablehlo.collective_permute"(%1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %3 = "stablehlo.collective_permute"(%2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %4 = stablehlo.add %x, %3 : tensor<4x8xf32>
    %5 = stablehlo.dot_general %4, %v, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    sdy.return %5 : tensor<4x8xf32>
  } : (tensor<16x8xf32>, tensor<16xi32>, tensor<8x8xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}

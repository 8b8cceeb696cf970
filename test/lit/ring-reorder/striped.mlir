// RUN: %opt %s -p 'ring-reorder{strategy=striped}' | FileCheck %s
// RUN: %opt %s -p 'ring-reorder{strategy=striped stripe=2}' | FileCheck %s --check-prefix=STRIPE2
// RUN: %opt %s -p 'ring-reorder{strategy=striped}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT1
// RUN: %opt %s -p 'ring-reorder{strategy=striped stripe=2}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT2
// RUN: %opt %s -p 'ring-reorder{strategy=striped stripe=8}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT8
// RUN: %opt %s -p 'ring-reorder{strategy=striped stripe=8}' > %t.stripe8.mlir
// RUN: %opt %s > %t.plain.mlir
// RUN: diff %t.plain.mlir %t.stripe8.mlir
// Striped order around a ring region the analysis proves (the ring total-sum: own tokens plus the sum of every
// block, each counted once). The data moves with one all_to_all per tensor inside the ring groups (the two rings
// along "cp" of a dp=2 x cp=4 mesh: partition ids [0,1,2,3] and [4,5,6,7]): each device's block, seen as
// (rows, cp, stripe), sends column e to device e; the inverse sends them back. 64 tokens, 16 per device: stripe=1
// and stripe=2 divide it (the sequence must be a multiple of cp*cp*stripe); stripe=8 (128) does not, and the
// region is left alone.

sdy.mesh @mesh = <["dp"=2, "cp"=4]>

// CHECK-LABEL: func.func @total_sum(%arg0: tensor<2x64xf32>)
// CHECK-NEXT:   %[[P:.*]] = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"dp"}, {"cp"}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}]>] manual_axes={"dp", "cp"} (%[[X:.*]]: tensor<1x16xf32>) {
// CHECK-NEXT:     %[[S:.*]] = stablehlo.reshape %[[X]] : (tensor<1x16xf32>) -> tensor<1x4x4x1xf32>
// CHECK-NEXT:     %[[T:.*]] = "stablehlo.all_to_all"(%[[S]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, concat_dimension = 1 : i64, replica_groups = dense<{{\[}}[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, split_count = 4 : i64, split_dimension = 2 : i64}> : (tensor<1x4x4x1xf32>) -> tensor<1x16x1x1xf32>
// CHECK-NEXT:     %[[Y:.*]] = stablehlo.reshape %[[T]] : (tensor<1x16x1x1xf32>) -> tensor<1x16xf32>
// CHECK-NEXT:     sdy.return %[[Y]] : tensor<1x16xf32>
// CHECK-NEXT:   } {shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "striped", stripe = 1 : i64}} : (tensor<2x64xf32>) -> tensor<2x64xf32>
// CHECK-NEXT:   %[[REG:.*]] = sdy.manual_computation(%[[P]]) in_shardings=[<@mesh, [{"dp"}, {"cp"}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}]>] manual_axes={"dp", "cp"}
// CHECK:        } {shardfix.ring_reorder = "striped{stripe=1}"} : (tensor<2x64xf32>) -> tensor<2x64xf32>
// CHECK-NEXT:   %[[I:.*]] = sdy.manual_computation(%[[REG]]) in_shardings=[<@mesh, [{"dp"}, {"cp"}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}]>] manual_axes={"dp", "cp"} (%[[Z:.*]]: tensor<1x16xf32>) {
// CHECK-NEXT:     %[[IS:.*]] = stablehlo.reshape %[[Z]] : (tensor<1x16xf32>) -> tensor<1x16x1x1xf32>
// CHECK-NEXT:     %[[IT:.*]] = "stablehlo.all_to_all"(%[[IS]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, concat_dimension = 2 : i64, replica_groups = dense<{{\[}}[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, split_count = 4 : i64, split_dimension = 1 : i64}> : (tensor<1x16x1x1xf32>) -> tensor<1x4x4x1xf32>
// CHECK-NEXT:     %[[IY:.*]] = stablehlo.reshape %[[IT]] : (tensor<1x4x4x1xf32>) -> tensor<1x16xf32>
// CHECK-NEXT:     sdy.return %[[IY]] : tensor<1x16xf32>
// CHECK-NEXT:   } {shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = true, strategy = "striped", stripe = 1 : i64}} : (tensor<2x64xf32>) -> tensor<2x64xf32>
// CHECK-NEXT:   return %[[I]] : tensor<2x64xf32>

// With stripe=2 each device's block is (2 rows, 4 devices, 2 tokens).
// STRIPE2-LABEL: func.func @total_sum(%arg0: tensor<2x64xf32>)
// STRIPE2-NEXT:   %[[P:.*]] = sdy.manual_computation(%arg0) {{.*}} (%[[X:.*]]: tensor<1x16xf32>) {
// STRIPE2-NEXT:     %[[S:.*]] = stablehlo.reshape %[[X]] : (tensor<1x16xf32>) -> tensor<1x2x4x2xf32>
// STRIPE2-NEXT:     %[[T:.*]] = "stablehlo.all_to_all"(%[[S]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, concat_dimension = 1 : i64, replica_groups = dense<{{\[}}[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, split_count = 4 : i64, split_dimension = 2 : i64}> : (tensor<1x2x4x2xf32>) -> tensor<1x8x1x2xf32>
// STRIPE2-NEXT:     %[[Y:.*]] = stablehlo.reshape %[[T]] : (tensor<1x8x1x2xf32>) -> tensor<1x16xf32>
// STRIPE2-NEXT:     sdy.return %[[Y]] : tensor<1x16xf32>
// STRIPE2-NEXT:   } {shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "striped", stripe = 2 : i64}}
// STRIPE2-NEXT:   %[[REG:.*]] = sdy.manual_computation(%[[P]])
// STRIPE2:        } {shardfix.ring_reorder = "striped{stripe=2}"}
// STRIPE2-NEXT:   %[[I:.*]] = sdy.manual_computation(%[[REG]]) {{.*}} (%[[Z:.*]]: tensor<1x16xf32>) {
// STRIPE2-NEXT:     %[[IS:.*]] = stablehlo.reshape %[[Z]] : (tensor<1x16xf32>) -> tensor<1x8x1x2xf32>
// STRIPE2-NEXT:     %[[IT:.*]] = "stablehlo.all_to_all"(%[[IS]]) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, concat_dimension = 2 : i64, replica_groups = dense<{{\[}}[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, split_count = 4 : i64, split_dimension = 1 : i64}> : (tensor<1x8x1x2xf32>) -> tensor<1x2x4x2xf32>
// STRIPE2-NEXT:     %[[IY:.*]] = stablehlo.reshape %[[IT]] : (tensor<1x2x4x2xf32>) -> tensor<1x16xf32>
// STRIPE2-NEXT:     sdy.return %[[IY]] : tensor<1x16xf32>
// STRIPE2-NEXT:   } {shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = true, strategy = "striped", stripe = 2 : i64}}
// STRIPE2-NEXT:   return %[[I]] : tensor<2x64xf32>

// REPORT1: ring: {{.*}}striped.mlir:[[# @LINE + 4]]:8: axis "cp", striped{stripe=1}: applied (1 operand(s) reordered, 1 result(s) restored){{$}}
// REPORT2: ring: {{.*}}striped.mlir:[[# @LINE + 3]]:8: axis "cp", striped{stripe=2}: applied (1 operand(s) reordered, 1 result(s) restored){{$}}
// REPORT8: ring: {{.*}}striped.mlir:[[# @LINE + 2]]:8: axis "cp", striped{stripe=8}: not applied (sequence length 64 is not a multiple of cp*cp*stripe = 128){{$}}
func.func @total_sum(%q: tensor<2x64xf32>) -> tensor<2x64xf32> {
  %0 = sdy.manual_computation(%q) in_shardings=[<@mesh, [{"dp"}, {"cp"}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}]>] manual_axes={"dp", "cp"} (%x: tensor<1x16xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<1x16xf32>, tensor<f32>) -> tensor<1xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>}> : (tensor<1xf32>) -> tensor<1xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>}> : (tensor<1xf32>) -> tensor<1xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]]> : tensor<8x2xi64>}> : (tensor<1xf32>) -> tensor<1xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<1xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<1xf32>
    %t = stablehlo.add %t2, %p3 : tensor<1xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [0] : (tensor<1xf32>) -> tensor<1x16xf32>
    %y = stablehlo.add %x, %b : tensor<1x16xf32>
    sdy.return %y : tensor<1x16xf32>
  } : (tensor<2x64xf32>) -> tensor<2x64xf32>
  return %0 : tensor<2x64xf32>
}

// RUN: %opt %s -p 'ring-reorder{strategy=striped}' | FileCheck %s
// RUN: %opt %s -p 'ring-reorder{strategy=striped stripe=2}' | FileCheck %s --check-prefix=STRIPE2
// Striped order moves data with one all_to_all per tensor inside the ring groups (here the two rings along "cp"
// of a dp=2 x cp=4 mesh: partition ids [0,1,2,3] and [4,5,6,7]): each device's block, seen as
// (rows, cp, stripe), sends column e to device e. 64 tokens, 16 per device.

sdy.mesh @mesh = <["dp"=2, "cp"=4]>

// CHECK-LABEL: func @ring
// CHECK:      sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"dp"}, {"cp"}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}]>] manual_axes={"dp", "cp"} (%[[X:.*]]: tensor<1x16xf32>) {
// CHECK-NEXT:   %[[S:.*]] = stablehlo.reshape %[[X]] : (tensor<1x16xf32>) -> tensor<1x4x4x1xf32>
// CHECK-NEXT:   %[[T:.*]] = "stablehlo.all_to_all"(%[[S]]) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, concat_dimension = 1 : i64, replica_groups = dense<{{\[}}[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, split_count = 4 : i64, split_dimension = 2 : i64}> : (tensor<1x4x4x1xf32>) -> tensor<1x16x1x1xf32>
// CHECK-NEXT:   %[[Y:.*]] = stablehlo.reshape %[[T]] : (tensor<1x16x1x1xf32>) -> tensor<1x16xf32>
// CHECK-NEXT:   sdy.return %[[Y]]
// CHECK-NEXT: } {shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "striped", stripe = 1 : i64}}
// CHECK:      {shardfix.ring_reorder = "striped{stripe=1}"}
// CHECK:        "stablehlo.all_to_all"({{.*}}concat_dimension = 2 : i64{{.*}}split_dimension = 1 : i64}> : (tensor<1x16x1x1xf32>) -> tensor<1x4x4x1xf32>
// CHECK:      } {shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = true, strategy = "striped", stripe = 1 : i64}}

// STRIPE2: stablehlo.reshape %{{.*}} : (tensor<1x16xf32>) -> tensor<1x2x4x2xf32>
// STRIPE2: {shardfix.ring_reorder = "striped{stripe=2}"}
func.func @ring(%x: tensor<2x64xf32>) -> tensor<2x64xf32> {
  %0 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"dp"}, {"cp"}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}]>] manual_axes={"dp", "cp"} (%a: tensor<1x16xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = stablehlo.while(%i = %c0, %k = %a) : tensor<i32>, tensor<1x16xf32>
    cond {
      %n = stablehlo.constant dense<4> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %p = "stablehlo.collective_permute"(%k) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 3], [1, 0], [2, 1], [3, 2], [4, 7], [5, 4], [6, 5], [7, 6]]> : tensor<8x2xi64>}> : (tensor<1x16xf32>) -> tensor<1x16xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %next = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %next, %p : tensor<i32>, tensor<1x16xf32>
    }
    %s = stablehlo.maximum %a, %r#1 : tensor<1x16xf32>
    sdy.return %s : tensor<1x16xf32>
  } : (tensor<2x64xf32>) -> tensor<2x64xf32>
  return %0 : tensor<2x64xf32>
}

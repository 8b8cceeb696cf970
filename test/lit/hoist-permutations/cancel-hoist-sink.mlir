// RUN: %opt %s -p "ring-reorder{mode=force}" | FileCheck %s --check-prefix=PER-LAYER
// RUN: %opt %s -p "ring-reorder{mode=force},hoist-permutations" | FileCheck %s
// RUN: %opt %s -p "ring-reorder{mode=force},hoist-permutations" > %t.once.mlir
// RUN: %opt %t.once.mlir -p "ring-reorder{mode=force},hoist-permutations" > %t.twice.mlir
// RUN: diff %t.once.mlir %t.twice.mlir
// Two ring regions with token-wise code around them (a projection, tanh, a residual add). ring-reorder alone puts
// a permutation before and an inverse after each region; hoist-permutations cancels the inverse/forward pair
// between the regions, hoists the forward permutation through the projection to the argument (where the residual
// add shares it), and sinks the inverse through the add to the result: one of each for the program.

sdy.mesh @mesh = <["cp"=2]>

// PER-LAYER: inverse = false
// PER-LAYER: inverse = true
// PER-LAYER: inverse = false
// PER-LAYER: inverse = true
// PER-LAYER-NOT: shardfix.sequence_permutation

// CHECK-LABEL: func @two_layers
// CHECK-NEXT:  %[[X:.*]] = sdy.manual_computation(%arg0) {{.*}} (%{{.*}}: tensor<4x4xf32>) {
// CHECK:       } {shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}}
// CHECK-NEXT:  %[[Q:.*]] = stablehlo.dot_general %[[X]], %arg1
// CHECK-NEXT:  %[[R1:.*]] = sdy.manual_computation(%[[Q]])
// CHECK:       %[[H:.*]] = stablehlo.tanh %[[R1]]
// CHECK-NEXT:  %[[R2:.*]] = sdy.manual_computation(%[[H]])
// CHECK:       %[[SUM:.*]] = stablehlo.add %[[R2]], %[[X]]
// CHECK-NEXT:  %[[Y:.*]] = sdy.manual_computation(%[[SUM]])
// CHECK:       } {shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}}
// CHECK-NEXT:  return %[[Y]]
// CHECK-NOT:   shardfix.sequence_permutation
func.func @two_layers(%x: tensor<8x4xf32>, %w: tensor<4x4xf32>) -> tensor<8x4xf32> {
  %q = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  %r1 = sdy.manual_computation(%q) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l1: tensor<4x4xf32>) {
    %p1 = "stablehlo.collective_permute"(%l1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s1 = stablehlo.maximum %l1, %p1 : tensor<4x4xf32>
    sdy.return %s1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %h = stablehlo.tanh %r1 : tensor<8x4xf32>
  %r2 = sdy.manual_computation(%h) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l2: tensor<4x4xf32>) {
    %p2 = "stablehlo.collective_permute"(%l2) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s2 = stablehlo.maximum %l2, %p2 : tensor<4x4xf32>
    sdy.return %s2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %o = stablehlo.add %r2, %x : tensor<8x4xf32>
  return %o : tensor<8x4xf32>
}

// RUN: %opt %s -p hoist-permutations | FileCheck %s
// Two ring regions put in different orders (zigzag, then striped): the token-wise code between them runs in the
// first one's order, so the second one's permutation must read its operand put back in contiguous order, not the
// value as the first order left it.
// (The permutations' bodies are left out: hoist-permutations reads what they are from their attribute.)

sdy.mesh @mesh = <["cp"=2]>

// CHECK-LABEL: func.func @two_orders
func.func @two_orders(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %a = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l: tensor<4x4xf32>) {
    sdy.return %l : tensor<4x4xf32>
  } {shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // CHECK: %[[A:[0-9]+]] = sdy.manual_computation(%arg0)
  // CHECK: %[[R1:[0-9]+]] = sdy.manual_computation(%[[A]])
  %r1 = sdy.manual_computation(%a) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l: tensor<4x4xf32>) {
    %p = "stablehlo.collective_permute"(%l) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s = stablehlo.maximum %l, %p : tensor<4x4xf32>
    sdy.return %s : tensor<4x4xf32>
  } {shardfix.ring_reorder = "zigzag"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %b = sdy.manual_computation(%r1) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l: tensor<4x4xf32>) {
    sdy.return %l : tensor<4x4xf32>
  } {shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // CHECK: %[[T:[0-9]+]] = stablehlo.tanh %[[R1]]
  // CHECK-NEXT: %[[BACK:[0-9]+]] = sdy.manual_computation(%[[T]])
  // CHECK: inverse = true, strategy = "zigzag"
  // CHECK-NEXT: %[[C:[0-9]+]] = sdy.manual_computation(%[[BACK]])
  // CHECK: inverse = false, strategy = "striped", stripe = 2
  // CHECK-NEXT: sdy.manual_computation(%[[C]])
  %t = stablehlo.tanh %b : tensor<8x4xf32>
  %c = sdy.manual_computation(%t) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l: tensor<4x4xf32>) {
    sdy.return %l : tensor<4x4xf32>
  } {shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = false, strategy = "striped", stripe = 2 : i64}} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %r2 = sdy.manual_computation(%c) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l: tensor<4x4xf32>) {
    %p = "stablehlo.collective_permute"(%l) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s = stablehlo.maximum %l, %p : tensor<4x4xf32>
    sdy.return %s : tensor<4x4xf32>
  } {shardfix.ring_reorder = "striped"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %d = sdy.manual_computation(%r2) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l: tensor<4x4xf32>) {
    sdy.return %l : tensor<4x4xf32>
  } {shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = true, strategy = "striped", stripe = 2 : i64}} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %d : tensor<8x4xf32>
}

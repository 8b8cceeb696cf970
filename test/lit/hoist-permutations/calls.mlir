// RUN: %opt %s --split-input-file -p "ring-reorder{mode=force},hoist-permutations" --report 2> %t.report | FileCheck %s
// RUN: FileCheck %s --check-prefix=REPORT < %t.report
// A call of a function that is elementwise as a whole (jax.nn.silu lowers to one; under differentiation with
// residual results) is token-wise like the ops in it: the permutations cross it, and between two rings nothing is
// permuted back. A callee that mixes tokens stops the motion, with a remark naming the call.

sdy.mesh @mesh = <["cp"=2]>

// CHECK-LABEL: func.func @silu_between_rings
// CHECK:      %[[IN:.*]] = sdy.manual_computation(%arg0)
// CHECK:      inverse = false
// CHECK-NEXT: %[[R1:.*]] = sdy.manual_computation(%[[IN]])
// CHECK:      shardfix.ring_reorder = "zigzag"
// CHECK-NEXT: %[[S:.*]]:2 = call @silu(%[[R1]]) : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xf32>)
// CHECK-NEXT: %[[M:.*]] = stablehlo.multiply %[[S]]#0, %[[S]]#1
// CHECK-NEXT: %[[R2:.*]] = sdy.manual_computation(%[[M]])
// CHECK:      shardfix.ring_reorder = "zigzag"
// CHECK-NEXT: %[[OUT:.*]] = sdy.manual_computation(%[[R2]])
// CHECK:      inverse = true
// CHECK-NEXT: return %[[OUT]]
func.func @silu_between_rings(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l1: tensor<4x4xf32>) {
    %p1 = "stablehlo.collective_permute"(%l1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s1 = stablehlo.maximum %l1, %p1 : tensor<4x4xf32>
    sdy.return %s1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %s:2 = call @silu(%r1) : (tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xf32>)
  %m = stablehlo.multiply %s#0, %s#1 : tensor<8x4xf32>
  %r2 = sdy.manual_computation(%m) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l2: tensor<4x4xf32>) {
    %p2 = "stablehlo.collective_permute"(%l2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s2 = stablehlo.maximum %l2, %p2 : tensor<4x4xf32>
    sdy.return %s2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r2 : tensor<8x4xf32>
}
func.func private @silu(%a: tensor<8x4xf32>) -> (tensor<8x4xf32>, tensor<8x4xf32>) {
  %n = stablehlo.negate %a : tensor<8x4xf32>
  %e = stablehlo.exponential %n : tensor<8x4xf32>
  %one = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %ones = stablehlo.broadcast_in_dim %one, dims = [] : (tensor<f32>) -> tensor<8x4xf32>
  %d = stablehlo.add %ones, %e : tensor<8x4xf32>
  %sig = stablehlo.divide %ones, %d : tensor<8x4xf32>
  %y = stablehlo.multiply %a, %sig : tensor<8x4xf32>
  return %y, %sig : tensor<8x4xf32>, tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

// The callee reverses the tokens: both permutations stop at the call.
// CHECK-LABEL: func.func @reversing_callee
// CHECK:      inverse = false
// CHECK-NEXT: %[[R1:.*]] = sdy.manual_computation
// CHECK:      shardfix.ring_reorder = "zigzag"
// CHECK-NEXT: %[[BACK:.*]] = sdy.manual_computation(%[[R1]])
// CHECK:      inverse = true
// CHECK-NEXT: %[[F:.*]] = call @flip(%[[BACK]])
// CHECK-NEXT: %[[FWD:.*]] = sdy.manual_computation(%[[F]])
// CHECK:      inverse = false
// REPORT: remark: {{.*}}calls.mlir:69:8: hoist-permutations: an inverse zigzag permutation stops at 'func.call' to '@flip': it is not known to treat tokens alike
// REPORT: remark: {{.*}}calls.mlir:69:8: hoist-permutations: a zigzag permutation stops at 'func.call' to '@flip': it is not known to treat tokens alike
func.func @reversing_callee(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l1: tensor<4x4xf32>) {
    %p1 = "stablehlo.collective_permute"(%l1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s1 = stablehlo.maximum %l1, %p1 : tensor<4x4xf32>
    sdy.return %s1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %f = call @flip(%r1) : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %r2 = sdy.manual_computation(%f) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l2: tensor<4x4xf32>) {
    %p2 = "stablehlo.collective_permute"(%l2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s2 = stablehlo.maximum %l2, %p2 : tensor<4x4xf32>
    sdy.return %s2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r2 : tensor<8x4xf32>
}
func.func private @flip(%a: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %r = stablehlo.reverse %a, dims = [0] : tensor<8x4xf32>
  %t = stablehlo.tanh %r : tensor<8x4xf32>
  return %t : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

// On Explicit axes JAX pins every value of the callee with a sharding constraint (the scalar constant too): the
// call is still elementwise as a whole.
// CHECK-LABEL: func.func @constrained_callee
// CHECK:      %[[IN:.*]] = sdy.manual_computation(%arg0)
// CHECK:      inverse = false
// CHECK-NEXT: %[[R1:.*]] = sdy.manual_computation(%[[IN]])
// CHECK:      shardfix.ring_reorder = "zigzag"
// CHECK-NEXT: %[[S:.*]] = call @constrained_silu(%[[R1]])
// CHECK-NEXT: %[[R2:.*]] = sdy.manual_computation(%[[S]])
// CHECK:      shardfix.ring_reorder = "zigzag"
// CHECK-NEXT: %[[OUT:.*]] = sdy.manual_computation(%[[R2]])
// CHECK:      inverse = true
// CHECK-NEXT: return %[[OUT]]
func.func @constrained_callee(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l1: tensor<4x4xf32>) {
    %p1 = "stablehlo.collective_permute"(%l1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s1 = stablehlo.maximum %l1, %p1 : tensor<4x4xf32>
    sdy.return %s1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %s = call @constrained_silu(%r1) : (tensor<8x4xf32>) -> tensor<8x4xf32>
  %r2 = sdy.manual_computation(%s) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l2: tensor<4x4xf32>) {
    %p2 = "stablehlo.collective_permute"(%l2) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s2 = stablehlo.maximum %l2, %p2 : tensor<4x4xf32>
    sdy.return %s2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r2 : tensor<8x4xf32>
}
func.func private @constrained_silu(%a: tensor<8x4xf32>) -> tensor<8x4xf32> {
  %n = stablehlo.negate %a : tensor<8x4xf32>
  %nc = sdy.sharding_constraint %n <@mesh, [{"cp"}, {}]> : tensor<8x4xf32>
  %e = stablehlo.exponential %nc : tensor<8x4xf32>
  %one = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %onec = sdy.sharding_constraint %one <@mesh, []> : tensor<f32>
  %ones = stablehlo.broadcast_in_dim %onec, dims = [] : (tensor<f32>) -> tensor<8x4xf32>
  %d = stablehlo.add %ones, %e : tensor<8x4xf32>
  %sig = stablehlo.divide %ones, %d : tensor<8x4xf32>
  %y = stablehlo.multiply %a, %sig : tensor<8x4xf32>
  %yc = sdy.sharding_constraint %y <@mesh, [{"cp"}, {}]> : tensor<8x4xf32>
  return %yc : tensor<8x4xf32>
}

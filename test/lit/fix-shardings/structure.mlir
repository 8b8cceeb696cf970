// RUN: not %opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// RUN: %opt %s --split-input-file -p fix-shardings --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT
// Shardings whose structure the verifier rejects: a single sharding where an op needs one per result and the
// reverse, per-value lists too long or too short, shardings on values that can't have one, a single-device
// sharding with dims, and an op without results with more than its one device sharding.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: structure.mlir:[[# @LINE + 5]]:8: error: 'stablehlo.add' op should have a sharding attribute of type TensorShardingPerValueAttr
// REPORT: structure.mlir:[[# @LINE + 4]]:8: wrong-kind: sdy.sharding must list one sharding per value; the single sharding is now a list
// CHECK-LABEL: func @plain_on_op
// CHECK: stablehlo.add %arg0, %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"a"}, {}]>]>}
func.func @plain_on_op(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = stablehlo.add %arg0, %arg0 {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>} : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'func.func' op arg 0 - should have a sharding attribute of type TensorShardingAttr
// REPORT: wrong-kind: a function's argument or result takes one sharding, not a list; its only entry kept
// CHECK-LABEL: func @list_on_argument
// CHECK-SAME: (%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>})
func.func @list_on_argument(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"a"}, {}]>]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'stablehlo.reduce' op result shardings don't match number of values: 3 shardings vs 2 values
// REPORT: value-count: 3 shardings for 2 values; the surplus dropped
// REPORT: value-count: 0 shardings for 1 value; the missing ones left open
// CHECK-LABEL: func @counts
// CHECK: stablehlo.reduce({{.*}}) across dimensions = [1] {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"a"}]>, <@mesh, [{"b"}]>]>}
// CHECK: stablehlo.add %0#0, %0#1 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{?}]>]>}
func.func @counts(%arg0: tensor<8x8xf32>, %arg1: tensor<f32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %0:2 = stablehlo.reduce(%arg0 init: %arg1), (%arg0 init: %arg1) across dimensions = [1] {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"a"}]>, <@mesh, [{"b"}]>, <@mesh, [{}]>]>} :
    (tensor<8x8xf32>, tensor<8x8xf32>, tensor<f32>, tensor<f32>) -> (tensor<8xf32>, tensor<8xf32>)
    reducer(%a: tensor<f32>, %c: tensor<f32>) (%b: tensor<f32>, %d: tensor<f32>) {
      %s = stablehlo.add %a, %c : tensor<f32>
      %t = stablehlo.add %b, %d : tensor<f32>
      stablehlo.return %s, %t : tensor<f32>, tensor<f32>
    }
  %1 = stablehlo.add %0#0, %0#1 {sdy.sharding = #sdy.sharding_per_value<[]>} : tensor<8xf32>
  return %1, %0#1 : tensor<8xf32>, tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'func.func' op arg 0 - only ranked tensors can have a sharding. type: 'tensor<*xf32>'
// REPORT: unshardable: sdy.sharding on a value that can't carry one (an unranked tensor or a tuple of other than one value); removed
// REPORT: unshardable: sdy.sharding on a result that can't carry a sharding (an unranked tensor or a tuple of other than one value); removed
// CHECK-LABEL: func @unshardable
// CHECK-SAME: (%arg0: tensor<*xf32>, %arg1: tensor<8x8xf32>)
// CHECK: stablehlo.custom_call @pair(%arg1) : (tensor<8x8xf32>) -> tuple<tensor<8x8xf32>, tensor<8x8xf32>>
func.func @unshardable(%arg0: tensor<*xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}]>}, %arg1: tensor<8x8xf32>) -> tensor<*xf32> {
  %0 = stablehlo.custom_call @pair(%arg1) {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"a"}, {}]>]>} : (tensor<8x8xf32>) -> tuple<tensor<8x8xf32>, tensor<8x8xf32>>
  return %arg0 : tensor<*xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4]>
sdy.mesh @single = <[], device_ids=[3]>

// VERIFIER: error: 'func.func' op arg 0 - a {{(single-device|maximal)}} sharding can only have a sharding with rank 0
// REPORT: value-count: an op without results takes at most one sharding, of rank 0; 2 given, the first kept
// REPORT: rank-mismatch: a single-device sharding has no dims, replicated or unreduced axes; dropped
// CHECK-LABEL: func @single_device
// CHECK-SAME: (%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@single, []>})
// CHECK: stablehlo.custom_call @side_effect(%arg0) {has_side_effect = true, sdy.sharding = #sdy.sharding_per_value<[<@single, []>]>}
func.func @single_device(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@single, [{}, {}]>}) -> tensor<8x8xf32> {
  stablehlo.custom_call @side_effect(%arg0) {has_side_effect = true, sdy.sharding = #sdy.sharding_per_value<[<@single, []>, <@single, []>]>} : (tensor<8x8xf32>) -> ()
  return %arg0 : tensor<8x8xf32>
}

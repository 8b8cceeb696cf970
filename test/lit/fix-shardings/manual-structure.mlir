// RUN: not %opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// RUN: %opt %s --split-input-file -p fix-shardings --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT
// Manual and named computations the verifier rejects, written on one line or over several: unknown and repeated
// manual axes, in/out shardings missing or in surplus, shardings with dims on tokens, manual axes an enclosing
// manual computation has bound already, a manual axis after a free one. Each comes out verifying, its body's
// local shapes unchanged.

sdy.mesh @mesh = <["a"=2, "b"=2]>

// VERIFIER: error: 'sdy.manual_computation' op unknown manual axis: "z"
// REPORT: unknown-axis: manual axis "z" is not in the mesh <["a"=2, "b"=2]>; dropped
// REPORT: duplicate-axis: manual axes listed twice are kept once
// CHECK-LABEL: func @unknown_manual_axis
// CHECK: in_shardings=[<@mesh, [{"a"}, {}]>] out_shardings=[<@mesh, [{"a"}, {}]>] manual_axes={"a"} (%arg1: tensor<8x32xf32>)
func.func @unknown_manual_axis(%arg0: tensor<16x32xf32>) -> tensor<16x32xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"a"}, {}]>] out_shardings=[<@mesh, [{"a"}, {}]>] manual_axes={"a", "z", "a"} (%arg1: tensor<8x32xf32>) {
    sdy.return %arg1 : tensor<8x32xf32>
  } : (tensor<16x32xf32>) -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=2]>

// VERIFIER: error: 'sdy.manual_computation' op operand shardings don't match number of values: 1 shardings vs 2 values
// REPORT: value-count: operand 1 had no sharding; it gets the manual axes its body's shape needs
// REPORT: manual-shape: manual axes per dim now [{"a"}, {}], which split [16, 32] into the body's [8, 32]
// REPORT: value-count: 2 shardings for 1 result; the surplus dropped
// CHECK-LABEL: func @missing_and_surplus
// CHECK: in_shardings=[<@mesh, [{"a"}, {}]>, <@mesh, [{"a"}, {}]>] out_shardings=[<@mesh, [{"a"}, {}]>] manual_axes={"a"}
func.func @missing_and_surplus(%arg0: tensor<16x32xf32>, %arg1: tensor<16x32xf32>) -> tensor<16x32xf32> {
  %0 = sdy.manual_computation(%arg0, %arg1)
      in_shardings=[<@mesh, [{"a"}, {}]>]
      out_shardings=[<@mesh, [{"a"}, {}]>, <@mesh, [{}, {}]>]
      manual_axes={"a"} (%arg2: tensor<8x32xf32>, %arg3: tensor<8x32xf32>) {
    %1 = stablehlo.add %arg2, %arg3 : tensor<8x32xf32>
    sdy.return %1 : tensor<8x32xf32>
  } : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=2]>

// VERIFIER: error: 'sdy.manual_computation' op operand - non-shaped tensors can only have a sharding with rank 0
// REPORT: rank-mismatch: a non-shaped value takes a rank-0 sharding; 1 dims dropped
// CHECK-LABEL: func @token
// CHECK: in_shardings=[<@mesh, []>] out_shardings=[<@mesh, []>] manual_axes={"a"} (%arg1: !stablehlo.token)
func.func @token(%arg0: !stablehlo.token) -> !stablehlo.token {
  %0 = sdy.manual_computation(%arg0)
      in_shardings=[<@mesh, [{"a"}]>]
      out_shardings=[<@mesh, [{"a"}]>]
      manual_axes={"a"} (%arg1: !stablehlo.token) {
    sdy.return %arg1 : !stablehlo.token
  } : (!stablehlo.token) -> !stablehlo.token
  return %0 : !stablehlo.token
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=2]>

// VERIFIER: error: 'sdy.manual_computation' op operates on axis "a" which is already bound by a parent sdy.manual_computation op
// REPORT: bound-manual-axis: dim 1: axis "a" is already manual in an enclosing manual computation; dropped
// REPORT: bound-manual-axis: manual axis "a" is manual in an enclosing manual computation already; dropped
// CHECK-LABEL: func @bound_by_parent
// CHECK: manual_axes={"a"} (%arg1: tensor<8x32xf32>)
// CHECK: in_shardings=[<@mesh, [{"b"}, {}]>] out_shardings=[<@mesh, [{"b"}, {}]>] manual_axes={"b"} (%arg2: tensor<4x32xf32>)
// CHECK: sdy.sharding_constraint %arg2 <@mesh, [{}, {}]>
func.func @bound_by_parent(%arg0: tensor<16x32xf32>) -> tensor<16x32xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"a"}, {}]>] out_shardings=[<@mesh, [{"a"}, {}]>] manual_axes={"a"} (%arg1: tensor<8x32xf32>) {
    %1 = sdy.manual_computation(%arg1) in_shardings=[<@mesh, [{"b"}, {}]>] out_shardings=[<@mesh, [{"b"}, {"a"}]>] manual_axes={"a", "b"} (%arg2: tensor<4x32xf32>) {
      %2 = sdy.sharding_constraint %arg2 <@mesh, [{"a"}, {}]> : tensor<4x32xf32>
      sdy.return %2 : tensor<4x32xf32>
    } : (tensor<8x32xf32>) -> tensor<8x32xf32>
    sdy.return %1 : tensor<8x32xf32>
  } : (tensor<16x32xf32>) -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=2]>

// VERIFIER: error: 'sdy.manual_computation' op operand sharding at index 0 must have all manual axes come before free axes
// REPORT: manual-order: manual axes moved before the free axes in dim(s) 1, so each body gets a contiguous block
// CHECK-LABEL: func @manual_axis_after_free_axis
// CHECK: in_shardings=[<@mesh, [{}, {"b", "a"}]>] out_shardings=[<@mesh, [{}, {"b"}]>] manual_axes={"b"}
func.func @manual_axis_after_free_axis(%arg0: tensor<16x32xf32>) -> tensor<16x32xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{}, {"a", "b"}]>] out_shardings=[<@mesh, [{}, {"b"}]>] manual_axes={"b"} (%arg1: tensor<16x16xf32>) {
    sdy.return %arg1 : tensor<16x16xf32>
  } : (tensor<16x32xf32>) -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=2]>

// VERIFIER: error: 'sdy.named_computation' op in_shardings shardings don't match number of values: 2 shardings vs 1 values
// REPORT: value-count: 2 shardings for 1 value; the surplus dropped
// REPORT: value-count: 0 shardings for 1 value; the missing ones left open
// CHECK-LABEL: func @named
// CHECK: sdy.named_computation<"block">(%arg0) in_shardings=[<@mesh, [{"a"}, {}]>] out_shardings=[<@mesh, [{?}, {?}]>]
func.func @named(%arg0: tensor<8x2xf32>) -> tensor<8x2xf32> {
  %0 = sdy.named_computation<"block">(%arg0) in_shardings=[<@mesh, [{"a"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[] (%arg1: tensor<8x2xf32>) {
    sdy.return %arg1 : tensor<8x2xf32>
  } : (tensor<8x2xf32>) -> tensor<8x2xf32>
  return %0 : tensor<8x2xf32>
}

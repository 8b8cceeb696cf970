// RUN: %opt %s -p fix-shardings --report=text 2>&1 | FileCheck %s
// sdy ops written in MLIR's generic form (as --mlir-print-op-generic prints them, shardings as properties) are
// loaded and repaired like those in the custom syntax: while the module is parsed, a required sharding is held
// aside behind one the verifier takes on anything, an optional one is left out, a manual computation's are
// replaced by ones that fit its body; then each is put back and fixed.

// CHECK: 6 sharding fix(es):
// CHECK-DAG: generic-form.mlir:26:8 result 0 of 'sdy.manual_computation' duplicate-axis <@mesh, [{"a"}, {"b", "b"}]> <@mesh, [{"a"}, {"b"}]>
// CHECK-DAG: generic-form.mlir:26:8 manual axes of 'sdy.manual_computation' unknown-axis {"a", "b", "z"} {"a", "b"}
// CHECK-DAG: generic-form.mlir:34:8 'sdy.sharding_constraint' sharding rank-mismatch <@mesh, [{"a"}, {"b"}, {}]> <@mesh, [{"a"}, {"b"}]>
// CHECK-DAG: generic-form.mlir:35:8 'sdy.reshard' sharding duplicate-axis <@mesh, [{"a", "a"}, {}]> <@mesh, [{"a"}, {}]>
// CHECK-DAG: generic-form.mlir:36:8 operand 0 of 'sdy.named_computation' unknown-axis <@mesh, [{"a"}, {"c"}]> <@mesh, [{"a"}, {}]>
// CHECK-DAG: generic-form.mlir:40:8 'sdy.data_flow_edge' sharding unknown-axis <@mesh, [{"zz"}, {}]> <@mesh, [{}, {}]>

// CHECK-LABEL: func.func @generic
// CHECK: sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"a"}, {"b"}]>] out_shardings=[<@mesh, [{"a"}, {"b"}]>] manual_axes={"a", "b"} (%arg1: tensor<4x4xf32>) {
// CHECK: } {foo = 1 : i64} : (tensor<8x16xf32>) -> tensor<8x16xf32>
// CHECK: sdy.sharding_constraint %0 <@mesh, [{"a"}, {"b"}]> {bar} : tensor<8x16xf32>
// CHECK: sdy.reshard %1 <@mesh, [{"a"}, {}]> : tensor<8x16xf32>
// CHECK: sdy.named_computation<"foo">(%2) in_shardings=[<@mesh, [{"a"}, {}]>] out_shardings=[<@mesh, [{"a"}, {}]>] (%arg1: tensor<8x16xf32>) {
// CHECK: sdy.data_flow_edge %3 sharding=<@mesh, [{}, {}]> : tensor<8x16xf32>

sdy.mesh @mesh = <["a"=2, "b"=4]>

func.func @generic(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = "sdy.manual_computation"(%arg0) <{
      in_shardings = #sdy.sharding_per_value<[<@mesh, [{"a"}, {"b"}]>]>,
      manual_axes = #sdy<manual_axes{"a", "b", "z"}>,
      out_shardings = #sdy.sharding_per_value<[<@mesh, [{"a"}, {"b", "b"}]>]>}> ({
  ^bb0(%arg1: tensor<4x4xf32>):
    %5 = "stablehlo.add"(%arg1, %arg1) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    "sdy.return"(%5) : (tensor<4x4xf32>) -> ()
  }) {foo = 1 : i64} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %1 = "sdy.sharding_constraint"(%0) <{sharding = #sdy.sharding<@mesh, [{"a"}, {"b"}, {}]>}> {bar} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %2 = "sdy.reshard"(%1) <{sharding = #sdy.sharding<@mesh, [{"a", "a"}, {}]>}> : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %3 = "sdy.named_computation"(%2) <{in_shardings = #sdy.sharding_per_value<[<@mesh, [{"a"}, {"c"}]>]>, name = "foo", out_shardings = #sdy.sharding_per_value<[<@mesh, [{"a"}, {}]>]>}> ({
  ^bb0(%arg1: tensor<8x16xf32>):
    "sdy.return"(%arg1) : (tensor<8x16xf32>) -> ()
  }) : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %4 = "sdy.data_flow_edge"(%3) <{sharding = #sdy.sharding<@mesh, [{"zz"}, {}]>}> : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %4 : tensor<8x16xf32>
}

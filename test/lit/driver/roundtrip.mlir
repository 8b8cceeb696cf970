// RUN: %opt %s | FileCheck %s
// RUN: %opt %s | %opt - | FileCheck %s
// No pipeline: parse, verify and print; printing twice gives the same text.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// CHECK-LABEL: func @f
// CHECK-SAME: (%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "b":(1)2}, {?}p1]>})
func.func @f(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "b":(1)2}, {?}p1]>}) -> tensor<8x8xf32> {
  // CHECK: sdy.sharding_constraint %arg0 <@mesh, [{}, {"b"}], replicated={"a"}>
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{}, {"b"}], replicated={"a"}> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

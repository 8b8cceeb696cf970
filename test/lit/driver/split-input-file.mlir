// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// Each chunk is processed on its own; the outputs are joined with the same marker.

sdy.mesh @mesh = <["a"=2]>
// CHECK-LABEL: func @first
// CHECK-SAME: #sdy.sharding<@mesh, [{}]>
func.func @first(%arg0: tensor<3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}]>}) -> tensor<3xf32> {
  return %arg0 : tensor<3xf32>
}

// -----
// CHECK: // -----

sdy.mesh @mesh = <["x"=4]>
// CHECK-LABEL: func @second
// CHECK-SAME: #sdy.sharding<@mesh, [{"x"}]>
func.func @second(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}

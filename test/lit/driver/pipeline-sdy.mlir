// RUN: %opt %s -p sdy-propagation-pipeline | FileCheck %s
// Shardy's C++ propagation runs through the driver: the argument's sharding reaches the result.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// CHECK-LABEL: func @f
// CHECK-SAME: -> (tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>})
func.func @f(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>}) -> tensor<8x8xf32> {
  %0 = stablehlo.tanh %arg0 : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

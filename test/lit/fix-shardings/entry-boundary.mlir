// RUN: %opt %s -p 'fix-shardings{policy=subaxis}' | FileCheck %s
// RUN: %opt %s -p fix-shardings | FileCheck %s --check-prefix=AUTO
// JAX's calling convention can't express sub-axes: a public function's arguments and results keep the longest
// full-axis prefix that divides, while a private function's get the sub-axis. Size-1 axes are kept.
// JAX rejects indivisible shardings at the entry function's boundary, so the auto policy always repairs there;
// inside (the private function) padding 12 rows over 8 devices costs each 2 rows against 3 for the best even
// split, so the padded split stays.

sdy.mesh @mesh = <["a"=2, "b"=4, "one"=1]>

// CHECK-LABEL: func @main
// CHECK-SAME: (%arg0: tensor<12x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>}
// CHECK-SAME: %arg1: tensor<7x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"one"}, {"b"}]>})
// CHECK-SAME: -> (tensor<6x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"a"}]>})
func.func @main(%arg0: tensor<12x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "b"}, {}]>}, %arg1: tensor<7x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"one"}, {"b"}]>}) -> (tensor<6x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"b"}, {"a"}]>}) {
  %0 = call @helper(%arg0) : (tensor<12x8xf32>) -> tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// AUTO-LABEL: func @main
// AUTO-SAME: (%arg0: tensor<12x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>}
// AUTO-SAME: -> (tensor<6x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"a"}]>})
// AUTO-LABEL: func private @helper
// AUTO-SAME: (%arg0: tensor<12x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "b"}, {}]>})
// AUTO-SAME: -> (tensor<6x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"b"}, {}]>})
// CHECK-LABEL: func private @helper
// CHECK-SAME: (%arg0: tensor<12x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "b":(1)2}, {}]>})
// CHECK-SAME: -> (tensor<6x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"b":(1)2}, {}]>})
func.func private @helper(%arg0: tensor<12x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "b"}, {}]>}) -> (tensor<6x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"b"}, {}]>}) {
  %0 = stablehlo.slice %arg0 [0:6, 0:8] : (tensor<12x8xf32>) -> tensor<6x8xf32>
  return %0 : tensor<6x8xf32>
}

// RUN: not %opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// Overlapping uses of one axis keep the first: two overlapping sub-axes, or a sub-axis and the full axis. At a
// public function's boundary (JAX expresses no sub-axis there) the later use is dropped.

sdy.mesh @mesh = <["a"=2, "b"=8]>

// VERIFIER: error: 'func.func' op arg 0 - overlapping sub-axes
// CHECK-LABEL: func @overlapping_sub_axes
// CHECK-SAME: #sdy.sharding<@mesh, [{"b":(1)4}, {}]>
func.func @overlapping_sub_axes(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"b":(1)4}, {"b":(2)4}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=8]>

// VERIFIER: error: 'func.func' op arg 0 - both sub-axis and full-axis are used for axis name: "b"
// CHECK-LABEL: func @sub_and_full
// CHECK-SAME: #sdy.sharding<@mesh, [{"b":(1)2}, {"a"}]>
func.func @sub_and_full(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"b":(1)2}, {"b", "a"}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=8]>

// Inside a function, where sub-axes are fine, the later use keeps the largest part of its axis still free.
// VERIFIER: error: 'sdy.sharding_constraint' op overlapping sub-axes
// CHECK-LABEL: func @overlapping_inside
// CHECK: sdy.sharding_constraint %arg0 <@mesh, [{"b":(1)4}, {"b":(4)2}]>
// CHECK: sdy.sharding_constraint %{{.*}} <@mesh, [{"b":(1)2}, {"b":(2)4}]>
func.func @overlapping_inside(%arg0: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"b":(1)4}, {"b":(2)4}]> : tensor<8x8xf32>
  %1 = sdy.sharding_constraint %0 <@mesh, [{"b":(1)2}, {"b"}]> : tensor<8x8xf32>
  return %1 : tensor<8x8xf32>
}

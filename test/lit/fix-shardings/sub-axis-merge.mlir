// RUN: not %opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// Consecutive sub-axes that are adjacent parts of one axis are merged (into the axis when they cover it).

sdy.mesh @mesh = <["a"=2, "b"=8]>

// VERIFIER: error: 'func.func' op arg 0 - two consecutive sub-axes can be merged: "b":(1)2, "b":(2)4
// CHECK-LABEL: func @merge_to_full
// CHECK-SAME: #sdy.sharding<@mesh, [{"b"}, {}]>
func.func @merge_to_full(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"b":(1)2, "b":(2)4}, {}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=8]>

// VERIFIER: error: 'func.func' op arg 0 - two consecutive sub-axes can be merged: "b":(1)2, "b":(2)2
// CHECK-LABEL: func @merge_to_sub
// CHECK-SAME: #sdy.sharding<@mesh, [{"a", "b":(1)4}, {}]>
func.func @merge_to_sub(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "b":(1)2, "b":(2)2}, {}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// RUN: not %opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// A sub-axis of size 1, or one whose pre-size is out of range, is no part of its axis: dropped.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'func.func' op arg 0 - sub-axis sizes must be greater than 1
// CHECK-LABEL: func @size_one
// CHECK-SAME: #sdy.sharding<@mesh, [{}, {"b"}]>
func.func @size_one(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a":(2)1}, {"b"}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'func.func' op arg 0 - sub-axis next pre-size 6 doesn't divide the size of the full axis 4
// CHECK-LABEL: func @bad_pre_size
// CHECK-SAME: #sdy.sharding<@mesh, [{"a"}, {}]>
func.func @bad_pre_size(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "b":(3)2}, {}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

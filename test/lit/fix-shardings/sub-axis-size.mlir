// RUN: not %opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// A sub-axis of size 1 is no part of its axis: dropped. One whose pre-size is out of range or doesn't fit the
// axis keeps the largest part of it that does: "b":(3)2 and "b":(-1)2 become "b":(1)2 on b=4.

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
// CHECK-SAME: #sdy.sharding<@mesh, [{"a", "b":(1)2}, {}]>
func.func @bad_pre_size(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "b":(3)2}, {}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'func.func' op arg 0 - sub-axis pre-size must be at least 1
// CHECK-LABEL: func @negative_pre_size
// CHECK-SAME: #sdy.sharding<@mesh, [{}, {"b":(1)2}]>
func.func @negative_pre_size(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"b":(-1)2}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=8]>

// A part that would overlap the part used already moves beside it.
// VERIFIER: error: 'func.func' op arg 0 - sub-axis next pre-size 12 doesn't divide the size of the full axis 8
// CHECK-LABEL: func @beside_another_part
// CHECK-SAME: #sdy.sharding<@mesh, [{"a":(1)2}, {"a":(2)4}]>
func.func @beside_another_part(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a":(1)2}, {"a":(3)4}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

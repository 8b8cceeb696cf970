// RUN: not %opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// Extra dims are dropped; missing dims are added empty (closed).

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'func.func' op arg 0 - sharding doesn't match tensor rank: 3 != 2
// CHECK-LABEL: func @too_many
// CHECK-SAME: #sdy.sharding<@mesh, [{"a"}, {}]>
func.func @too_many(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}, {"b"}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'sdy.reshard' op sharding doesn't match tensor rank: 1 != 3
// CHECK-LABEL: func @too_few
// CHECK: sdy.reshard %arg0 <@mesh, [{"b"}, {}, {}]>
func.func @too_few(%arg0: tensor<8x8x8xf32>) -> tensor<8x8x8xf32> {
  %0 = sdy.reshard %arg0 <@mesh, [{"b"}]> : tensor<8x8x8xf32>
  return %0 : tensor<8x8x8xf32>
}

// RUN: not %opt %s 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s -p fix-shardings | FileCheck %s

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'func.func' op arg 0 - unknown axis name: "c"
// CHECK-LABEL: func @unknown_axis
// CHECK-SAME: (%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>})
func.func @unknown_axis(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"c", "a"}, {"c"}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

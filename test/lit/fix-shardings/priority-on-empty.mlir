// RUN: not %opt %s 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s -p fix-shardings | FileCheck %s
// A priority on an empty closed dim means nothing: dropped. Open dims and non-empty dims keep theirs.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'func.func' op arg 0 - dim 0 is empty and closed but has a priority
// CHECK-LABEL: func @priority
// CHECK-SAME: #sdy.sharding<@mesh, [{}, {?}p0, {"a"}p2]>
func.func @priority(%arg0: tensor<8x8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}p1, {?}p0, {"a"}p2]>}) -> tensor<8x8x8xf32> {
  return %arg0 : tensor<8x8x8xf32>
}

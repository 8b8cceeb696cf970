// RUN: %opt %s -p 'fix-shardings,sdy-propagation-pipeline' | FileCheck %s
// RUN: %opt %s -p 'fix-shardings{policy=prefix},func.func(cse),canonicalize' | FileCheck %s --check-prefix=NESTED
// RUN: not %opt %s -p 'func.func(cse),fix-shardings' 2>&1 | FileCheck %s --check-prefix=STRICT
// Our Python pass and Shardy's C++ passes in one pipeline: fix-shardings first repairs the unknown axis "c"
// (which the sdy verifier rejects), then propagation spreads the repaired sharding. Only a pipeline that starts
// with fix-shardings loads a module the verifier rejects; any other reports the verifier's error.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// CHECK-LABEL: func @f
// CHECK-SAME: {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>}
// CHECK-SAME: -> (tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>})
func.func @f(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", "c"}, {}]>}) -> tensor<8x8xf32> {
  %0 = stablehlo.tanh %arg0 : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}

// NESTED: module
// NESTED: sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>

// STRICT: pipeline-mixed.mlir:[[# @LINE - 8]]:1: error: 'func.func' op arg 0 - unknown axis name: "c"

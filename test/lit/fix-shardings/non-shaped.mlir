// RUN: not %opt %s 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s -p fix-shardings | FileCheck %s
// A token is not a tensor: its sharding has rank 0 and no replicated axes.

sdy.mesh @mesh = <["a"=2]>

// VERIFIER: error: 'func.func' op arg 0 - non-shaped tensors can only have a sharding with rank 0 and no replicated or unreduced axes
// CHECK-LABEL: func @token
// CHECK-SAME: (%arg0: !stablehlo.token {sdy.sharding = #sdy.sharding<@mesh, []>})
func.func @token(%arg0: !stablehlo.token {sdy.sharding = #sdy.sharding<@mesh, [{"a"}], replicated={"a"}>}) -> !stablehlo.token {
  return %arg0 : !stablehlo.token
}

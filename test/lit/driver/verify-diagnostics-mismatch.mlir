// RUN: not %opt %s --verify-diagnostics -p fix-shardings 2>&1 | FileCheck %s
// A missing or an unexpected diagnostic fails the run, naming both sides.

sdy.mesh @mesh = <["a"=2]>

func.func @f(%arg0: tensor<3xf32>) -> tensor<3xf32> {
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 3]]:8: error: unexpected remark: fix-shardings: 'sdy.sharding_constraint' sharding
  // CHECK: verify-diagnostics-mismatch.mlir:[[# @LINE + 1]]:3: error: expected remark "this is never said" was not produced
  // expected-remark {{this is never said}}
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"a"}]> : tensor<3xf32>
  return %0 : tensor<3xf32>
}

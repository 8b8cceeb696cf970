// RUN: not %opt %s 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: not %opt %s -p fix-shardings 2>&1 | FileCheck %s --check-prefix=ERROR
// With several meshes none can stand in for an unknown one: a located error, and no output.

sdy.mesh @mesh = <["a"=2]>
sdy.mesh @mesh2 = <["b"=2]>

// VERIFIER: error: 'sdy.sharding_constraint' op unknown mesh: @other_mesh
// ERROR: unknown-mesh-ambiguous.mlir:[[# @LINE + 2]]:8: error: fix-shardings can't repair this: 'sdy.sharding_constraint' sharding: the sharding refers to @other_mesh, which the module doesn't define (its meshes: @mesh, @mesh2); a repair would need one mesh in the module, or the sharding written for one of its meshes
func.func @two_meshes(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.sharding_constraint %arg0 <@other_mesh, [{"a"}]> : tensor<8xf32>
  return %0 : tensor<8xf32>
}

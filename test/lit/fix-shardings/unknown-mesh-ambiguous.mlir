// RUN: not %opt %s --split-input-file 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: not %opt %s --split-input-file -p fix-shardings 2>&1 | FileCheck %s --check-prefix=ERROR
// RUN: not %opt %s --split-input-file -p fix-shardings 2>/dev/null | FileCheck %s
// With several meshes, an unknown one is replaced by the only mesh that has the axes its sharding names; when
// more than one has them, none can stand in for it: a located error, and the other chunks still print.

sdy.mesh @mesh = <["a"=2]>
sdy.mesh @mesh2 = <["b"=2]>

// VERIFIER: error: 'sdy.sharding_constraint' op unknown mesh: @other_mesh
// CHECK-LABEL: func @one_mesh_has_the_axis
// CHECK: sdy.sharding_constraint %arg0 <@mesh, [{"a"}]>
func.func @one_mesh_has_the_axis(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.sharding_constraint %arg0 <@other_mesh, [{"a"}]> : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

sdy.mesh @mesh = <["a"=2]>
sdy.mesh @mesh2 = <["a"=4]>

// ERROR: unknown-mesh-ambiguous.mlir:[[# @LINE + 2]]:8: error: fix-shardings can't repair this: 'sdy.sharding_constraint' sharding: the sharding refers to @other_mesh, which the module doesn't define (its meshes: @mesh, @mesh2); a repair would need one mesh in the module, or one mesh with the axes the sharding names
func.func @two_meshes_have_the_axis(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.sharding_constraint %arg0 <@other_mesh, [{"a"}]> : tensor<8xf32>
  return %0 : tensor<8xf32>
}

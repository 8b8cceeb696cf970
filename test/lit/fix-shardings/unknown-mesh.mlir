// RUN: not %opt %s 2>&1 | FileCheck %s --check-prefix=VERIFIER
// RUN: %opt %s -p fix-shardings | FileCheck %s
// An unknown mesh becomes the module's only mesh (see unknown-mesh-ambiguous.mlir for several meshes).

sdy.mesh @mesh = <["a"=2, "b"=4]>

// VERIFIER: error: 'func.func' op arg 0 - unknown mesh: @other_mesh
// CHECK-LABEL: func @one_mesh
// CHECK-SAME: #sdy.sharding<@mesh, [{"a"}, {}]>
func.func @one_mesh(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@other_mesh, [{"a"}, {}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

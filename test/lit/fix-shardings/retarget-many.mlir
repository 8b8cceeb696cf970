// RUN: not %opt %s --split-input-file -p fix-shardings --target-mesh 'dp=4,tp=2' 2>/dev/null | FileCheck %s --check-prefix=MANY
// RUN: not %opt %s --split-input-file -p fix-shardings --target-mesh 'dp=4,tp=2' --report=json 2>&1 >/dev/null | FileCheck %s --check-prefix=MANY-REPORT
// RUN: not %opt %s --split-input-file -p fix-shardings --target-mesh 'dp=4,tp=2' 2>&1 >/dev/null | FileCheck %s --check-prefix=DIFFERENT
// The third chunk fails (two different meshes), so every run exits 1; --split-input-file still prints the others.

// JAX names its one mesh once per shard_map (@mesh, @mesh_0, ...): every name is retargeted, and so is a copy of
// the mesh written inline in a sharding. Meshes that differ are refused (there is no one mesh to replace).
// MANY-LABEL: module attributes {mhlo.num_partitions = 8 : i32
// MANY: sdy.mesh @mesh = <["dp"=4, "tp"=2]> {mhlo.mesh = {axes = [{name = "dp", size = 4 : i64}, {name = "tp", size = 2 : i64}]}}
// MANY: sdy.mesh @mesh_0 = <["dp"=4, "tp"=2]>
// MANY-LABEL: func @two_names
// MANY-SAME: (%arg0: tensor<8x6xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"tp"}]>})
// MANY: sdy.sharding_constraint %arg0 <@mesh_0, [{"dp"}, {}]>
// MANY: sdy.sharding_constraint %{{.*}} <mesh<["dp"=4, "tp"=2]>, [{"dp"}, {"tp"}]>
// MANY-REPORT: "details": ["mesh @mesh_0 <[\"dp\"=2, \"tp\"=4]> replaced by <[\"dp\"=4, \"tp\"=2]>"]
// MANY-REPORT: "details": ["inline mesh <[\"dp\"=2, \"tp\"=4]> replaced by <[\"dp\"=4, \"tp\"=2]>"]
// MANY-REPORT-SAME: "reason": "retarget"
module attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["dp"=2, "tp"=4]> {mhlo.mesh = {axes = [{name = "dp", size = 2 : i64}, {name = "tp", size = 4 : i64}]}}
  sdy.mesh @mesh_0 = <["dp"=2, "tp"=4]>
  func.func @two_names(%arg0: tensor<8x6xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"tp"}]>}) -> tensor<8x6xf32> {
    %0 = sdy.sharding_constraint %arg0 <@mesh_0, [{"dp"}, {}]> : tensor<8x6xf32>
    %1 = sdy.sharding_constraint %0 <mesh<["dp"=2, "tp"=4]>, [{"dp"}, {"tp"}]> : tensor<8x6xf32>
    return %1 : tensor<8x6xf32>
  }
}

// -----

// DIFFERENT: error: fix-shardings: --target-mesh needs a module with one mesh (under any number of names); found @a = <["x"=2]>, @b = <["x"=4]>
sdy.mesh @a = <["x"=2]>
sdy.mesh @b = <["x"=4]>
func.func @different(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@a, [{"x"}]>}) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}

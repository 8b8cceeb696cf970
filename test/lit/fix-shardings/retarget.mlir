// RUN: %opt %s -p 'fix-shardings{policy=subaxis}' --target-mesh 'dp=4,tp=2' | FileCheck %s
// RUN: %opt %s -p 'fix-shardings{policy=subaxis target-mesh=dp=4,tp=2}' | FileCheck %s
// RUN: %opt %s -p fix-shardings --target-mesh 'dp=4,tp=2' --report=json 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT
// The module's mesh is replaced (and JAX's StableHLO copy of it), axes the new mesh lacks are dropped, sizes
// re-checked, num_partitions updated.

// CHECK: module attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32}
// CHECK: sdy.mesh @mesh = <["dp"=4, "tp"=2]> {stablehlo.mesh = {axes = [{name = "dp", size = 4 : i64}, {name = "tp", size = 2 : i64}]}}
// CHECK-LABEL: func @main
// CHECK-SAME: (%arg0: tensor<8x6xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {}]>})
// CHECK: sdy.sharding_constraint %{{.*}} <@mesh, [{"dp":(1)2}, {}]>
// REPORT: "reason": "retarget"
// REPORT: "reason": "unknown-axis"
module attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["dp"=2, "sp"=1]> {stablehlo.mesh = {axes = [{name = "dp", size = 2 : i64}, {name = "sp", size = 1 : i64}]}}
  func.func @main(%arg0: tensor<8x6xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"sp"}]>}) -> tensor<8x6xf32> {
    %0 = stablehlo.slice %arg0 [0:6, 0:6] : (tensor<8x6xf32>) -> tensor<6x6xf32>
    %1 = sdy.sharding_constraint %0 <@mesh, [{"dp"}, {}]> : tensor<6x6xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %2 = stablehlo.pad %1, %cst, low = [0, 0], high = [2, 0], interior = [0, 0] : (tensor<6x6xf32>, tensor<f32>) -> tensor<8x6xf32>
    return %2 : tensor<8x6xf32>
  }
}


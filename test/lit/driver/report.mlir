// RUN: %opt %s -p fix-shardings --report 2>&1 >/dev/null | FileCheck %s
// RUN: %opt %s -p fix-shardings --report=json 2>&1 >/dev/null | FileCheck %s --check-prefix=JSON
// RUN: %opt %s -p fix-shardings --report 2>/dev/null | FileCheck %s --check-prefix=IR

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK: 2 sharding fix(es):
// CHECK: location {{ +}}site {{ +}}reason {{ +}}before {{ +}}after {{ +}}shards
// CHECK: report.mlir:[[# @LINE + 6]]:{{[0-9]+}} argument 0 of @f {{ +}}unknown-axis {{ +}}<@mesh, [{"dp", "sp"}, {}]> {{ +}}<@mesh, [{"dp"}, {}]> {{ +}}2->2
// CHECK: report.mlir:[[# @LINE + 6]]:8 {{ +}}'sdy.sharding_constraint' sharding {{ +}}indivisible {{ +}}<@mesh, [{}, {"tp"}]> {{ +}}<@mesh, [{}, {"tp":(1)2}]> {{ +}}4->2

// JSON: {"after": "<@mesh, [{\"dp\"}, {}]>", "before": "<@mesh, [{\"dp\", \"sp\"}, {}]>", "details": ["dim 0: axis \"sp\" is not in the mesh <[\"dp\"=2, \"tp\"=4]>; dropped"], "kind": "fix", "location": "{{.*}}report.mlir:[[# @LINE + 3]]:{{[0-9]+}}", "pass": "fix-shardings", "reason": "unknown-axis", "shards_after": 2, "shards_before": 2, "site": "argument 0 of @f"}
// JSON-NEXT: {"after": "<@mesh, [{}, {\"tp\":(1)2}]>", "before": "<@mesh, [{}, {\"tp\"}]>", {{.*}} "reason": "indivisible", "shards_after": 2, "shards_before": 4, {{.*}}}
// IR: sdy.sharding_constraint %arg0 <@mesh, [{}, {"tp":(1)2}]>
func.func @f(%arg0: tensor<8x6xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp", "sp"}, {}]>}) -> tensor<8x6xf32> {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{}, {"tp"}]> : tensor<8x6xf32>
  return %0 : tensor<8x6xf32>
}

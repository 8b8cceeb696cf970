// RUN: %opt %s -p 'fix-shardings{policy=subaxis}' --report 2>&1 >/dev/null | FileCheck %s
// RUN: %opt %s -p 'fix-shardings{policy=subaxis}' --report=json 2>&1 >/dev/null | FileCheck %s --check-prefix=JSON
// RUN: %opt %s -p 'fix-shardings{policy=subaxis}' --report 2>/dev/null | FileCheck %s --check-prefix=IR
// RUN: %opt %s -p fix-shardings --report 2>&1 >/dev/null | FileCheck %s --check-prefix=AUTO
// Under the default (auto) policy the indivisible constraint keeps its padded split, 2 columns a device against
// 3 for {"tp":(1)2}, and the report says so.

sdy.mesh @mesh = <["dp"=2, "tp"=4]>

// CHECK: 2 sharding fix(es):
// CHECK: location {{ +}}site {{ +}}reason {{ +}}before {{ +}}after {{ +}}shards
// CHECK: report.mlir:[[# @LINE + 8]]:{{[0-9]+}} argument 0 of @f {{ +}}unknown-axis {{ +}}<@mesh, [{"dp", "sp"}, {}]> {{ +}}<@mesh, [{"dp"}, {}]> {{ +}}2->2
// CHECK: report.mlir:[[# @LINE + 8]]:8 {{ +}}'sdy.sharding_constraint' sharding {{ +}}indivisible {{ +}}<@mesh, [{}, {"tp"}]> {{ +}}<@mesh, [{}, {"tp":(1)2}]> {{ +}}4->2

// JSON: {"after": "<@mesh, [{\"dp\"}, {}]>", "before": "<@mesh, [{\"dp\", \"sp\"}, {}]>", "details": ["dim 0: axis \"sp\" is not in the mesh <[\"dp\"=2, \"tp\"=4]>; dropped"], "kind": "fix", "location": "{{.*}}report.mlir:[[# @LINE + 5]]:{{[0-9]+}}", "pass": "fix-shardings", "reason": "unknown-axis", "shards_after": 2, "shards_before": 2, "site": "argument 0 of @f"}
// JSON-NEXT: {"after": "<@mesh, [{}, {\"tp\":(1)2}]>", "before": "<@mesh, [{}, {\"tp\"}]>", {{.*}} "reason": "indivisible", "shards_after": 2, "shards_before": 4, {{.*}}}
// IR: sdy.sharding_constraint %arg0 <@mesh, [{}, {"tp":(1)2}]>
// AUTO: 1 sharding fix(es):
// AUTO: remark: {{.*}}report.mlir:[[# @LINE + 2]]:8: fix-shardings: 'sdy.sharding_constraint' sharding: dim 1 of size 6 over {"tp"} (size 4): kept the padded split, 2 rows a device; the best even split, {"tp":(1)2}, would give each device 3
func.func @f(%arg0: tensor<8x6xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp", "sp"}, {}]>}) -> tensor<8x6xf32> {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{}, {"tp"}]> : tensor<8x6xf32>
  return %0 : tensor<8x6xf32>
}

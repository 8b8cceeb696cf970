// RUN: %opt %s -split-input-file -pass-pipeline=fix-shardings,canonicalize -mlir-print-ir-after-all 2>&1 >/dev/null | FileCheck %s --check-prefix=IR
// RUN: %opt %s -split-input-file -fix-shardings --mlir-timing 2>&1 >/dev/null | FileCheck %s --check-prefix=TIMING
// RUN: %opt %s -split-input-file -fix-shardings -o=%t.mlir && FileCheck %s --input-file=%t.mlir
// mlir-opt's spellings: single-dash long options, passes as flags, the module printed to stderr after every pass,
// and the time each pass took.

// IR: // -----// IR Dump After FixShardings: fix-shardings ({{.*}}builtin.module{{.*}} operation)
// IR: sdy.sharding_constraint %arg0 <@mesh, [{"a"}]>
// IR: // -----// IR Dump After {{.*}}canonicalize
// TIMING: Execution time report
// TIMING: FixShardings
// CHECK-LABEL: func @f
// CHECK: sdy.sharding_constraint %arg0 <@mesh, [{"a"}]>
sdy.mesh @mesh = <["a"=2]>

func.func @f(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"a", "zz"}]> : tensor<8xf32>
  return %0 : tensor<8xf32>
}

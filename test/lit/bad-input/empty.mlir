// RUN: %python -c "open('%t.empty.mlir', 'w').write('  \n')"
// RUN: %opt %t.empty.mlir | FileCheck %s
// RUN: %opt - < %t.empty.mlir | FileCheck %s
// RUN: %opt %t.empty.mlir -fix-shardings | FileCheck %s
// RUN: not %opt %t.empty.mlir --no-implicit-module 2>&1 | FileCheck %s --check-prefix=SINGLE

// As mlir-opt: an empty input is an empty module (the pipeline runs on it), unless --no-implicit-module asks for
// the input's one top-level operation.
// CHECK: module {
// CHECK-NEXT: }
// CHECK-EMPTY:
// SINGLE: empty.mlir.tmp.empty.mlir:1:1: error: source must contain a single top-level operation, found: 0

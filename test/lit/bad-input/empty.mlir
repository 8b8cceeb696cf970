// RUN: %python -c "open('%t.empty.mlir', 'w').write('  \n')"
// RUN: not %opt %t.empty.mlir 2>&1 | FileCheck %s
// RUN: not %opt - < %t.empty.mlir 2>&1 | FileCheck %s --check-prefix=STDIN

// CHECK: empty.mlir.tmp.empty.mlir:1:1: error: input is empty
// STDIN: <stdin>:1:1: error: input is empty

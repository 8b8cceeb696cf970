// RUN: not %opt %s -p 'canonicalize,no-such-pass' 2>&1 | FileCheck %s
// RUN: not %opt %s -p 'fix-shardings,,cse' 2>&1 | FileCheck %s --check-prefix=EMPTY
// RUN: not %opt %s -p 'fix-shardings{policy=drop' 2>&1 | FileCheck %s --check-prefix=UNBALANCED

// CHECK: <pass-pipeline>:1:14: error: 'no-such-pass' does not refer to a registered pass or pass pipeline
// EMPTY: <pass-pipeline>:1:15: error: empty pass name in the pipeline
// UNBALANCED: <pass-pipeline>:1:{{[0-9]+}}: error: unbalanced brackets or quotes in the pipeline
func.func @f() {
  return
}

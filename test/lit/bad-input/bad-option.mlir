// RUN: not %opt %s -p 'fix-shardings{policy=sideways}' 2>&1 | FileCheck %s --check-prefix=CHOICE
// RUN: not %opt %s -p 'fix-shardings{colour=red}' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not %opt %s -p 'ring-reorder{stripe=two}' 2>&1 | FileCheck %s --check-prefix=INT
// RUN: not %opt %s -p 'canonicalize{bogus=1}' 2>&1 | FileCheck %s --check-prefix=MLIR
// RUN: not %opt %s --no-such-flag 2>&1 | FileCheck %s --check-prefix=FLAG
// RUN: not %opt %s --report=xml 2>&1 | FileCheck %s --check-prefix=REPORT

// CHOICE: <pass-pipeline>:1:1: error: option 'policy' of 'fix-shardings' must be one of auto, subaxis, prefix, drop; got 'sideways'
// UNKNOWN: <pass-pipeline>:1:1: error: unknown option 'colour' for pass 'fix-shardings' (options: policy, target-mesh)
// INT: <pass-pipeline>:1:1: error: option 'stripe' of 'ring-reorder' must be an integer; got 'two'
// MLIR: <pass-pipeline>:1:1: error: no such option bogus in 'canonicalize{bogus=1}'
// FLAG: shardfix-opt: error: unrecognized arguments: --no-such-flag
// REPORT: shardfix-opt: error: argument --report: invalid choice: 'xml' (choose from 'text', 'json')
func.func @f() {
  return
}

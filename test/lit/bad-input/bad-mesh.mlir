// RUN: not %opt %s -p fix-shardings --target-mesh 'dp=four' 2>&1 | FileCheck %s --check-prefix=SYNTAX
// RUN: not %opt %s -p fix-shardings --target-mesh 'dp=0' 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not %opt %s -p fix-shardings --target-mesh 'dp=2,dp=4' 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not %opt %s --target-mesh 'dp=2' 2>&1 | FileCheck %s --check-prefix=NOPASS
// RUN: not %opt %s -p 'fix-shardings{target-mesh=dp}' 2>&1 | FileCheck %s --check-prefix=OPTION

// SYNTAX: shardfix-opt: error: --target-mesh: expected NAME=SIZE[,NAME=SIZE...], got 'dp=four'
// ZERO: shardfix-opt: error: --target-mesh: axis 'dp' must have a positive size, got 0
// TWICE: shardfix-opt: error: --target-mesh: axis 'dp' appears twice in 'dp=2,dp=4'
// NOPASS: shardfix-opt: error: --target-mesh is applied by fix-shardings; add it to the pipeline (-p fix-shardings)
// OPTION: error: fix-shardings: bad target-mesh: expected NAME=SIZE[,NAME=SIZE...], got 'dp'
sdy.mesh @mesh = <["dp"=2]>
func.func @f() {
  return
}

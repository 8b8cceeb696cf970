// RUN: %opt --list-passes | FileCheck %s
// RUN: %opt --version | FileCheck %s --check-prefix=VERSION

// CHECK: fix-shardings: repair invalid and indivisible sdy shardings
// CHECK-NEXT: policy=auto|subaxis|prefix|drop (default: 'auto')
// CHECK-NEXT: target-mesh=str (default: '')
// CHECK: ring-reorder:
// CHECK-NEXT: strategy=auto|zigzag|striped (default: 'auto')
// VERSION: shardfix-opt 0.1.0 (jax {{0\.1[0-2]\.[0-9.]+}}, jaxlib {{0\.1[0-2]\.[0-9.]+}})

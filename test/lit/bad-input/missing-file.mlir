// RUN: not %opt %t.does-not-exist.mlir 2>&1 | FileCheck %s

// CHECK: shardfix-opt: error: cannot open input file '{{.*}}does-not-exist.mlir': No such file or directory

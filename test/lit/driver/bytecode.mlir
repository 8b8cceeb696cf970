// RUN: %python -c "import sys; from jax._src.lib.mlir import ir; from shardfix.ir import make_context, parse_module; ctx = make_context(); m = parse_module(open(sys.argv[1]).read(), ctx); f = open(sys.argv[2], 'wb'); m.write_bytecode(f)" %s %t.mlirbc
// RUN: %opt %t.mlirbc | FileCheck %s
// MLIR bytecode is read like text.

// CHECK-LABEL: func @id
func.func @id(%arg0: tensor<2xf32>) -> tensor<2xf32> {
  return %arg0 : tensor<2xf32>
}

// RUN: %python -c "import sys; from jaxlib.mlir import ir; from shardfix.ir import make_context, parse_module; ctx = make_context(); m = parse_module(open(sys.argv[1]).read(), ctx, sys.argv[1]); f = m.regions[0].blocks[0].operations[1].operation; f.attributes['arg_attrs'] = ir.ArrayAttr.get([ir.DictAttr.get({'sdy.sharding': ir.Attribute.parse('#sdy.sharding<@mesh, [{\"zz\"}]>', ctx)}, ctx)], ctx); m.write_bytecode(open(sys.argv[2], 'wb'))" %s %t.mlirbc
// RUN: not %opt %t.mlirbc -p fix-shardings -o %t.out 2>&1 | FileCheck %s
// RUN: not test -e %t.out
// Bytecode is only read by verifying it: a sharding the verifier rejects can't be held aside for repair as in a
// text module. The refusal says so in shardfix's words, at the op MLIR names (the locations the bytecode holds).

// CHECK: bytecode-invalid.mlir:[[# @LINE + 3]]:1: error: fix-shardings can't repair this: the module is MLIR bytecode that doesn't verify, and bytecode is only read by verifying it; it would need the module as text
// CHECK-NEXT: note: MLIR: 'func.func' op arg 0 - unknown axis name: "zz"
sdy.mesh @mesh = <["x"=2]>
func.func @f(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}

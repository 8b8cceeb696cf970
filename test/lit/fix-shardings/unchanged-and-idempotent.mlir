// RUN: %opt %s > %t.plain.mlir
// RUN: %opt %s -p fix-shardings > %t.fixed.mlir
// RUN: diff %t.plain.mlir %t.fixed.mlir
// RUN: %opt %S/Inputs/many-faults.mlir -p fix-shardings > %t.once.mlir
// RUN: %opt %t.once.mlir -p fix-shardings > %t.twice.mlir
// RUN: diff %t.once.mlir %t.twice.mlir
// RUN: %opt %S/Inputs/many-faults.mlir -p fix-shardings > %t.again.mlir
// RUN: diff %t.once.mlir %t.again.mlir
// RUN: %opt %s -p fix-shardings --report 2>&1 >/dev/null | %python -c "import sys; assert not sys.stdin.read()"
// RUN: %opt %t.once.mlir -p fix-shardings --report=json 2>&1 >/dev/null | %python -c "import sys; assert '\"kind\": \"fix\"' not in sys.stdin.read()"
// A valid, divisible module comes out byte-identical to a plain parse and print; fixing twice equals fixing once
// (and reports no fix the second time; the padded splits the auto policy keeps are remarked on each run); the
// same input always gives the same bytes.

sdy.mesh @mesh = <["a"=2, "b"=4]>

func.func @valid(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a", ?}, {"b":(1)2}p1]>}) -> (tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}], replicated={"b"}>}) {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{}, {"b"}]> : tensor<8x8xf32>
  %1 = stablehlo.tanh %0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"a"}, {"b"}]>]>} : tensor<8x8xf32>
  return %1 : tensor<8x8xf32>
}

// RUN: %opt %s --split-input-file -p 'fix-shardings{policy=subaxis}' 2>/dev/null | FileCheck %s
// RUN: %opt %s --split-input-file -p 'fix-shardings{policy=subaxis}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=STDERR
// An sdy collective checks its out_sharding against its operand's sharding: fix-shardings leaves both as they
// are, with a remark, and repairs the rest; the output verifies. A sharding a collective reads that the verifier
// rejects is repaired where the collective then agrees (collective-repair.mlir): here the all_gather gathers "y"
// from {"y", "z"}, and dropping the unknown "z" leaves it what it gathers (the report lists fixes before remarks).
// STDERR: collectives.mlir:37:8 {{ +}}result 0 of 'stablehlo.add' {{ +}}unknown-axis {{ +}}<@mesh, [{"y", "z"}, {}]> {{ +}}<@mesh, [{"y"}, {}]> {{ +}}2->2

sdy.mesh @mesh = <["x"=4, "y"=2]>

// STDERR: remark: {{.*}}collectives.mlir:[[# @LINE + 10]]:8: fix-shardings: 'sdy.all_slice' out_sharding left as it is: the sdy collective 'sdy.all_gather' at {{.*}}collectives.mlir:[[# @LINE + 11]]:8 checks it, so changing it alone would break that (dim 0 of size 7 is not divisible by {"x"} (size 4); now {} (size 1)
// STDERR: remark: {{.*}}collectives.mlir:[[# @LINE + 10]]:8: fix-shardings: 'sdy.all_gather' out_sharding left as it is
// CHECK-LABEL: func @collectives
// CHECK: sdy.all_slice [{"x"}, {"y"}] %arg0 out_sharding=<@mesh, [{"x"}, {"y"}]>
// CHECK: sdy.all_gather [{}, {"y"}] %0 out_sharding=<@mesh, [{"x"}, {}]>
// CHECK: stablehlo.add %arg1, %arg1 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"x":(1)2}, {}]>]>}
// CHECK: stablehlo.add %arg1, %arg1 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"y"}, {}]>]>}
// CHECK: sdy.all_gather [{"y"}, {}] %3 out_sharding=<@mesh, [{}, {}]>
// CHECK-NOT: error
func.func @collectives(%arg0: tensor<7x7xi32>, %arg1: tensor<6x8xi32>) -> (tensor<7x7xi32>, tensor<6x8xi32>, tensor<6x8xi32>) {
  %0 = sdy.all_slice [{"x"}, {"y"}] %arg0 out_sharding=<@mesh, [{"x"}, {"y"}]> : tensor<7x7xi32>
  %1 = sdy.all_gather [{}, {"y"}] %0 out_sharding=<@mesh, [{"x"}, {}]> : tensor<7x7xi32>
  %2 = stablehlo.add %arg1, %arg1 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"x", "y"}, {}]>]>} : tensor<6x8xi32>
  %3 = stablehlo.add %arg1, %arg1 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"y"}, {}]>]>} : tensor<6x8xi32>
  %4 = sdy.all_gather [{"y"}, {}] %3 out_sharding=<@mesh, [{}, {}]> : tensor<6x8xi32>
  return %1, %2, %4 : tensor<7x7xi32>, tensor<6x8xi32>, tensor<6x8xi32>
}

// -----

sdy.mesh @mesh = <["x"=4, "y"=2]>

// CHECK-LABEL: func @invalid_and_read_by_a_collective
// CHECK-NEXT:    %0 = stablehlo.add %arg0, %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"y"}, {}]>]>} : tensor<8x8xi32>
// CHECK-NEXT:    %1 = sdy.all_gather [{"y"}, {}] %0 out_sharding=<@mesh, [{}, {}]> : tensor<8x8xi32>
func.func @invalid_and_read_by_a_collective(%arg0: tensor<8x8xi32>) -> tensor<8x8xi32> {
  %0 = stablehlo.add %arg0, %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"y", "z"}, {}]>]>} : tensor<8x8xi32>
  %1 = sdy.all_gather [{"y"}, {}] %0 out_sharding=<@mesh, [{}, {}]> : tensor<8x8xi32>
  return %1 : tensor<8x8xi32>
}

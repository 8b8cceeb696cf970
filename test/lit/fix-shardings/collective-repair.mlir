// RUN: not %opt %s --split-input-file -p fix-shardings 2>/dev/null | FileCheck %s
// RUN: not %opt %s --split-input-file -p fix-shardings --report 2>&1 >/dev/null | FileCheck %s --check-prefix=STDERR
// A sharding that an sdy collective reads and the verifier rejects is repaired like any other where the collective
// then agrees with it: an unknown axis dropped from the operand of an all_slice, which slices "x" from an operand
// that doesn't have it (an op result's or a function argument's). Where the repair leaves the collective
// disagreeing, a located refusal: at the collective (slicing "x" again from the repaired {"x"}), or at the sharding
// (an all_gather of "y" from {"zz"}: dropping "zz" leaves no "y" to gather). An all_gather of "y" from {"y", "zz"}
// is repaired (the collective verifies against the sharding without "zz" while the module loads). The report lists
// each fix the pass made, the refused chunk's too. A sharding_constraint's own sharding (either syntax) is repaired the same way.

// STDERR: collective-repair.mlir:[[# @LINE + 40]]:8: error: fix-shardings can't repair this: an sdy collective doesn't agree with the shardings around it; it would need the collective's axes and out_sharding consistent with its operand's sharding: fix-shardings never changes a collective, and repairs a sharding one reads only where the repair is what the collective expects
// STDERR-NEXT: collective-repair.mlir:[[# @LINE + 39]]:8: note: MLIR: 'sdy.all_slice' op result sharding doesn't match expected sharding ["x", "x"] on dimension 0
// STDERR-NEXT: collective-repair.mlir:[[# @LINE + 48]]:8: error: fix-shardings can't repair this: a sharding that an sdy collective reads (or the collective's own) is wrong, and no repair of the sharding alone makes the collective agree with it; it would need the sharding and the collective corrected together, by hand
// STDERR-NEXT: collective-repair.mlir:[[# @LINE + 47]]:8: note: MLIR: 'stablehlo.add' op result - unknown axis name: "zz"
// STDERR-NEXT: 8 sharding fix(es):
// STDERR:      collective-repair.mlir:[[# @LINE + 15]]:8 {{ +}}result 0 of 'stablehlo.add' {{ +}}unknown-axis {{ +}}<@mesh, [{"zz"}, {}]> {{ +}}<@mesh, [{}, {}]> {{ +}}1->1
// STDERR-NEXT: collective-repair.mlir:[[# @LINE + 22]]:34 {{ +}}argument 0 of @arg_read_by_all_slice {{ +}}unknown-axis {{ +}}<@mesh, [{"zz"}, {}]> {{ +}}<@mesh, [{}, {}]> {{ +}}1->1
// STDERR-NEXT: collective-repair.mlir:[[# @LINE + 32]]:8 {{ +}}result 0 of 'stablehlo.add' {{ +}}unknown-axis {{ +}}<@mesh, [{"x", "zz"}, {}]> {{ +}}<@mesh, [{"x"}, {}]> {{ +}}4->4
// STDERR-NEXT: collective-repair.mlir:[[# @LINE + 55]]:8 {{ +}}result 0 of 'stablehlo.add' {{ +}}unknown-axis {{ +}}<@mesh, [{"y", "zz"}, {}]> {{ +}}<@mesh, [{"y"}, {}]> {{ +}}2->2
// STDERR-NEXT: collective-repair.mlir:[[# @LINE + 62]]:25 {{ +}}argument 0 of @arg_gathered {{ +}}unknown-axis {{ +}}<@mesh, [{"y", "zz"}, {}]> {{ +}}<@mesh, [{"y"}, {}]> {{ +}}2->2
// STDERR-NEXT: collective-repair.mlir:[[# @LINE + 74]]:8 {{ +}}'sdy.sharding_constraint' sharding {{ +}}unknown-axis {{ +}}<@mesh, [{"y", "zz"}, {}]> {{ +}}<@mesh, [{"y"}, {}]> {{ +}}2->2
// STDERR-NEXT: collective-repair.mlir:[[# @LINE + 82]]:8 {{ +}}'sdy.sharding_constraint' sharding {{ +}}unknown-axis {{ +}}<@mesh, [{"zz"}, {}]> {{ +}}<@mesh, [{}, {}]> {{ +}}1->1
// STDERR-NEXT: collective-repair.mlir:[[# @LINE + 90]]:8 {{ +}}'sdy.sharding_constraint' sharding {{ +}}unknown-axis {{ +}}<@mesh, [{"y", "zz"}, {}]> {{ +}}<@mesh, [{"y"}, {}]> {{ +}}2->2

sdy.mesh @mesh = <["x"=4, "y"=2]>

// CHECK-LABEL: func @result_read_by_all_slice
// CHECK-NEXT:    %0 = stablehlo.add %arg0, %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{}, {}]>]>} : tensor<8x8xi32>
// CHECK-NEXT:    %1 = sdy.all_slice [{"x"}, {}] %0 out_sharding=<@mesh, [{"x"}, {}]> : tensor<8x8xi32>
func.func @result_read_by_all_slice(%arg0: tensor<8x8xi32>) -> tensor<8x8xi32> {
  %0 = stablehlo.add %arg0, %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"zz"}, {}]>]>} : tensor<8x8xi32>
  %1 = sdy.all_slice [{"x"}, {}] %0 out_sharding=<@mesh, [{"x"}, {}]> : tensor<8x8xi32>
  return %1 : tensor<8x8xi32>
}

// CHECK-LABEL: func @arg_read_by_all_slice
// CHECK-SAME:    (%arg0: tensor<8x8xi32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>})
// CHECK-NEXT:    %0 = sdy.all_slice [{"x"}, {}] %arg0 out_sharding=<@mesh, [{"x"}, {}]> : tensor<8x8xi32>
func.func @arg_read_by_all_slice(%arg0: tensor<8x8xi32> {sdy.sharding = #sdy.sharding<@mesh, [{"zz"}, {}]>}) -> tensor<8x8xi32> {
  %0 = sdy.all_slice [{"x"}, {}] %arg0 out_sharding=<@mesh, [{"x"}, {}]> : tensor<8x8xi32>
  return %0 : tensor<8x8xi32>
}

// -----

sdy.mesh @mesh = <["x"=4, "y"=2]>

// CHECK-NOT: func @slice_again
func.func @slice_again(%arg0: tensor<8x8xi32>) -> tensor<8x8xi32> {
  %0 = stablehlo.add %arg0, %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"x", "zz"}, {}]>]>} : tensor<8x8xi32>
  %1 = sdy.all_slice [{"x"}, {}] %0 out_sharding=<@mesh, [{"x"}, {}]> : tensor<8x8xi32>
  return %1 : tensor<8x8xi32>
}

// -----

sdy.mesh @mesh = <["x"=4, "y"=2]>

// CHECK-NOT: func @gather_needs_the_axis
func.func @gather_needs_the_axis(%arg0: tensor<8x8xi32>) -> tensor<8x8xi32> {
  %0 = stablehlo.add %arg0, %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"zz"}, {}]>]>} : tensor<8x8xi32>
  %1 = sdy.all_gather [{"y"}, {}] %0 out_sharding=<@mesh, [{}, {}]> : tensor<8x8xi32>
  return %1 : tensor<8x8xi32>
}

// -----

sdy.mesh @mesh = <["x"=4, "y"=2]>

// CHECK-LABEL: func @gather_of_the_known_axis
// CHECK-NEXT:    %0 = stablehlo.add %arg0, %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"y"}, {}]>]>} : tensor<8x8xi32>
// CHECK-NEXT:    %1 = sdy.all_gather [{"y"}, {}] %0 out_sharding=<@mesh, [{}, {}]> : tensor<8x8xi32>
func.func @gather_of_the_known_axis(%arg0: tensor<8x8xi32>) -> tensor<8x8xi32> {
  %0 = stablehlo.add %arg0, %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"y", "zz"}, {}]>]>} : tensor<8x8xi32>
  %1 = sdy.all_gather [{"y"}, {}] %0 out_sharding=<@mesh, [{}, {}]> : tensor<8x8xi32>
  return %1 : tensor<8x8xi32>
}

// CHECK-LABEL: func @arg_gathered
// CHECK-SAME:    (%arg0: tensor<8x8xi32> {sdy.sharding = #sdy.sharding<@mesh, [{"y"}, {}]>})
// CHECK-NEXT:    %0 = sdy.all_gather [{"y"}, {}] %arg0 out_sharding=<@mesh, [{}, {}]> : tensor<8x8xi32>
func.func @arg_gathered(%arg0: tensor<8x8xi32> {sdy.sharding = #sdy.sharding<@mesh, [{"y", "zz"}, {}]>}) -> tensor<8x8xi32> {
  %0 = sdy.all_gather [{"y"}, {}] %arg0 out_sharding=<@mesh, [{}, {}]> : tensor<8x8xi32>
  return %0 : tensor<8x8xi32>
}

// -----

sdy.mesh @mesh = <["x"=4, "y"=2]>

// CHECK-LABEL: func @constraint_gathered
// CHECK-NEXT:    %0 = sdy.sharding_constraint %arg0 <@mesh, [{"y"}, {}]> : tensor<8x8xi32>
// CHECK-NEXT:    %1 = sdy.all_gather [{"y"}, {}] %0 out_sharding=<@mesh, [{}, {}]> : tensor<8x8xi32>
func.func @constraint_gathered(%arg0: tensor<8x8xi32>) -> tensor<8x8xi32> {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"y", "zz"}, {}]> : tensor<8x8xi32>
  %1 = sdy.all_gather [{"y"}, {}] %0 out_sharding=<@mesh, [{}, {}]> : tensor<8x8xi32>
  return %1 : tensor<8x8xi32>
}

// CHECK-LABEL: func @constraint_sliced
// CHECK-NEXT:    %0 = sdy.sharding_constraint %arg0 <@mesh, [{}, {}]> : tensor<8x8xi32>
// CHECK-NEXT:    %1 = sdy.all_slice [{"x"}, {}] %0 out_sharding=<@mesh, [{"x"}, {}]> : tensor<8x8xi32>
func.func @constraint_sliced(%arg0: tensor<8x8xi32>) -> tensor<8x8xi32> {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"zz"}, {}]> : tensor<8x8xi32>
  %1 = sdy.all_slice [{"x"}, {}] %0 out_sharding=<@mesh, [{"x"}, {}]> : tensor<8x8xi32>
  return %1 : tensor<8x8xi32>
}

// CHECK-LABEL: func @generic_constraint_gathered
// CHECK-NEXT:    %0 = sdy.sharding_constraint %arg0 <@mesh, [{"y"}, {}]> : tensor<8x8xi32>
"func.func"() <{function_type = (tensor<8x8xi32>) -> tensor<8x8xi32>, sym_name = "generic_constraint_gathered"}> ({
^bb0(%arg0: tensor<8x8xi32>):
  %0 = "sdy.sharding_constraint"(%arg0) <{sharding = #sdy.sharding<@mesh, [{"y", "zz"}, {}]>}> : (tensor<8x8xi32>) -> tensor<8x8xi32>
  %1 = "sdy.all_gather"(%0) <{gathering_axes = #sdy<list_of_axis_ref_lists[{"y"}, {}]>, out_sharding = #sdy.sharding<@mesh, [{}, {}]>}> : (tensor<8x8xi32>) -> tensor<8x8xi32>
  "func.return"(%1) : (tensor<8x8xi32>) -> ()
}) : () -> ()

// RUN: %opt %s --split-input-file -p fix-shardings | FileCheck %s
// The generic form's inherent attributes wherever MLIR takes them: a named computation whose name comes first
// (both of its lists are left out while the module is parsed), a mesh given through an alias, and a sharding in the
// attribute dictionary instead of the properties.

sdy.mesh @mesh = <["a"=2, "b"=4]>

// CHECK-LABEL: func.func @name_first
// CHECK: sdy.named_computation<"foo">(%arg0) in_shardings=[<@mesh, [{"a"}, {}]>] out_shardings=[<@mesh, [{"a"}, {"b"}]>]
func.func @name_first(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = "sdy.named_computation"(%arg0) <{name = "foo",
        in_shardings = #sdy.sharding_per_value<[<@mesh, [{"a"}, {"c"}]>]>, // "c" is no axis of @mesh
        out_shardings = #sdy.sharding_per_value<[<@mesh, [{"a"}, {"b", "b"}]>]>}> ({
  ^bb0(%arg1: tensor<8x16xf32>):
    "sdy.return"(%arg1) : (tensor<8x16xf32>) -> ()
  }) : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

#m = #sdy.mesh<["x"=2, "y"=4]>
"sdy.mesh"() <{mesh = #m, sym_name = "m"}> : () -> ()

// CHECK-LABEL: func.func @mesh_alias
// CHECK: sdy.manual_computation(%arg0) in_shardings=[<@m, [{"x"}, {}]>] out_shardings=[<@m, [{"x"}, {}]>] manual_axes={"x"}
func.func @mesh_alias(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = "sdy.manual_computation"(%arg0) <{in_shardings = #sdy.sharding_per_value<[<@m, [{"x"}, {}]>]>, manual_axes = #sdy<manual_axes{"x", "zz"}>, out_shardings = #sdy.sharding_per_value<[<@m, [{"x"}, {}]>]>}> ({
  ^bb0(%arg1: tensor<4x16xf32>):
    "sdy.return"(%arg1) : (tensor<4x16xf32>) -> ()
  }) : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

// -----

sdy.mesh @mesh = <["a"=2, "b"=4]>

// CHECK-LABEL: func.func @in_the_attribute_dictionary
// CHECK: sdy.sharding_constraint %arg0 <@mesh, [{"a"}, {}]> {keep = 1 : i64} : tensor<8x16xf32>
func.func @in_the_attribute_dictionary(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = "sdy.sharding_constraint"(%arg0) {keep = 1 : i64, sharding = #sdy.sharding<@mesh, [{"a", "a"}, {}]>} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}

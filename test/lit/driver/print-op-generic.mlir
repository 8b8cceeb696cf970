// RUN: %opt %s --print-op-generic | FileCheck %s

sdy.mesh @mesh = <["a"=2]>

// CHECK: "sdy.mesh"() <{mesh = #sdy.mesh<["a"=2]>, sym_name = "mesh"}>
// CHECK: "func.func"()
// CHECK: "stablehlo.add"(%arg0, %arg0)
func.func @f(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
  return %0 : tensor<4xf32>
}

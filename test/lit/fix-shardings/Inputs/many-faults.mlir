sdy.mesh @mesh = <["a"=2, "b"=4, "c"=2]>

func.func @main(%arg0: tensor<6x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"b", "z"}, {"a", "a"}]>}, %arg1: !stablehlo.token {sdy.sharding = #sdy.sharding<@mesh, [{"a"}]>}) -> (tensor<6x8xf32> {sdy.sharding = #sdy.sharding<@nope, [{"c"}, {}, {}]>}, !stablehlo.token) {
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"b":(1)2, "b":(2)2}, {}p3], replicated={"c", "a"}> : tensor<6x8xf32>
  %1 = sdy.manual_computation(%0) in_shardings=[<@mesh, [{"c"}, {"b"}]>] out_shardings=[<@mesh, [{"c"}, {"q"}]>] manual_axes={"c"} (%arg2: tensor<3x8xf32>) {
    %2 = sdy.sharding_constraint %arg2 <@mesh, [{"c", "b"}, {"a"}]> : tensor<3x8xf32>
    sdy.return %2 : tensor<3x8xf32>
  } : (tensor<6x8xf32>) -> tensor<6x8xf32>
  return %1, %arg1 : tensor<6x8xf32>, !stablehlo.token
}

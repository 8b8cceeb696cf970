sdy.mesh @mesh = <["a"=2, "b"=4]>

func.func public @main(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>}) -> (tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"b"}]>}) {
  %0 = stablehlo.tanh %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"a", "b"}, {}]>]>} : tensor<8x8xf32> loc("model.py":12:4)
  %1 = sdy.sharding_constraint %0 <@mesh, [{"a", "b"}, {}]> : tensor<8x8xf32>
  %2 = sdy.reshard %1 <@mesh, [{"b"}, {}]> : tensor<8x8xf32>
  %3 = sdy.manual_computation(%2) in_shardings=[<@mesh, [{"b"}, {}]>] out_shardings=[<@mesh, [{"b"}, {}]>] manual_axes={"b"} (%arg1: tensor<2x8xf32>) {
    %4 = sdy.sharding_constraint %arg1 <@mesh, [{}, {"a"}]> : tensor<2x8xf32>
    sdy.return %4 : tensor<2x8xf32>
  } : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %5 = sdy.named_computation<"block">(%3) in_shardings=[<@mesh, [{"a"}, {}]>] out_shardings=[<@mesh, [{}, {"a"}]>] (%arg2: tensor<8x8xf32>) {
    sdy.return %arg2 : tensor<8x8xf32>
  } : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %6 = sdy.data_flow_edge %5 sharding=<@mesh, [{}, {"a"}]> : tensor<8x8xf32>
  %7 = sdy.sharding_constraint %6 <@mesh, [{"a", "b"}, {}]> : tensor<8x8xf32>
  %8 = sdy.all_gather [{"b"}, {}] %7 out_sharding=<@mesh, [{"a"}, {}]> : tensor<8x8xf32>
  %9 = call @helper(%8) : (tensor<8x8xf32>) -> tensor<8x8xf32>
  return %9 : tensor<8x8xf32>
}

func.func private @helper(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>}) -> tensor<8x8xf32> {
  return %arg0 : tensor<8x8xf32>
}

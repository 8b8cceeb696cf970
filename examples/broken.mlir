// Shardings tuned for another mesh: an unknown axis, a duplicate, a rank mismatch and an indivisible dim.
sdy.mesh @mesh = <["dp"=2, "tp"=4]>

func.func public @main(%x: tensor<6x64xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"fsdp", "dp"}, {"tp"}]>},
                       %w: tensor<64x50257xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"tp"}, {"tp"}, {}]>}) -> tensor<6x50257xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<6x64xf32>, tensor<64x50257xf32>) -> tensor<6x50257xf32>
  %1 = sdy.sharding_constraint %0 <@mesh, [{"tp"}, {}]> : tensor<6x50257xf32>
  return %1 : tensor<6x50257xf32>
}

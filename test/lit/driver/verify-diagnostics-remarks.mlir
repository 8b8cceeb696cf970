// RUN: %opt %s --verify-diagnostics -p fix-shardings
// In --verify-diagnostics mode every fix is a remark at the op it changed, and so is every padded split the
// auto policy keeps.

sdy.mesh @mesh = <["a"=2, "b"=4]>

func.func @f(%arg0: tensor<6x8xf32>) -> tensor<6x8xf32> {
  // expected-remark @+1 {{'sdy.sharding_constraint' sharding: dim 0 of size 6 over {"b"} (size 4): kept the padded split, 2 rows a device; the best even split, {"b":(1)2}, would give each device 3}}
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"b"}, {}]> : tensor<6x8xf32>
  // expected-remark @below {{unknown-axis: dim 1: axis "z" is not in the mesh}}
  %1 = stablehlo.tanh %0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{}, {"z"}]>]>} : tensor<6x8xf32>
  return %1 : tensor<6x8xf32>
}

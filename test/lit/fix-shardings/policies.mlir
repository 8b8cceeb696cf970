// RUN: %opt %s -p fix-shardings | FileCheck %s --check-prefix=AUTO
// RUN: %opt %s -p 'fix-shardings{policy=auto}' | FileCheck %s --check-prefix=AUTO
// RUN: %opt %s -p 'fix-shardings{policy=subaxis}' | FileCheck %s --check-prefix=SUBAXIS
// RUN: %opt %s -p 'fix-shardings{policy=prefix}' | FileCheck %s --check-prefix=PREFIX
// RUN: %opt %s -p 'fix-shardings{policy=drop}' | FileCheck %s --check-prefix=DROP
// Indivisible dims under each policy (vectors from Shardy's getEvenlySharded, MaxText and ejkernel). The auto
// policy (the default) keeps a padded split where it leaves each device fewer rows than the best even split:
// 6 rows over b=4 pad to 2 a device against 3 for {"b":(1)2}, 12 over 8 pad to 2 against 3; 4 rows over 16
// devices give 1 either way, so they are repaired.

sdy.mesh @mesh = <["a"=2, "b"=4, "c"=2]>

func.func private @f(%arg0: tensor<6x8xf32>, %arg1: tensor<12x8xf32>, %arg2: tensor<4x8xf32>, %arg3: tensor<8x6xf32>) -> (tensor<6x8xf32>, tensor<12x8xf32>, tensor<4x8xf32>, tensor<8x6xf32>) {
  // AUTO: sdy.sharding_constraint %arg0 <@mesh, [{"b"}, {}]>
  // SUBAXIS: sdy.sharding_constraint %arg0 <@mesh, [{"b":(1)2}, {}]>
  // PREFIX: sdy.sharding_constraint %arg0 <@mesh, [{}, {}]>
  // DROP: sdy.sharding_constraint %arg0 <@mesh, [{}, {}]>
  %0 = sdy.sharding_constraint %arg0 <@mesh, [{"b"}, {}]> : tensor<6x8xf32>
  // AUTO: sdy.sharding_constraint %arg1 <@mesh, [{"a", "b"}, {}]>
  // SUBAXIS: sdy.sharding_constraint %arg1 <@mesh, [{"a", "b":(1)2}, {}]>
  // PREFIX: sdy.sharding_constraint %arg1 <@mesh, [{"a"}, {}]>
  // DROP: sdy.sharding_constraint %arg1 <@mesh, [{}, {}]>
  %1 = sdy.sharding_constraint %arg1 <@mesh, [{"a", "b"}, {}]> : tensor<12x8xf32>
  // AUTO: sdy.sharding_constraint %arg2 <@mesh, [{"a", "b":(1)2}, {}]>
  // SUBAXIS: sdy.sharding_constraint %arg2 <@mesh, [{"a", "b":(1)2}, {}]>
  // PREFIX: sdy.sharding_constraint %arg2 <@mesh, [{"a"}, {}]>
  // DROP: sdy.sharding_constraint %arg2 <@mesh, [{}, {}]>
  %2 = sdy.sharding_constraint %arg2 <@mesh, [{"a", "b", "c"}, {}]> : tensor<4x8xf32>
  // Open dims stay open; the divisible dim is untouched.
  // AUTO: sdy.sharding_constraint %arg3 <@mesh, [{"a", ?}, {"b", ?}]>
  // SUBAXIS: sdy.sharding_constraint %arg3 <@mesh, [{"a", ?}, {"b":(1)2, ?}]>
  // PREFIX: sdy.sharding_constraint %arg3 <@mesh, [{"a", ?}, {?}]>
  // DROP: sdy.sharding_constraint %arg3 <@mesh, [{"a", ?}, {?}]>
  %3 = sdy.sharding_constraint %arg3 <@mesh, [{"a", ?}, {"b", ?}]> : tensor<8x6xf32>
  return %0, %1, %2, %3 : tensor<6x8xf32>, tensor<12x8xf32>, tensor<4x8xf32>, tensor<8x6xf32>
}

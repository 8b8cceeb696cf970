// RUN: %opt %s > %t.plain.mlir
// RUN: %opt %s -p 'ring-reorder{mode=off}' > %t.off.mlir
// RUN: diff %t.plain.mlir %t.off.mlir
// RUN: %opt %s -p 'ring-reorder{mode=force}' --report 2>&1 | FileCheck %s --check-prefix=FORCE
// RUN: %opt %s -p 'ring-reorder{mode=force}' > %t.once.mlir
// RUN: %opt %t.once.mlir -p 'ring-reorder{mode=force}' > %t.twice.mlir
// RUN: diff %t.once.mlir %t.twice.mlir
// RUN: %opt %t.once.mlir -p 'ring-reorder{mode=force}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=AGAIN
// mode=off leaves everything alone; mode=force reorders although the region reads the device index (the user
// vouches for the kernel); a reordered region is marked, so running the pass again changes nothing.

sdy.mesh @mesh = <["cp"=2]>

// FORCE: ring: {{.*}}: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored (mode=force: safety analysis skipped))
// FORCE: shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = false, strategy = "zigzag"
// AGAIN: ring: {{.*}}: axis "cp", zigzag: not applied (already reordered (zigzag))
func.func @ring(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}]>] out_shardings=[<@mesh, [{"cp"}]>] manual_axes={"cp"} (%x: tensor<4xf32>) {
    %1 = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4xf32>) -> tensor<4xf32>
    %id = stablehlo.partition_id : tensor<ui32>
    %f = stablehlo.convert %id : (tensor<ui32>) -> tensor<f32>
    %b = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %2 = stablehlo.add %1, %b : tensor<4xf32>
    sdy.return %2 : tensor<4xf32>
  } : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

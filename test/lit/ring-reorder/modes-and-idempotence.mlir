// RUN: %opt %s > %t.plain.mlir
// RUN: %opt %s -p 'ring-reorder{mode=off}' > %t.off.mlir
// RUN: diff %t.plain.mlir %t.off.mlir
// RUN: %opt %s -p 'ring-reorder{strategy=zigzag}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=AUTO
// RUN: %opt %s -p 'ring-reorder{mode=force}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=FORCE
// RUN: %opt %s -p 'ring-reorder{mode=force}' > %t.once.mlir
// RUN: FileCheck %s --check-prefix=FORCE-IR < %t.once.mlir
// RUN: %opt %t.once.mlir -p 'ring-reorder{mode=force}' > %t.twice.mlir
// RUN: diff %t.once.mlir %t.twice.mlir
// RUN: %opt %t.once.mlir -p 'ring-reorder{mode=force}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=AGAIN
// RUN: %opt %t.once.mlir -p 'ring-reorder{strategy=striped}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=AGAIN-STRIPED
// RUN: %opt %s -p 'ring-reorder{strategy=zigzag}' > %t.auto.mlir
// RUN: %opt %t.auto.mlir -p 'ring-reorder{strategy=zigzag}' > %t.auto2.mlir
// RUN: diff %t.auto.mlir %t.auto2.mlir
// mode=off leaves everything alone; mode=auto reorders only what the analysis proves (the total-sum, not the region
// that adds the device index to the tokens); mode=force reorders both, the device-index one although it reads the
// device index (the user vouches for the kernel). A reordered region is marked, so running the pass again, in
// either mode or with the other strategy, changes nothing and says why.

sdy.mesh @mesh = <["cp"=2]>

// AUTO: ring: {{.*}}modes-and-idempotence.mlir:[[# @LINE + 19]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.convert' at {{.*}}modes-and-idempotence.mlir:[[# @LINE + 19]]:10 reads the device index other than as a coordinate along a mesh axis){{$}}
// AUTO-NEXT: ring: {{.*}}modes-and-idempotence.mlir:[[# @LINE + 28]]:8: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored){{$}}
// FORCE: ring: {{.*}}modes-and-idempotence.mlir:[[# @LINE + 14]]:8: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored (mode=force: safety analysis skipped)){{$}}
// FORCE-NEXT: ring: {{.*}}modes-and-idempotence.mlir:[[# @LINE + 26]]:8: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored (mode=force: safety analysis skipped)){{$}}
// FORCE-IR-LABEL: func.func @device_index
// FORCE-IR:       shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}
// FORCE-IR:       stablehlo.partition_id
// FORCE-IR:       shardfix.ring_reorder = "zigzag"
// FORCE-IR:       shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}
// FORCE-IR-LABEL: func.func @total_sum
// FORCE-IR:       shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}
// FORCE-IR:       shardfix.ring_reorder = "zigzag"
// FORCE-IR:       shardfix.sequence_permutation = {axis = "cp", dim = 0 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}
// AGAIN-COUNT-2: ring: {{.*}}: axis "cp", zigzag: not applied (already reordered (zigzag)){{$}}
// AGAIN-STRIPED-COUNT-2: ring: {{.*}}: axis "cp", striped{stripe=1}: not applied (already reordered (zigzag)){{$}}
func.func @device_index(%arg0: tensor<8xf32>) -> tensor<8xf32> {
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

// The ring total-sum on two devices: own tokens plus the sum of both blocks.
func.func @total_sum(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}]>] out_shardings=[<@mesh, [{"cp"}]>] manual_axes={"cp"} (%x: tensor<4xf32>) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
    %p = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<f32>) -> tensor<f32>
    %t = stablehlo.add %s, %p : tensor<f32>
    %b = stablehlo.broadcast_in_dim %t, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %y = stablehlo.add %x, %b : tensor<4xf32>
    sdy.return %y : tensor<4xf32>
  } : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}

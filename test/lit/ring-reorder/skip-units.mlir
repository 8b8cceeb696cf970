// RUN: %opt %s --split-input-file --verify-diagnostics -p 'ring-reorder{strategy=zigzag}'
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=zigzag}' | FileCheck %s
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=zigzag}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=striped stripe=4}' | FileCheck %s --check-prefix=STRIPED4
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=striped stripe=4}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT4
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=striped stripe=2}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT2
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=striped}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT-AUTO
// A blockwise kernel that skips (query chunk, key chunk) pairs: lax.cond (a stablehlo.case) on
// `q_first + chunk - 1 >= k_first`, the positions of the chunks' first and last tokens computed from the device
// index. Skipping is the same in every order only if each chunk (a unit of 4 tokens) stays whole and in order under
// the permutation: then the rewritten positions give the same answer for the same pair of chunks. So the units must
// not straddle the two zigzag halves of a block, and must be a whole part of a stripe.
//   - 64 tokens (16 a device, halves of 8): zigzag keeps the chunks whole, the case predicate reads the rewritten
//     positions; striped with stripe 4 too; stripe 2 would cut a chunk in two and is refused at the case.
//   - 48 tokens (12 a device, halves of 6): the chunk at tokens 4..7 would straddle the halves; refused at the case.
// Striped without a stripe picks the smallest stripe that keeps the units whole: 4 here.
//
// Both are tests/support/ring_programs.py's scan_chunk_attention(mesh, chunk=4) with q, k, v of shape (1, S, 2),
// on jax.make_mesh((1, 4), ("dp", "cp")) over 4 CPU devices, lowered with jax 0.10.2 (as_text(), no debug info):
// lax.scan over the ring steps, a Python loop over query chunks, an inner lax.scan over key chunks, and
//   q_first = me * n + i * chunk;  k_first = src * n + j * chunk;  live = q_first + chunk - 1 >= k_first
//   acc_i = lax.cond(live, merge(acc_i, block_attention(...)), acc_i)

// The first query chunk's body (@closed_call_1, or the copy the pass rewrites for this region): the skip predicate
// reads the last query token's and the first key token's positions through the zigzag map (16 tokens a device,
// halves of 8: c = v div 16, j = v rem 16, select(j < 8, c*8 + j, 56 - c*8 + (j - 8))); the case itself stays.
// CHECK-LABEL: func.func public @main
// CHECK:       } {shardfix.ring_reorder = "zigzag"}
// CHECK-LABEL: func.func private @closed_call_1{{[_a-z0-9]*}}(
// CHECK:         %[[KBASE:.*]] = stablehlo.multiply %arg1, %{{.*}} : tensor<i32>
// CHECK-NEXT:    stablehlo.constant dense<4> : tensor<i32>
// CHECK-NEXT:    %[[KOFF:.*]] = stablehlo.multiply %arg8, %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[KFIRST:.*]] = stablehlo.add %[[KBASE]], %[[KOFF]] : tensor<i32>
// CHECK:         %[[QLAST:.*]] = stablehlo.subtract %{{.*}}, %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[QC:.*]] = stablehlo.divide %[[QLAST]], %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[QJ:.*]] = stablehlo.remainder %[[QLAST]], %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[QC8:.*]] = stablehlo.multiply %[[QC]], %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[QLO:.*]] = stablehlo.add %[[QC8]], %[[QJ]] : tensor<i32>
// CHECK-NEXT:    %[[QC8B:.*]] = stablehlo.multiply %[[QC]], %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[QM:.*]] = stablehlo.subtract %{{.*}}, %[[QC8B]] : tensor<i32>
// CHECK-NEXT:    %[[QJ8:.*]] = stablehlo.subtract %[[QJ]], %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[QHI:.*]] = stablehlo.add %[[QM]], %[[QJ8]] : tensor<i32>
// CHECK-NEXT:    %[[QLOW:.*]] = stablehlo.compare LT, %[[QJ]], %{{.*}} : (tensor<i32>, tensor<i32>) -> tensor<i1>
// CHECK-NEXT:    %[[QNEW:.*]] = stablehlo.select %[[QLOW]], %[[QLO]], %[[QHI]] : tensor<i1>, tensor<i32>
// CHECK-NEXT:    %[[KC:.*]] = stablehlo.divide %[[KFIRST]], %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[KJ:.*]] = stablehlo.remainder %[[KFIRST]], %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[KC8:.*]] = stablehlo.multiply %[[KC]], %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[KLO:.*]] = stablehlo.add %[[KC8]], %[[KJ]] : tensor<i32>
// CHECK-NEXT:    %[[KC8B:.*]] = stablehlo.multiply %[[KC]], %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[KM:.*]] = stablehlo.subtract %{{.*}}, %[[KC8B]] : tensor<i32>
// CHECK-NEXT:    %[[KJ8:.*]] = stablehlo.subtract %[[KJ]], %{{.*}} : tensor<i32>
// CHECK-NEXT:    %[[KHI:.*]] = stablehlo.add %[[KM]], %[[KJ8]] : tensor<i32>
// CHECK-NEXT:    %[[KLOW:.*]] = stablehlo.compare LT, %[[KJ]], %{{.*}} : (tensor<i32>, tensor<i32>) -> tensor<i1>
// CHECK-NEXT:    %[[KNEW:.*]] = stablehlo.select %[[KLOW]], %[[KLO]], %[[KHI]] : tensor<i1>, tensor<i32>
// CHECK-NEXT:    %[[LIVE:.*]] = stablehlo.compare GE, %[[QNEW]], %[[KNEW]], SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
// CHECK-NEXT:    %[[BRANCH:.*]] = stablehlo.convert %[[LIVE]] : (tensor<i1>) -> tensor<i32>
// CHECK-NEXT:    "stablehlo.case"(%[[BRANCH]])
// Striped, stripe 4 (m = 4 tokens a stripe): ((j div 4)*4 + c)*4 + (j rem 4).
// STRIPED4-LABEL: func.func public @main
// STRIPED4:       } {shardfix.ring_reorder = "striped{stripe=4}"}
// STRIPED4-LABEL: func.func private @closed_call_1{{[_a-z0-9]*}}(
// STRIPED4:         %[[QLAST:.*]] = stablehlo.subtract %{{.*}}, %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[QC:.*]] = stablehlo.divide %[[QLAST]], %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[QJ:.*]] = stablehlo.remainder %[[QLAST]], %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[QS:.*]] = stablehlo.divide %[[QJ]], %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[QS4:.*]] = stablehlo.multiply %[[QS]], %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[QSC:.*]] = stablehlo.add %[[QS4]], %[[QC]] : tensor<i32>
// STRIPED4-NEXT:    %[[QT:.*]] = stablehlo.multiply %[[QSC]], %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[QR:.*]] = stablehlo.remainder %[[QJ]], %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[QNEW:.*]] = stablehlo.add %[[QT]], %[[QR]] : tensor<i32>
// STRIPED4-NEXT:    %[[KC:.*]] = stablehlo.divide %{{.*}}, %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[KJ:.*]] = stablehlo.remainder %{{.*}}, %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[KS:.*]] = stablehlo.divide %[[KJ]], %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[KS4:.*]] = stablehlo.multiply %[[KS]], %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[KSC:.*]] = stablehlo.add %[[KS4]], %[[KC]] : tensor<i32>
// STRIPED4-NEXT:    %[[KT:.*]] = stablehlo.multiply %[[KSC]], %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[KR:.*]] = stablehlo.remainder %[[KJ]], %{{.*}} : tensor<i32>
// STRIPED4-NEXT:    %[[KNEW:.*]] = stablehlo.add %[[KT]], %[[KR]] : tensor<i32>
// STRIPED4-NEXT:    %[[LIVE:.*]] = stablehlo.compare GE, %[[QNEW]], %[[KNEW]], SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
// STRIPED4-NEXT:    %[[BRANCH:.*]] = stablehlo.convert %[[LIVE]] : (tensor<i1>) -> tensor<i32>
// STRIPED4-NEXT:    "stablehlo.case"(%[[BRANCH]])
module @jit_body attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["dp"=1, "cp"=4]> {stablehlo.mesh = {axes = [{name = "dp", size = 1 : i64}, {name = "cp", size = 4 : i64}]}}
  func.func public @main(%arg0: tensor<1x64x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}, %arg1: tensor<1x64x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}, %arg2: tensor<1x64x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}) -> (tensor<1x64x2xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}) {
    // REPORT: ring: {{.*}}skip-units.mlir:[[# @LINE + 4]]:10: axis "cp", zigzag: applied (3 operand(s) reordered, 1 result(s) restored, 16 position read(s) rewritten){{$}}
    // REPORT4: ring: {{.*}}skip-units.mlir:[[# @LINE + 3]]:10: axis "cp", striped{stripe=4}: applied (3 operand(s) reordered, 1 result(s) restored, 16 position read(s) rewritten){{$}}
    // REPORT-AUTO: ring: {{.*}}skip-units.mlir:[[# @LINE + 2]]:10: axis "cp", striped{stripe=4}: applied (3 operand(s) reordered, 1 result(s) restored, 16 position read(s) rewritten){{$}}
    // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied (3 operand(s) reordered, 1 result(s) restored, 16 position read(s) rewritten)}}
    %0 = sdy.manual_computation(%arg0, %arg1, %arg2) in_shardings=[<@mesh, [{"dp"}, {"cp"}, {}]>, <@mesh, [{"dp"}, {"cp"}, {}]>, <@mesh, [{"dp"}, {"cp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}, {}]>] manual_axes={"dp", "cp"} (%arg3: tensor<1x16x2xf32>, %arg4: tensor<1x16x2xf32>, %arg5: tensor<1x16x2xf32>) {
      %c = stablehlo.constant dense<1> : tensor<ui32>
      %c_0 = stablehlo.constant dense<4> : tensor<ui32>
      %1 = stablehlo.partition_id : tensor<ui32>
      %2 = stablehlo.divide %1, %c : tensor<ui32>
      %3 = stablehlo.remainder %2, %c_0 : tensor<ui32>
      %4 = stablehlo.convert %3 : (tensor<ui32>) -> tensor<i32>
      %5 = stablehlo.reshape %arg3 : (tensor<1x16x2xf32>) -> tensor<1x4x4x2xf32>
      %6 = stablehlo.transpose %5, dims = [1, 0, 2, 3] : (tensor<1x4x4x2xf32>) -> tensor<4x1x4x2xf32>
      %7 = stablehlo.slice %arg3 [0:1, 0:16, 0:1] : (tensor<1x16x2xf32>) -> tensor<1x16x1xf32>
      %8 = stablehlo.reshape %7 : (tensor<1x16x1xf32>) -> tensor<1x16xf32>
      %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %9 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<1x16xf32>
      %10 = stablehlo.multiply %8, %9 : tensor<1x16xf32>
      %cst_1 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %11 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<1x16xf32>
      %12 = stablehlo.add %10, %11 : tensor<1x16xf32>
      %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %13 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1x16x2xf32>
      %14 = stablehlo.multiply %arg3, %13 : tensor<1x16x2xf32>
      %15 = stablehlo.iota dim = 0 : tensor<4xi32>
      %c_3 = stablehlo.constant dense<0> : tensor<i32>
      %16:9 = stablehlo.while(%iterArg = %15, %iterArg_4 = %4, %iterArg_5 = %6, %iterArg_6 = %c_3, %iterArg_7 = %12, %iterArg_8 = %10, %iterArg_9 = %14, %iterArg_10 = %arg4, %iterArg_11 = %arg5) : tensor<4xi32>, tensor<i32>, tensor<4x1x4x2xf32>, tensor<i32>, tensor<1x16xf32>, tensor<1x16xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>
      cond {
        %c_12 = stablehlo.constant dense<4> : tensor<i32>
        %20 = stablehlo.compare LT, %iterArg_6, %c_12, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %20 : tensor<i1>
      } do {
        %20 = func.call @dynamic_index_in_dim(%iterArg, %iterArg_6) : (tensor<4xi32>, tensor<i32>) -> tensor<i32>
        %21:5 = func.call @closed_call(%iterArg_4, %iterArg_5, %iterArg_7, %iterArg_8, %iterArg_9, %iterArg_10, %iterArg_11, %20) : (tensor<i32>, tensor<4x1x4x2xf32>, tensor<1x16xf32>, tensor<1x16xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>, tensor<i32>) -> (tensor<1x16xf32>, tensor<1x16xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>)
        %c_12 = stablehlo.constant dense<1> : tensor<i32>
        %22 = stablehlo.add %iterArg_6, %c_12 : tensor<i32>
        stablehlo.return %iterArg, %iterArg_4, %iterArg_5, %22, %21#0, %21#1, %21#2, %21#3, %21#4 : tensor<4xi32>, tensor<i32>, tensor<4x1x4x2xf32>, tensor<i32>, tensor<1x16xf32>, tensor<1x16xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>
      }
      %17 = stablehlo.broadcast_in_dim %16#5, dims = [0, 1] : (tensor<1x16xf32>) -> tensor<1x16x1xf32>
      %18 = stablehlo.broadcast_in_dim %17, dims = [0, 1, 2] : (tensor<1x16x1xf32>) -> tensor<1x16x2xf32>
      %19 = stablehlo.divide %16#6, %18 : tensor<1x16x2xf32>
      sdy.return %19 : tensor<1x16x2xf32>
    } : (tensor<1x64x2xf32>, tensor<1x64x2xf32>, tensor<1x64x2xf32>) -> tensor<1x64x2xf32>
    return %0 : tensor<1x64x2xf32>
  }
  func.func private @dynamic_index_in_dim(%arg0: tensor<4xi32>, %arg1: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.dynamic_slice %arg0, %arg1, sizes = [1] : (tensor<4xi32>, tensor<i32>) -> tensor<1xi32>
    %1 = stablehlo.reshape %0 : (tensor<1xi32>) -> tensor<i32>
    return %1 : tensor<i32>
  }
  func.func private @closed_call(%arg0: tensor<i32>, %arg1: tensor<4x1x4x2xf32>, %arg2: tensor<1x16xf32>, %arg3: tensor<1x16xf32>, %arg4: tensor<1x16x2xf32>, %arg5: tensor<1x16x2xf32>, %arg6: tensor<1x16x2xf32>, %arg7: tensor<i32>) -> (tensor<1x16xf32>, tensor<1x16xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>) {
    %0 = stablehlo.subtract %arg0, %arg7 : tensor<i32>
    %c = stablehlo.constant dense<4> : tensor<i32>
    %1 = call @remainder(%0, %c) : (tensor<i32>, tensor<i32>) -> tensor<i32>
    %2 = stablehlo.reshape %arg5 : (tensor<1x16x2xf32>) -> tensor<1x4x4x2xf32>
    %3 = stablehlo.transpose %2, dims = [1, 0, 2, 3] : (tensor<1x4x4x2xf32>) -> tensor<4x1x4x2xf32>
    %4 = stablehlo.reshape %arg6 : (tensor<1x16x2xf32>) -> tensor<1x4x4x2xf32>
    %5 = stablehlo.transpose %4, dims = [1, 0, 2, 3] : (tensor<1x4x4x2xf32>) -> tensor<4x1x4x2xf32>
    %6 = stablehlo.slice %arg2 [0:1, 0:4] : (tensor<1x16xf32>) -> tensor<1x4xf32>
    %7 = stablehlo.slice %arg3 [0:1, 0:4] : (tensor<1x16xf32>) -> tensor<1x4xf32>
    %8 = stablehlo.slice %arg4 [0:1, 0:4, 0:2] : (tensor<1x16x2xf32>) -> tensor<1x4x2xf32>
    %9 = stablehlo.slice %arg1 [0:1, 0:1, 0:4, 0:2] : (tensor<4x1x4x2xf32>) -> tensor<1x1x4x2xf32>
    %10 = stablehlo.reshape %9 : (tensor<1x1x4x2xf32>) -> tensor<1x4x2xf32>
    %11 = stablehlo.iota dim = 0 : tensor<4xi32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %12:10 = stablehlo.while(%iterArg = %3, %iterArg_4 = %5, %iterArg_5 = %11, %iterArg_6 = %arg0, %iterArg_7 = %1, %iterArg_8 = %10, %iterArg_9 = %c_0, %iterArg_10 = %6, %iterArg_11 = %7, %iterArg_12 = %8) : tensor<4x1x4x2xf32>, tensor<4x1x4x2xf32>, tensor<4xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    cond {
      %c_13 = stablehlo.constant dense<4> : tensor<i32>
      %39 = stablehlo.compare LT, %iterArg_9, %c_13, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %39 : tensor<i1>
    } do {
      %39 = func.call @dynamic_index_in_dim_0(%iterArg, %iterArg_9) : (tensor<4x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %40 = func.call @dynamic_index_in_dim_0(%iterArg_4, %iterArg_9) : (tensor<4x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %41 = func.call @dynamic_index_in_dim(%iterArg_5, %iterArg_9) : (tensor<4xi32>, tensor<i32>) -> tensor<i32>
      %42:3 = func.call @closed_call_1(%iterArg_6, %iterArg_7, %iterArg_8, %iterArg_10, %iterArg_11, %iterArg_12, %39, %40, %41) : (tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
      %c_13 = stablehlo.constant dense<1> : tensor<i32>
      %43 = stablehlo.add %iterArg_9, %c_13 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_4, %iterArg_5, %iterArg_6, %iterArg_7, %iterArg_8, %43, %42#0, %42#1, %42#2 : tensor<4x1x4x2xf32>, tensor<4x1x4x2xf32>, tensor<4xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }
    %13 = stablehlo.slice %arg2 [0:1, 4:8] : (tensor<1x16xf32>) -> tensor<1x4xf32>
    %14 = stablehlo.slice %arg3 [0:1, 4:8] : (tensor<1x16xf32>) -> tensor<1x4xf32>
    %15 = stablehlo.slice %arg4 [0:1, 4:8, 0:2] : (tensor<1x16x2xf32>) -> tensor<1x4x2xf32>
    %16 = stablehlo.slice %arg1 [1:2, 0:1, 0:4, 0:2] : (tensor<4x1x4x2xf32>) -> tensor<1x1x4x2xf32>
    %17 = stablehlo.reshape %16 : (tensor<1x1x4x2xf32>) -> tensor<1x4x2xf32>
    %18 = stablehlo.iota dim = 0 : tensor<4xi32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %19:10 = stablehlo.while(%iterArg = %3, %iterArg_4 = %5, %iterArg_5 = %18, %iterArg_6 = %arg0, %iterArg_7 = %1, %iterArg_8 = %17, %iterArg_9 = %c_1, %iterArg_10 = %13, %iterArg_11 = %14, %iterArg_12 = %15) : tensor<4x1x4x2xf32>, tensor<4x1x4x2xf32>, tensor<4xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    cond {
      %c_13 = stablehlo.constant dense<4> : tensor<i32>
      %39 = stablehlo.compare LT, %iterArg_9, %c_13, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %39 : tensor<i1>
    } do {
      %39 = func.call @dynamic_index_in_dim_0(%iterArg, %iterArg_9) : (tensor<4x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %40 = func.call @dynamic_index_in_dim_0(%iterArg_4, %iterArg_9) : (tensor<4x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %41 = func.call @dynamic_index_in_dim(%iterArg_5, %iterArg_9) : (tensor<4xi32>, tensor<i32>) -> tensor<i32>
      %42:3 = func.call @closed_call_3(%iterArg_6, %iterArg_7, %iterArg_8, %iterArg_10, %iterArg_11, %iterArg_12, %39, %40, %41) : (tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
      %c_13 = stablehlo.constant dense<1> : tensor<i32>
      %43 = stablehlo.add %iterArg_9, %c_13 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_4, %iterArg_5, %iterArg_6, %iterArg_7, %iterArg_8, %43, %42#0, %42#1, %42#2 : tensor<4x1x4x2xf32>, tensor<4x1x4x2xf32>, tensor<4xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }
    %20 = stablehlo.slice %arg2 [0:1, 8:12] : (tensor<1x16xf32>) -> tensor<1x4xf32>
    %21 = stablehlo.slice %arg3 [0:1, 8:12] : (tensor<1x16xf32>) -> tensor<1x4xf32>
    %22 = stablehlo.slice %arg4 [0:1, 8:12, 0:2] : (tensor<1x16x2xf32>) -> tensor<1x4x2xf32>
    %23 = stablehlo.slice %arg1 [2:3, 0:1, 0:4, 0:2] : (tensor<4x1x4x2xf32>) -> tensor<1x1x4x2xf32>
    %24 = stablehlo.reshape %23 : (tensor<1x1x4x2xf32>) -> tensor<1x4x2xf32>
    %25 = stablehlo.iota dim = 0 : tensor<4xi32>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %26:10 = stablehlo.while(%iterArg = %3, %iterArg_4 = %5, %iterArg_5 = %25, %iterArg_6 = %arg0, %iterArg_7 = %1, %iterArg_8 = %24, %iterArg_9 = %c_2, %iterArg_10 = %20, %iterArg_11 = %21, %iterArg_12 = %22) : tensor<4x1x4x2xf32>, tensor<4x1x4x2xf32>, tensor<4xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    cond {
      %c_13 = stablehlo.constant dense<4> : tensor<i32>
      %39 = stablehlo.compare LT, %iterArg_9, %c_13, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %39 : tensor<i1>
    } do {
      %39 = func.call @dynamic_index_in_dim_0(%iterArg, %iterArg_9) : (tensor<4x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %40 = func.call @dynamic_index_in_dim_0(%iterArg_4, %iterArg_9) : (tensor<4x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %41 = func.call @dynamic_index_in_dim(%iterArg_5, %iterArg_9) : (tensor<4xi32>, tensor<i32>) -> tensor<i32>
      %42:3 = func.call @closed_call_4(%iterArg_6, %iterArg_7, %iterArg_8, %iterArg_10, %iterArg_11, %iterArg_12, %39, %40, %41) : (tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
      %c_13 = stablehlo.constant dense<1> : tensor<i32>
      %43 = stablehlo.add %iterArg_9, %c_13 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_4, %iterArg_5, %iterArg_6, %iterArg_7, %iterArg_8, %43, %42#0, %42#1, %42#2 : tensor<4x1x4x2xf32>, tensor<4x1x4x2xf32>, tensor<4xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }
    %27 = stablehlo.slice %arg2 [0:1, 12:16] : (tensor<1x16xf32>) -> tensor<1x4xf32>
    %28 = stablehlo.slice %arg3 [0:1, 12:16] : (tensor<1x16xf32>) -> tensor<1x4xf32>
    %29 = stablehlo.slice %arg4 [0:1, 12:16, 0:2] : (tensor<1x16x2xf32>) -> tensor<1x4x2xf32>
    %30 = stablehlo.slice %arg1 [3:4, 0:1, 0:4, 0:2] : (tensor<4x1x4x2xf32>) -> tensor<1x1x4x2xf32>
    %31 = stablehlo.reshape %30 : (tensor<1x1x4x2xf32>) -> tensor<1x4x2xf32>
    %32 = stablehlo.iota dim = 0 : tensor<4xi32>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %33:10 = stablehlo.while(%iterArg = %3, %iterArg_4 = %5, %iterArg_5 = %32, %iterArg_6 = %arg0, %iterArg_7 = %1, %iterArg_8 = %31, %iterArg_9 = %c_3, %iterArg_10 = %27, %iterArg_11 = %28, %iterArg_12 = %29) : tensor<4x1x4x2xf32>, tensor<4x1x4x2xf32>, tensor<4xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    cond {
      %c_13 = stablehlo.constant dense<4> : tensor<i32>
      %39 = stablehlo.compare LT, %iterArg_9, %c_13, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %39 : tensor<i1>
    } do {
      %39 = func.call @dynamic_index_in_dim_0(%iterArg, %iterArg_9) : (tensor<4x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %40 = func.call @dynamic_index_in_dim_0(%iterArg_4, %iterArg_9) : (tensor<4x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %41 = func.call @dynamic_index_in_dim(%iterArg_5, %iterArg_9) : (tensor<4xi32>, tensor<i32>) -> tensor<i32>
      %42:3 = func.call @closed_call_5(%iterArg_6, %iterArg_7, %iterArg_8, %iterArg_10, %iterArg_11, %iterArg_12, %39, %40, %41) : (tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
      %c_13 = stablehlo.constant dense<1> : tensor<i32>
      %43 = stablehlo.add %iterArg_9, %c_13 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_4, %iterArg_5, %iterArg_6, %iterArg_7, %iterArg_8, %43, %42#0, %42#1, %42#2 : tensor<4x1x4x2xf32>, tensor<4x1x4x2xf32>, tensor<4xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }
    %34 = stablehlo.concatenate %12#7, %19#7, %26#7, %33#7, dim = 1 : (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4xf32>) -> tensor<1x16xf32>
    %35 = stablehlo.concatenate %12#8, %19#8, %26#8, %33#8, dim = 1 : (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4xf32>) -> tensor<1x16xf32>
    %36 = stablehlo.concatenate %12#9, %19#9, %26#9, %33#9, dim = 1 : (tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>) -> tensor<1x16x2xf32>
    %37 = "stablehlo.collective_permute"(%arg5) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<1x16x2xf32>) -> tensor<1x16x2xf32>
    %38 = "stablehlo.collective_permute"(%arg6) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<1x16x2xf32>) -> tensor<1x16x2xf32>
    return %34, %35, %36, %37, %38 : tensor<1x16xf32>, tensor<1x16xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>, tensor<1x16x2xf32>
  }
  func.func private @remainder(%arg0: tensor<i32>, %arg1: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.compare EQ, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %2 = call @_where(%1, %c_0, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %3 = stablehlo.remainder %arg0, %2 : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %4 = stablehlo.compare NE, %3, %c_1, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %5 = stablehlo.compare LT, %3, %c_2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %6 = stablehlo.compare LT, %2, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %7 = stablehlo.compare NE, %5, %6, UNSIGNED : (tensor<i1>, tensor<i1>) -> tensor<i1>
    %8 = stablehlo.and %7, %4 : tensor<i1>
    %9 = stablehlo.add %3, %2 : tensor<i32>
    %10 = stablehlo.select %8, %9, %3 : tensor<i1>, tensor<i32>
    return %10 : tensor<i32>
  }
  func.func private @_where(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @dynamic_index_in_dim_0(%arg0: tensor<4x1x4x2xf32>, %arg1: tensor<i32>) -> tensor<1x4x2xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, %c_0, %c_1, sizes = [1, 1, 4, 2] : (tensor<4x1x4x2xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4x2xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x1x4x2xf32>) -> tensor<1x4x2xf32>
    return %1 : tensor<1x4x2xf32>
  }
  func.func private @closed_call_1(%arg0: tensor<i32>, %arg1: tensor<i32>, %arg2: tensor<1x4x2xf32>, %arg3: tensor<1x4xf32>, %arg4: tensor<1x4xf32>, %arg5: tensor<1x4x2xf32>, %arg6: tensor<1x4x2xf32>, %arg7: tensor<1x4x2xf32>, %arg8: tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>) {
    %c = stablehlo.constant dense<16> : tensor<i32>
    %0 = stablehlo.multiply %arg0, %c : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.add %0, %c_0 : tensor<i32>
    %c_1 = stablehlo.constant dense<16> : tensor<i32>
    %2 = stablehlo.multiply %arg1, %c_1 : tensor<i32>
    %c_2 = stablehlo.constant dense<4> : tensor<i32>
    %3 = stablehlo.multiply %arg8, %c_2 : tensor<i32>
    %4 = stablehlo.add %2, %3 : tensor<i32>
    %5 = stablehlo.iota dim = 0 : tensor<4xi32>
    %6 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %7 = stablehlo.add %6, %5 : tensor<4xi32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %9 = stablehlo.iota dim = 0 : tensor<4xi32>
    %10 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %11 = stablehlo.add %10, %9 : tensor<4xi32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %c_3 = stablehlo.constant dense<4> : tensor<i32>
    %13 = stablehlo.add %1, %c_3 : tensor<i32>
    %c_4 = stablehlo.constant dense<1> : tensor<i32>
    %14 = stablehlo.subtract %13, %c_4 : tensor<i32>
    %15 = stablehlo.compare GE, %14, %4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %16 = stablehlo.convert %15 : (tensor<i1>) -> tensor<i32>
    // REPORT2: ring: {{.*}}skip-units.mlir:[[# @LINE + 1]]:13: axis "cp", striped{stripe=2}: not applied (not provably safe with striped{stripe=2}: 'stablehlo.case' at {{.*}}skip-units.mlir:[[# @LINE + 1]]:13 reads positions of units of 4 tokens, which are not a whole part of the 2-token stripe){{$}}
    %17:3 = "stablehlo.case"(%16) ({
      stablehlo.return %arg3, %arg4, %arg5 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }, {
      %18 = stablehlo.dot_general %arg2, %arg6, batching_dims = [0] x [0], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1x4x2xf32>, tensor<1x4x2xf32>) -> tensor<1x4x4xf32>
      %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
      %19 = stablehlo.sqrt %cst : tensor<f32>
      %20 = stablehlo.broadcast_in_dim %19, dims = [] : (tensor<f32>) -> tensor<1x4x4xf32>
      %21 = stablehlo.divide %18, %20 : tensor<1x4x4xf32>
      %22 = stablehlo.broadcast_in_dim %8, dims = [0, 1] : (tensor<1x4xi32>) -> tensor<1x4x1xi32>
      %23 = stablehlo.broadcast_in_dim %12, dims = [0, 2] : (tensor<1x4xi32>) -> tensor<1x1x4xi32>
      %24 = stablehlo.broadcast_in_dim %22, dims = [0, 1, 2] : (tensor<1x4x1xi32>) -> tensor<1x4x4xi32>
      %25 = stablehlo.broadcast_in_dim %23, dims = [0, 1, 2] : (tensor<1x1x4xi32>) -> tensor<1x4x4xi32>
      %26 = stablehlo.compare GE, %24, %25, SIGNED : (tensor<1x4x4xi32>, tensor<1x4x4xi32>) -> tensor<1x4x4xi1>
      %cst_5 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %27 = func.call @_where_2(%26, %21, %cst_5) : (tensor<1x4x4xi1>, tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4x4xf32>
      %cst_6 = stablehlo.constant dense<0xFF800000> : tensor<f32>
      %28 = stablehlo.reduce(%27 init: %cst_6) applies stablehlo.maximum across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %29 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %30 = stablehlo.broadcast_in_dim %29, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x4xf32>
      %31 = stablehlo.subtract %27, %30 : tensor<1x4x4xf32>
      %32 = stablehlo.exponential %31 : tensor<1x4x4xf32>
      %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %33 = stablehlo.reduce(%32 init: %cst_7) applies stablehlo.add across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %34 = stablehlo.dot_general %32, %arg7, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x4x4xf32>, tensor<1x4x2xf32>) -> tensor<1x4x2xf32>
      %35 = stablehlo.maximum %arg3, %28 : tensor<1x4xf32>
      %36 = stablehlo.subtract %arg3, %35 : tensor<1x4xf32>
      %37 = stablehlo.exponential %36 : tensor<1x4xf32>
      %38 = stablehlo.subtract %28, %35 : tensor<1x4xf32>
      %39 = stablehlo.exponential %38 : tensor<1x4xf32>
      %40 = stablehlo.multiply %arg4, %37 : tensor<1x4xf32>
      %41 = stablehlo.multiply %33, %39 : tensor<1x4xf32>
      %42 = stablehlo.add %40, %41 : tensor<1x4xf32>
      %43 = stablehlo.broadcast_in_dim %37, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %44 = stablehlo.broadcast_in_dim %43, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %45 = stablehlo.multiply %arg5, %44 : tensor<1x4x2xf32>
      %46 = stablehlo.broadcast_in_dim %39, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %47 = stablehlo.broadcast_in_dim %46, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %48 = stablehlo.multiply %34, %47 : tensor<1x4x2xf32>
      %49 = stablehlo.add %45, %48 : tensor<1x4x2xf32>
      stablehlo.return %35, %42, %49 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }) : (tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
    return %17#0, %17#1, %17#2 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
  }
  func.func private @_where_2(%arg0: tensor<1x4x4xi1>, %arg1: tensor<1x4x4xf32>, %arg2: tensor<f32>) -> tensor<1x4x4xf32> {
    %0 = stablehlo.convert %arg2 : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<1x4x4xf32>
    %2 = stablehlo.select %arg0, %arg1, %1 : tensor<1x4x4xi1>, tensor<1x4x4xf32>
    return %2 : tensor<1x4x4xf32>
  }
  func.func private @closed_call_3(%arg0: tensor<i32>, %arg1: tensor<i32>, %arg2: tensor<1x4x2xf32>, %arg3: tensor<1x4xf32>, %arg4: tensor<1x4xf32>, %arg5: tensor<1x4x2xf32>, %arg6: tensor<1x4x2xf32>, %arg7: tensor<1x4x2xf32>, %arg8: tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>) {
    %c = stablehlo.constant dense<16> : tensor<i32>
    %0 = stablehlo.multiply %arg0, %c : tensor<i32>
    %c_0 = stablehlo.constant dense<4> : tensor<i32>
    %1 = stablehlo.add %0, %c_0 : tensor<i32>
    %c_1 = stablehlo.constant dense<16> : tensor<i32>
    %2 = stablehlo.multiply %arg1, %c_1 : tensor<i32>
    %c_2 = stablehlo.constant dense<4> : tensor<i32>
    %3 = stablehlo.multiply %arg8, %c_2 : tensor<i32>
    %4 = stablehlo.add %2, %3 : tensor<i32>
    %5 = stablehlo.iota dim = 0 : tensor<4xi32>
    %6 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %7 = stablehlo.add %6, %5 : tensor<4xi32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %9 = stablehlo.iota dim = 0 : tensor<4xi32>
    %10 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %11 = stablehlo.add %10, %9 : tensor<4xi32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %c_3 = stablehlo.constant dense<4> : tensor<i32>
    %13 = stablehlo.add %1, %c_3 : tensor<i32>
    %c_4 = stablehlo.constant dense<1> : tensor<i32>
    %14 = stablehlo.subtract %13, %c_4 : tensor<i32>
    %15 = stablehlo.compare GE, %14, %4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %16 = stablehlo.convert %15 : (tensor<i1>) -> tensor<i32>
    %17:3 = "stablehlo.case"(%16) ({
      stablehlo.return %arg3, %arg4, %arg5 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }, {
      %18 = stablehlo.dot_general %arg2, %arg6, batching_dims = [0] x [0], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1x4x2xf32>, tensor<1x4x2xf32>) -> tensor<1x4x4xf32>
      %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
      %19 = stablehlo.sqrt %cst : tensor<f32>
      %20 = stablehlo.broadcast_in_dim %19, dims = [] : (tensor<f32>) -> tensor<1x4x4xf32>
      %21 = stablehlo.divide %18, %20 : tensor<1x4x4xf32>
      %22 = stablehlo.broadcast_in_dim %8, dims = [0, 1] : (tensor<1x4xi32>) -> tensor<1x4x1xi32>
      %23 = stablehlo.broadcast_in_dim %12, dims = [0, 2] : (tensor<1x4xi32>) -> tensor<1x1x4xi32>
      %24 = stablehlo.broadcast_in_dim %22, dims = [0, 1, 2] : (tensor<1x4x1xi32>) -> tensor<1x4x4xi32>
      %25 = stablehlo.broadcast_in_dim %23, dims = [0, 1, 2] : (tensor<1x1x4xi32>) -> tensor<1x4x4xi32>
      %26 = stablehlo.compare GE, %24, %25, SIGNED : (tensor<1x4x4xi32>, tensor<1x4x4xi32>) -> tensor<1x4x4xi1>
      %cst_5 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %27 = func.call @_where_2(%26, %21, %cst_5) : (tensor<1x4x4xi1>, tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4x4xf32>
      %cst_6 = stablehlo.constant dense<0xFF800000> : tensor<f32>
      %28 = stablehlo.reduce(%27 init: %cst_6) applies stablehlo.maximum across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %29 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %30 = stablehlo.broadcast_in_dim %29, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x4xf32>
      %31 = stablehlo.subtract %27, %30 : tensor<1x4x4xf32>
      %32 = stablehlo.exponential %31 : tensor<1x4x4xf32>
      %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %33 = stablehlo.reduce(%32 init: %cst_7) applies stablehlo.add across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %34 = stablehlo.dot_general %32, %arg7, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x4x4xf32>, tensor<1x4x2xf32>) -> tensor<1x4x2xf32>
      %35 = stablehlo.maximum %arg3, %28 : tensor<1x4xf32>
      %36 = stablehlo.subtract %arg3, %35 : tensor<1x4xf32>
      %37 = stablehlo.exponential %36 : tensor<1x4xf32>
      %38 = stablehlo.subtract %28, %35 : tensor<1x4xf32>
      %39 = stablehlo.exponential %38 : tensor<1x4xf32>
      %40 = stablehlo.multiply %arg4, %37 : tensor<1x4xf32>
      %41 = stablehlo.multiply %33, %39 : tensor<1x4xf32>
      %42 = stablehlo.add %40, %41 : tensor<1x4xf32>
      %43 = stablehlo.broadcast_in_dim %37, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %44 = stablehlo.broadcast_in_dim %43, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %45 = stablehlo.multiply %arg5, %44 : tensor<1x4x2xf32>
      %46 = stablehlo.broadcast_in_dim %39, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %47 = stablehlo.broadcast_in_dim %46, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %48 = stablehlo.multiply %34, %47 : tensor<1x4x2xf32>
      %49 = stablehlo.add %45, %48 : tensor<1x4x2xf32>
      stablehlo.return %35, %42, %49 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }) : (tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
    return %17#0, %17#1, %17#2 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
  }
  func.func private @closed_call_4(%arg0: tensor<i32>, %arg1: tensor<i32>, %arg2: tensor<1x4x2xf32>, %arg3: tensor<1x4xf32>, %arg4: tensor<1x4xf32>, %arg5: tensor<1x4x2xf32>, %arg6: tensor<1x4x2xf32>, %arg7: tensor<1x4x2xf32>, %arg8: tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>) {
    %c = stablehlo.constant dense<16> : tensor<i32>
    %0 = stablehlo.multiply %arg0, %c : tensor<i32>
    %c_0 = stablehlo.constant dense<8> : tensor<i32>
    %1 = stablehlo.add %0, %c_0 : tensor<i32>
    %c_1 = stablehlo.constant dense<16> : tensor<i32>
    %2 = stablehlo.multiply %arg1, %c_1 : tensor<i32>
    %c_2 = stablehlo.constant dense<4> : tensor<i32>
    %3 = stablehlo.multiply %arg8, %c_2 : tensor<i32>
    %4 = stablehlo.add %2, %3 : tensor<i32>
    %5 = stablehlo.iota dim = 0 : tensor<4xi32>
    %6 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %7 = stablehlo.add %6, %5 : tensor<4xi32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %9 = stablehlo.iota dim = 0 : tensor<4xi32>
    %10 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %11 = stablehlo.add %10, %9 : tensor<4xi32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %c_3 = stablehlo.constant dense<4> : tensor<i32>
    %13 = stablehlo.add %1, %c_3 : tensor<i32>
    %c_4 = stablehlo.constant dense<1> : tensor<i32>
    %14 = stablehlo.subtract %13, %c_4 : tensor<i32>
    %15 = stablehlo.compare GE, %14, %4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %16 = stablehlo.convert %15 : (tensor<i1>) -> tensor<i32>
    %17:3 = "stablehlo.case"(%16) ({
      stablehlo.return %arg3, %arg4, %arg5 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }, {
      %18 = stablehlo.dot_general %arg2, %arg6, batching_dims = [0] x [0], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1x4x2xf32>, tensor<1x4x2xf32>) -> tensor<1x4x4xf32>
      %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
      %19 = stablehlo.sqrt %cst : tensor<f32>
      %20 = stablehlo.broadcast_in_dim %19, dims = [] : (tensor<f32>) -> tensor<1x4x4xf32>
      %21 = stablehlo.divide %18, %20 : tensor<1x4x4xf32>
      %22 = stablehlo.broadcast_in_dim %8, dims = [0, 1] : (tensor<1x4xi32>) -> tensor<1x4x1xi32>
      %23 = stablehlo.broadcast_in_dim %12, dims = [0, 2] : (tensor<1x4xi32>) -> tensor<1x1x4xi32>
      %24 = stablehlo.broadcast_in_dim %22, dims = [0, 1, 2] : (tensor<1x4x1xi32>) -> tensor<1x4x4xi32>
      %25 = stablehlo.broadcast_in_dim %23, dims = [0, 1, 2] : (tensor<1x1x4xi32>) -> tensor<1x4x4xi32>
      %26 = stablehlo.compare GE, %24, %25, SIGNED : (tensor<1x4x4xi32>, tensor<1x4x4xi32>) -> tensor<1x4x4xi1>
      %cst_5 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %27 = func.call @_where_2(%26, %21, %cst_5) : (tensor<1x4x4xi1>, tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4x4xf32>
      %cst_6 = stablehlo.constant dense<0xFF800000> : tensor<f32>
      %28 = stablehlo.reduce(%27 init: %cst_6) applies stablehlo.maximum across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %29 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %30 = stablehlo.broadcast_in_dim %29, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x4xf32>
      %31 = stablehlo.subtract %27, %30 : tensor<1x4x4xf32>
      %32 = stablehlo.exponential %31 : tensor<1x4x4xf32>
      %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %33 = stablehlo.reduce(%32 init: %cst_7) applies stablehlo.add across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %34 = stablehlo.dot_general %32, %arg7, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x4x4xf32>, tensor<1x4x2xf32>) -> tensor<1x4x2xf32>
      %35 = stablehlo.maximum %arg3, %28 : tensor<1x4xf32>
      %36 = stablehlo.subtract %arg3, %35 : tensor<1x4xf32>
      %37 = stablehlo.exponential %36 : tensor<1x4xf32>
      %38 = stablehlo.subtract %28, %35 : tensor<1x4xf32>
      %39 = stablehlo.exponential %38 : tensor<1x4xf32>
      %40 = stablehlo.multiply %arg4, %37 : tensor<1x4xf32>
      %41 = stablehlo.multiply %33, %39 : tensor<1x4xf32>
      %42 = stablehlo.add %40, %41 : tensor<1x4xf32>
      %43 = stablehlo.broadcast_in_dim %37, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %44 = stablehlo.broadcast_in_dim %43, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %45 = stablehlo.multiply %arg5, %44 : tensor<1x4x2xf32>
      %46 = stablehlo.broadcast_in_dim %39, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %47 = stablehlo.broadcast_in_dim %46, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %48 = stablehlo.multiply %34, %47 : tensor<1x4x2xf32>
      %49 = stablehlo.add %45, %48 : tensor<1x4x2xf32>
      stablehlo.return %35, %42, %49 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }) : (tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
    return %17#0, %17#1, %17#2 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
  }
  func.func private @closed_call_5(%arg0: tensor<i32>, %arg1: tensor<i32>, %arg2: tensor<1x4x2xf32>, %arg3: tensor<1x4xf32>, %arg4: tensor<1x4xf32>, %arg5: tensor<1x4x2xf32>, %arg6: tensor<1x4x2xf32>, %arg7: tensor<1x4x2xf32>, %arg8: tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>) {
    %c = stablehlo.constant dense<16> : tensor<i32>
    %0 = stablehlo.multiply %arg0, %c : tensor<i32>
    %c_0 = stablehlo.constant dense<12> : tensor<i32>
    %1 = stablehlo.add %0, %c_0 : tensor<i32>
    %c_1 = stablehlo.constant dense<16> : tensor<i32>
    %2 = stablehlo.multiply %arg1, %c_1 : tensor<i32>
    %c_2 = stablehlo.constant dense<4> : tensor<i32>
    %3 = stablehlo.multiply %arg8, %c_2 : tensor<i32>
    %4 = stablehlo.add %2, %3 : tensor<i32>
    %5 = stablehlo.iota dim = 0 : tensor<4xi32>
    %6 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %7 = stablehlo.add %6, %5 : tensor<4xi32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %9 = stablehlo.iota dim = 0 : tensor<4xi32>
    %10 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %11 = stablehlo.add %10, %9 : tensor<4xi32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %c_3 = stablehlo.constant dense<4> : tensor<i32>
    %13 = stablehlo.add %1, %c_3 : tensor<i32>
    %c_4 = stablehlo.constant dense<1> : tensor<i32>
    %14 = stablehlo.subtract %13, %c_4 : tensor<i32>
    %15 = stablehlo.compare GE, %14, %4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %16 = stablehlo.convert %15 : (tensor<i1>) -> tensor<i32>
    %17:3 = "stablehlo.case"(%16) ({
      stablehlo.return %arg3, %arg4, %arg5 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }, {
      %18 = stablehlo.dot_general %arg2, %arg6, batching_dims = [0] x [0], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1x4x2xf32>, tensor<1x4x2xf32>) -> tensor<1x4x4xf32>
      %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
      %19 = stablehlo.sqrt %cst : tensor<f32>
      %20 = stablehlo.broadcast_in_dim %19, dims = [] : (tensor<f32>) -> tensor<1x4x4xf32>
      %21 = stablehlo.divide %18, %20 : tensor<1x4x4xf32>
      %22 = stablehlo.broadcast_in_dim %8, dims = [0, 1] : (tensor<1x4xi32>) -> tensor<1x4x1xi32>
      %23 = stablehlo.broadcast_in_dim %12, dims = [0, 2] : (tensor<1x4xi32>) -> tensor<1x1x4xi32>
      %24 = stablehlo.broadcast_in_dim %22, dims = [0, 1, 2] : (tensor<1x4x1xi32>) -> tensor<1x4x4xi32>
      %25 = stablehlo.broadcast_in_dim %23, dims = [0, 1, 2] : (tensor<1x1x4xi32>) -> tensor<1x4x4xi32>
      %26 = stablehlo.compare GE, %24, %25, SIGNED : (tensor<1x4x4xi32>, tensor<1x4x4xi32>) -> tensor<1x4x4xi1>
      %cst_5 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %27 = func.call @_where_2(%26, %21, %cst_5) : (tensor<1x4x4xi1>, tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4x4xf32>
      %cst_6 = stablehlo.constant dense<0xFF800000> : tensor<f32>
      %28 = stablehlo.reduce(%27 init: %cst_6) applies stablehlo.maximum across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %29 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %30 = stablehlo.broadcast_in_dim %29, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x4xf32>
      %31 = stablehlo.subtract %27, %30 : tensor<1x4x4xf32>
      %32 = stablehlo.exponential %31 : tensor<1x4x4xf32>
      %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %33 = stablehlo.reduce(%32 init: %cst_7) applies stablehlo.add across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %34 = stablehlo.dot_general %32, %arg7, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x4x4xf32>, tensor<1x4x2xf32>) -> tensor<1x4x2xf32>
      %35 = stablehlo.maximum %arg3, %28 : tensor<1x4xf32>
      %36 = stablehlo.subtract %arg3, %35 : tensor<1x4xf32>
      %37 = stablehlo.exponential %36 : tensor<1x4xf32>
      %38 = stablehlo.subtract %28, %35 : tensor<1x4xf32>
      %39 = stablehlo.exponential %38 : tensor<1x4xf32>
      %40 = stablehlo.multiply %arg4, %37 : tensor<1x4xf32>
      %41 = stablehlo.multiply %33, %39 : tensor<1x4xf32>
      %42 = stablehlo.add %40, %41 : tensor<1x4xf32>
      %43 = stablehlo.broadcast_in_dim %37, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %44 = stablehlo.broadcast_in_dim %43, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %45 = stablehlo.multiply %arg5, %44 : tensor<1x4x2xf32>
      %46 = stablehlo.broadcast_in_dim %39, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %47 = stablehlo.broadcast_in_dim %46, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %48 = stablehlo.multiply %34, %47 : tensor<1x4x2xf32>
      %49 = stablehlo.add %45, %48 : tensor<1x4x2xf32>
      stablehlo.return %35, %42, %49 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }) : (tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
    return %17#0, %17#1, %17#2 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
  }
}

// -----

// 48 tokens: nothing is rewritten or inserted.
// CHECK-LABEL: func.func public @main
// CHECK-NOT:   shardfix
module @jit_body attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["dp"=1, "cp"=4]> {stablehlo.mesh = {axes = [{name = "dp", size = 1 : i64}, {name = "cp", size = 4 : i64}]}}
  func.func public @main(%arg0: tensor<1x48x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}, %arg1: tensor<1x48x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}, %arg2: tensor<1x48x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}) -> (tensor<1x48x2xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}) {
    // REPORT4: ring: {{.*}}skip-units.mlir:[[# @LINE + 3]]:10: axis "cp", striped{stripe=4}: not applied (sequence length 48 is not a multiple of cp*cp*stripe = 64){{$}}
    // REPORT-AUTO: ring: {{.*}}skip-units.mlir:[[# @LINE + 2]]:10: axis "cp", striped{stripe=4}: not applied (sequence length 48 is not a multiple of cp*cp*stripe = 64){{$}}
    // REPORT2: ring: {{.*}}skip-units.mlir:[[# @LINE + 1]]:10: axis "cp", striped{stripe=2}: not applied (sequence length 48 is not a multiple of cp*cp*stripe = 32){{$}}
    %0 = sdy.manual_computation(%arg0, %arg1, %arg2) in_shardings=[<@mesh, [{"dp"}, {"cp"}, {}]>, <@mesh, [{"dp"}, {"cp"}, {}]>, <@mesh, [{"dp"}, {"cp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}, {}]>] manual_axes={"dp", "cp"} (%arg3: tensor<1x12x2xf32>, %arg4: tensor<1x12x2xf32>, %arg5: tensor<1x12x2xf32>) {
      %c = stablehlo.constant dense<1> : tensor<ui32>
      %c_0 = stablehlo.constant dense<4> : tensor<ui32>
      %1 = stablehlo.partition_id : tensor<ui32>
      %2 = stablehlo.divide %1, %c : tensor<ui32>
      %3 = stablehlo.remainder %2, %c_0 : tensor<ui32>
      %4 = stablehlo.convert %3 : (tensor<ui32>) -> tensor<i32>
      %5 = stablehlo.reshape %arg3 : (tensor<1x12x2xf32>) -> tensor<1x3x4x2xf32>
      %6 = stablehlo.transpose %5, dims = [1, 0, 2, 3] : (tensor<1x3x4x2xf32>) -> tensor<3x1x4x2xf32>
      %7 = stablehlo.slice %arg3 [0:1, 0:12, 0:1] : (tensor<1x12x2xf32>) -> tensor<1x12x1xf32>
      %8 = stablehlo.reshape %7 : (tensor<1x12x1xf32>) -> tensor<1x12xf32>
      %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %9 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<1x12xf32>
      %10 = stablehlo.multiply %8, %9 : tensor<1x12xf32>
      %cst_1 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %11 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<1x12xf32>
      %12 = stablehlo.add %10, %11 : tensor<1x12xf32>
      %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %13 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1x12x2xf32>
      %14 = stablehlo.multiply %arg3, %13 : tensor<1x12x2xf32>
      %15 = stablehlo.iota dim = 0 : tensor<4xi32>
      %c_3 = stablehlo.constant dense<0> : tensor<i32>
      %16:9 = stablehlo.while(%iterArg = %15, %iterArg_4 = %4, %iterArg_5 = %6, %iterArg_6 = %c_3, %iterArg_7 = %12, %iterArg_8 = %10, %iterArg_9 = %14, %iterArg_10 = %arg4, %iterArg_11 = %arg5) : tensor<4xi32>, tensor<i32>, tensor<3x1x4x2xf32>, tensor<i32>, tensor<1x12xf32>, tensor<1x12xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>
      cond {
        %c_12 = stablehlo.constant dense<4> : tensor<i32>
        %20 = stablehlo.compare LT, %iterArg_6, %c_12, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %20 : tensor<i1>
      } do {
        %20 = func.call @dynamic_index_in_dim(%iterArg, %iterArg_6) : (tensor<4xi32>, tensor<i32>) -> tensor<i32>
        %21:5 = func.call @closed_call(%iterArg_4, %iterArg_5, %iterArg_7, %iterArg_8, %iterArg_9, %iterArg_10, %iterArg_11, %20) : (tensor<i32>, tensor<3x1x4x2xf32>, tensor<1x12xf32>, tensor<1x12xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>, tensor<i32>) -> (tensor<1x12xf32>, tensor<1x12xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>)
        %c_12 = stablehlo.constant dense<1> : tensor<i32>
        %22 = stablehlo.add %iterArg_6, %c_12 : tensor<i32>
        stablehlo.return %iterArg, %iterArg_4, %iterArg_5, %22, %21#0, %21#1, %21#2, %21#3, %21#4 : tensor<4xi32>, tensor<i32>, tensor<3x1x4x2xf32>, tensor<i32>, tensor<1x12xf32>, tensor<1x12xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>
      }
      %17 = stablehlo.broadcast_in_dim %16#5, dims = [0, 1] : (tensor<1x12xf32>) -> tensor<1x12x1xf32>
      %18 = stablehlo.broadcast_in_dim %17, dims = [0, 1, 2] : (tensor<1x12x1xf32>) -> tensor<1x12x2xf32>
      %19 = stablehlo.divide %16#6, %18 : tensor<1x12x2xf32>
      sdy.return %19 : tensor<1x12x2xf32>
    } : (tensor<1x48x2xf32>, tensor<1x48x2xf32>, tensor<1x48x2xf32>) -> tensor<1x48x2xf32>
    return %0 : tensor<1x48x2xf32>
  }
  func.func private @dynamic_index_in_dim(%arg0: tensor<4xi32>, %arg1: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.dynamic_slice %arg0, %arg1, sizes = [1] : (tensor<4xi32>, tensor<i32>) -> tensor<1xi32>
    %1 = stablehlo.reshape %0 : (tensor<1xi32>) -> tensor<i32>
    return %1 : tensor<i32>
  }
  func.func private @closed_call(%arg0: tensor<i32>, %arg1: tensor<3x1x4x2xf32>, %arg2: tensor<1x12xf32>, %arg3: tensor<1x12xf32>, %arg4: tensor<1x12x2xf32>, %arg5: tensor<1x12x2xf32>, %arg6: tensor<1x12x2xf32>, %arg7: tensor<i32>) -> (tensor<1x12xf32>, tensor<1x12xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>) {
    %0 = stablehlo.subtract %arg0, %arg7 : tensor<i32>
    %c = stablehlo.constant dense<4> : tensor<i32>
    %1 = call @remainder(%0, %c) : (tensor<i32>, tensor<i32>) -> tensor<i32>
    %2 = stablehlo.reshape %arg5 : (tensor<1x12x2xf32>) -> tensor<1x3x4x2xf32>
    %3 = stablehlo.transpose %2, dims = [1, 0, 2, 3] : (tensor<1x3x4x2xf32>) -> tensor<3x1x4x2xf32>
    %4 = stablehlo.reshape %arg6 : (tensor<1x12x2xf32>) -> tensor<1x3x4x2xf32>
    %5 = stablehlo.transpose %4, dims = [1, 0, 2, 3] : (tensor<1x3x4x2xf32>) -> tensor<3x1x4x2xf32>
    %6 = stablehlo.slice %arg2 [0:1, 0:4] : (tensor<1x12xf32>) -> tensor<1x4xf32>
    %7 = stablehlo.slice %arg3 [0:1, 0:4] : (tensor<1x12xf32>) -> tensor<1x4xf32>
    %8 = stablehlo.slice %arg4 [0:1, 0:4, 0:2] : (tensor<1x12x2xf32>) -> tensor<1x4x2xf32>
    %9 = stablehlo.slice %arg1 [0:1, 0:1, 0:4, 0:2] : (tensor<3x1x4x2xf32>) -> tensor<1x1x4x2xf32>
    %10 = stablehlo.reshape %9 : (tensor<1x1x4x2xf32>) -> tensor<1x4x2xf32>
    %11 = stablehlo.iota dim = 0 : tensor<3xi32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %12:10 = stablehlo.while(%iterArg = %3, %iterArg_3 = %5, %iterArg_4 = %11, %iterArg_5 = %arg0, %iterArg_6 = %1, %iterArg_7 = %10, %iterArg_8 = %c_0, %iterArg_9 = %6, %iterArg_10 = %7, %iterArg_11 = %8) : tensor<3x1x4x2xf32>, tensor<3x1x4x2xf32>, tensor<3xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    cond {
      %c_12 = stablehlo.constant dense<3> : tensor<i32>
      %32 = stablehlo.compare LT, %iterArg_8, %c_12, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %32 : tensor<i1>
    } do {
      %32 = func.call @dynamic_index_in_dim_0(%iterArg, %iterArg_8) : (tensor<3x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %33 = func.call @dynamic_index_in_dim_0(%iterArg_3, %iterArg_8) : (tensor<3x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %34 = func.call @dynamic_index_in_dim_1(%iterArg_4, %iterArg_8) : (tensor<3xi32>, tensor<i32>) -> tensor<i32>
      %35:3 = func.call @closed_call_2(%iterArg_5, %iterArg_6, %iterArg_7, %iterArg_9, %iterArg_10, %iterArg_11, %32, %33, %34) : (tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
      %c_12 = stablehlo.constant dense<1> : tensor<i32>
      %36 = stablehlo.add %iterArg_8, %c_12 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_3, %iterArg_4, %iterArg_5, %iterArg_6, %iterArg_7, %36, %35#0, %35#1, %35#2 : tensor<3x1x4x2xf32>, tensor<3x1x4x2xf32>, tensor<3xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }
    %13 = stablehlo.slice %arg2 [0:1, 4:8] : (tensor<1x12xf32>) -> tensor<1x4xf32>
    %14 = stablehlo.slice %arg3 [0:1, 4:8] : (tensor<1x12xf32>) -> tensor<1x4xf32>
    %15 = stablehlo.slice %arg4 [0:1, 4:8, 0:2] : (tensor<1x12x2xf32>) -> tensor<1x4x2xf32>
    %16 = stablehlo.slice %arg1 [1:2, 0:1, 0:4, 0:2] : (tensor<3x1x4x2xf32>) -> tensor<1x1x4x2xf32>
    %17 = stablehlo.reshape %16 : (tensor<1x1x4x2xf32>) -> tensor<1x4x2xf32>
    %18 = stablehlo.iota dim = 0 : tensor<3xi32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %19:10 = stablehlo.while(%iterArg = %3, %iterArg_3 = %5, %iterArg_4 = %18, %iterArg_5 = %arg0, %iterArg_6 = %1, %iterArg_7 = %17, %iterArg_8 = %c_1, %iterArg_9 = %13, %iterArg_10 = %14, %iterArg_11 = %15) : tensor<3x1x4x2xf32>, tensor<3x1x4x2xf32>, tensor<3xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    cond {
      %c_12 = stablehlo.constant dense<3> : tensor<i32>
      %32 = stablehlo.compare LT, %iterArg_8, %c_12, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %32 : tensor<i1>
    } do {
      %32 = func.call @dynamic_index_in_dim_0(%iterArg, %iterArg_8) : (tensor<3x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %33 = func.call @dynamic_index_in_dim_0(%iterArg_3, %iterArg_8) : (tensor<3x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %34 = func.call @dynamic_index_in_dim_1(%iterArg_4, %iterArg_8) : (tensor<3xi32>, tensor<i32>) -> tensor<i32>
      %35:3 = func.call @closed_call_4(%iterArg_5, %iterArg_6, %iterArg_7, %iterArg_9, %iterArg_10, %iterArg_11, %32, %33, %34) : (tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
      %c_12 = stablehlo.constant dense<1> : tensor<i32>
      %36 = stablehlo.add %iterArg_8, %c_12 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_3, %iterArg_4, %iterArg_5, %iterArg_6, %iterArg_7, %36, %35#0, %35#1, %35#2 : tensor<3x1x4x2xf32>, tensor<3x1x4x2xf32>, tensor<3xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }
    %20 = stablehlo.slice %arg2 [0:1, 8:12] : (tensor<1x12xf32>) -> tensor<1x4xf32>
    %21 = stablehlo.slice %arg3 [0:1, 8:12] : (tensor<1x12xf32>) -> tensor<1x4xf32>
    %22 = stablehlo.slice %arg4 [0:1, 8:12, 0:2] : (tensor<1x12x2xf32>) -> tensor<1x4x2xf32>
    %23 = stablehlo.slice %arg1 [2:3, 0:1, 0:4, 0:2] : (tensor<3x1x4x2xf32>) -> tensor<1x1x4x2xf32>
    %24 = stablehlo.reshape %23 : (tensor<1x1x4x2xf32>) -> tensor<1x4x2xf32>
    %25 = stablehlo.iota dim = 0 : tensor<3xi32>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %26:10 = stablehlo.while(%iterArg = %3, %iterArg_3 = %5, %iterArg_4 = %25, %iterArg_5 = %arg0, %iterArg_6 = %1, %iterArg_7 = %24, %iterArg_8 = %c_2, %iterArg_9 = %20, %iterArg_10 = %21, %iterArg_11 = %22) : tensor<3x1x4x2xf32>, tensor<3x1x4x2xf32>, tensor<3xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    cond {
      %c_12 = stablehlo.constant dense<3> : tensor<i32>
      %32 = stablehlo.compare LT, %iterArg_8, %c_12, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %32 : tensor<i1>
    } do {
      %32 = func.call @dynamic_index_in_dim_0(%iterArg, %iterArg_8) : (tensor<3x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %33 = func.call @dynamic_index_in_dim_0(%iterArg_3, %iterArg_8) : (tensor<3x1x4x2xf32>, tensor<i32>) -> tensor<1x4x2xf32>
      %34 = func.call @dynamic_index_in_dim_1(%iterArg_4, %iterArg_8) : (tensor<3xi32>, tensor<i32>) -> tensor<i32>
      %35:3 = func.call @closed_call_5(%iterArg_5, %iterArg_6, %iterArg_7, %iterArg_9, %iterArg_10, %iterArg_11, %32, %33, %34) : (tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
      %c_12 = stablehlo.constant dense<1> : tensor<i32>
      %36 = stablehlo.add %iterArg_8, %c_12 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_3, %iterArg_4, %iterArg_5, %iterArg_6, %iterArg_7, %36, %35#0, %35#1, %35#2 : tensor<3x1x4x2xf32>, tensor<3x1x4x2xf32>, tensor<3xi32>, tensor<i32>, tensor<i32>, tensor<1x4x2xf32>, tensor<i32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }
    %27 = stablehlo.concatenate %12#7, %19#7, %26#7, dim = 1 : (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4xf32>) -> tensor<1x12xf32>
    %28 = stablehlo.concatenate %12#8, %19#8, %26#8, dim = 1 : (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4xf32>) -> tensor<1x12xf32>
    %29 = stablehlo.concatenate %12#9, %19#9, %26#9, dim = 1 : (tensor<1x4x2xf32>, tensor<1x4x2xf32>, tensor<1x4x2xf32>) -> tensor<1x12x2xf32>
    %30 = "stablehlo.collective_permute"(%arg5) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<1x12x2xf32>) -> tensor<1x12x2xf32>
    %31 = "stablehlo.collective_permute"(%arg6) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<1x12x2xf32>) -> tensor<1x12x2xf32>
    return %27, %28, %29, %30, %31 : tensor<1x12xf32>, tensor<1x12xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>, tensor<1x12x2xf32>
  }
  func.func private @remainder(%arg0: tensor<i32>, %arg1: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.compare EQ, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %2 = call @_where(%1, %c_0, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %3 = stablehlo.remainder %arg0, %2 : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %4 = stablehlo.compare NE, %3, %c_1, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %5 = stablehlo.compare LT, %3, %c_2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %6 = stablehlo.compare LT, %2, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %7 = stablehlo.compare NE, %5, %6, UNSIGNED : (tensor<i1>, tensor<i1>) -> tensor<i1>
    %8 = stablehlo.and %7, %4 : tensor<i1>
    %9 = stablehlo.add %3, %2 : tensor<i32>
    %10 = stablehlo.select %8, %9, %3 : tensor<i1>, tensor<i32>
    return %10 : tensor<i32>
  }
  func.func private @_where(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @dynamic_index_in_dim_0(%arg0: tensor<3x1x4x2xf32>, %arg1: tensor<i32>) -> tensor<1x4x2xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, %c_0, %c_1, sizes = [1, 1, 4, 2] : (tensor<3x1x4x2xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4x2xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x1x4x2xf32>) -> tensor<1x4x2xf32>
    return %1 : tensor<1x4x2xf32>
  }
  func.func private @dynamic_index_in_dim_1(%arg0: tensor<3xi32>, %arg1: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.dynamic_slice %arg0, %arg1, sizes = [1] : (tensor<3xi32>, tensor<i32>) -> tensor<1xi32>
    %1 = stablehlo.reshape %0 : (tensor<1xi32>) -> tensor<i32>
    return %1 : tensor<i32>
  }
  func.func private @closed_call_2(%arg0: tensor<i32>, %arg1: tensor<i32>, %arg2: tensor<1x4x2xf32>, %arg3: tensor<1x4xf32>, %arg4: tensor<1x4xf32>, %arg5: tensor<1x4x2xf32>, %arg6: tensor<1x4x2xf32>, %arg7: tensor<1x4x2xf32>, %arg8: tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>) {
    %c = stablehlo.constant dense<12> : tensor<i32>
    %0 = stablehlo.multiply %arg0, %c : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.add %0, %c_0 : tensor<i32>
    %c_1 = stablehlo.constant dense<12> : tensor<i32>
    %2 = stablehlo.multiply %arg1, %c_1 : tensor<i32>
    %c_2 = stablehlo.constant dense<4> : tensor<i32>
    %3 = stablehlo.multiply %arg8, %c_2 : tensor<i32>
    %4 = stablehlo.add %2, %3 : tensor<i32>
    %5 = stablehlo.iota dim = 0 : tensor<4xi32>
    %6 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %7 = stablehlo.add %6, %5 : tensor<4xi32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %9 = stablehlo.iota dim = 0 : tensor<4xi32>
    %10 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %11 = stablehlo.add %10, %9 : tensor<4xi32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %c_3 = stablehlo.constant dense<4> : tensor<i32>
    %13 = stablehlo.add %1, %c_3 : tensor<i32>
    %c_4 = stablehlo.constant dense<1> : tensor<i32>
    %14 = stablehlo.subtract %13, %c_4 : tensor<i32>
    %15 = stablehlo.compare GE, %14, %4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %16 = stablehlo.convert %15 : (tensor<i1>) -> tensor<i32>
    // REPORT: ring: {{.*}}skip-units.mlir:[[# @LINE + 2]]:13: axis "cp", zigzag: not applied (not provably safe with zigzag: 'stablehlo.case' at {{.*}}skip-units.mlir:[[# @LINE + 2]]:13 reads positions of units of 4 tokens, which would straddle the two zigzag halves of the 12-token block (the half is 6 tokens)){{$}}
    // expected-remark @+1 {{reads positions of units of 4 tokens, which would straddle the two zigzag halves of the 12-token block (the half is 6 tokens))}}
    %17:3 = "stablehlo.case"(%16) ({
      stablehlo.return %arg3, %arg4, %arg5 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }, {
      %18 = stablehlo.dot_general %arg2, %arg6, batching_dims = [0] x [0], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1x4x2xf32>, tensor<1x4x2xf32>) -> tensor<1x4x4xf32>
      %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
      %19 = stablehlo.sqrt %cst : tensor<f32>
      %20 = stablehlo.broadcast_in_dim %19, dims = [] : (tensor<f32>) -> tensor<1x4x4xf32>
      %21 = stablehlo.divide %18, %20 : tensor<1x4x4xf32>
      %22 = stablehlo.broadcast_in_dim %8, dims = [0, 1] : (tensor<1x4xi32>) -> tensor<1x4x1xi32>
      %23 = stablehlo.broadcast_in_dim %12, dims = [0, 2] : (tensor<1x4xi32>) -> tensor<1x1x4xi32>
      %24 = stablehlo.broadcast_in_dim %22, dims = [0, 1, 2] : (tensor<1x4x1xi32>) -> tensor<1x4x4xi32>
      %25 = stablehlo.broadcast_in_dim %23, dims = [0, 1, 2] : (tensor<1x1x4xi32>) -> tensor<1x4x4xi32>
      %26 = stablehlo.compare GE, %24, %25, SIGNED : (tensor<1x4x4xi32>, tensor<1x4x4xi32>) -> tensor<1x4x4xi1>
      %cst_5 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %27 = func.call @_where_3(%26, %21, %cst_5) : (tensor<1x4x4xi1>, tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4x4xf32>
      %cst_6 = stablehlo.constant dense<0xFF800000> : tensor<f32>
      %28 = stablehlo.reduce(%27 init: %cst_6) applies stablehlo.maximum across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %29 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %30 = stablehlo.broadcast_in_dim %29, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x4xf32>
      %31 = stablehlo.subtract %27, %30 : tensor<1x4x4xf32>
      %32 = stablehlo.exponential %31 : tensor<1x4x4xf32>
      %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %33 = stablehlo.reduce(%32 init: %cst_7) applies stablehlo.add across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %34 = stablehlo.dot_general %32, %arg7, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x4x4xf32>, tensor<1x4x2xf32>) -> tensor<1x4x2xf32>
      %35 = stablehlo.maximum %arg3, %28 : tensor<1x4xf32>
      %36 = stablehlo.subtract %arg3, %35 : tensor<1x4xf32>
      %37 = stablehlo.exponential %36 : tensor<1x4xf32>
      %38 = stablehlo.subtract %28, %35 : tensor<1x4xf32>
      %39 = stablehlo.exponential %38 : tensor<1x4xf32>
      %40 = stablehlo.multiply %arg4, %37 : tensor<1x4xf32>
      %41 = stablehlo.multiply %33, %39 : tensor<1x4xf32>
      %42 = stablehlo.add %40, %41 : tensor<1x4xf32>
      %43 = stablehlo.broadcast_in_dim %37, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %44 = stablehlo.broadcast_in_dim %43, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %45 = stablehlo.multiply %arg5, %44 : tensor<1x4x2xf32>
      %46 = stablehlo.broadcast_in_dim %39, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %47 = stablehlo.broadcast_in_dim %46, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %48 = stablehlo.multiply %34, %47 : tensor<1x4x2xf32>
      %49 = stablehlo.add %45, %48 : tensor<1x4x2xf32>
      stablehlo.return %35, %42, %49 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }) : (tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
    return %17#0, %17#1, %17#2 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
  }
  func.func private @_where_3(%arg0: tensor<1x4x4xi1>, %arg1: tensor<1x4x4xf32>, %arg2: tensor<f32>) -> tensor<1x4x4xf32> {
    %0 = stablehlo.convert %arg2 : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<1x4x4xf32>
    %2 = stablehlo.select %arg0, %arg1, %1 : tensor<1x4x4xi1>, tensor<1x4x4xf32>
    return %2 : tensor<1x4x4xf32>
  }
  func.func private @closed_call_4(%arg0: tensor<i32>, %arg1: tensor<i32>, %arg2: tensor<1x4x2xf32>, %arg3: tensor<1x4xf32>, %arg4: tensor<1x4xf32>, %arg5: tensor<1x4x2xf32>, %arg6: tensor<1x4x2xf32>, %arg7: tensor<1x4x2xf32>, %arg8: tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>) {
    %c = stablehlo.constant dense<12> : tensor<i32>
    %0 = stablehlo.multiply %arg0, %c : tensor<i32>
    %c_0 = stablehlo.constant dense<4> : tensor<i32>
    %1 = stablehlo.add %0, %c_0 : tensor<i32>
    %c_1 = stablehlo.constant dense<12> : tensor<i32>
    %2 = stablehlo.multiply %arg1, %c_1 : tensor<i32>
    %c_2 = stablehlo.constant dense<4> : tensor<i32>
    %3 = stablehlo.multiply %arg8, %c_2 : tensor<i32>
    %4 = stablehlo.add %2, %3 : tensor<i32>
    %5 = stablehlo.iota dim = 0 : tensor<4xi32>
    %6 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %7 = stablehlo.add %6, %5 : tensor<4xi32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %9 = stablehlo.iota dim = 0 : tensor<4xi32>
    %10 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %11 = stablehlo.add %10, %9 : tensor<4xi32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %c_3 = stablehlo.constant dense<4> : tensor<i32>
    %13 = stablehlo.add %1, %c_3 : tensor<i32>
    %c_4 = stablehlo.constant dense<1> : tensor<i32>
    %14 = stablehlo.subtract %13, %c_4 : tensor<i32>
    %15 = stablehlo.compare GE, %14, %4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %16 = stablehlo.convert %15 : (tensor<i1>) -> tensor<i32>
    %17:3 = "stablehlo.case"(%16) ({
      stablehlo.return %arg3, %arg4, %arg5 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }, {
      %18 = stablehlo.dot_general %arg2, %arg6, batching_dims = [0] x [0], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1x4x2xf32>, tensor<1x4x2xf32>) -> tensor<1x4x4xf32>
      %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
      %19 = stablehlo.sqrt %cst : tensor<f32>
      %20 = stablehlo.broadcast_in_dim %19, dims = [] : (tensor<f32>) -> tensor<1x4x4xf32>
      %21 = stablehlo.divide %18, %20 : tensor<1x4x4xf32>
      %22 = stablehlo.broadcast_in_dim %8, dims = [0, 1] : (tensor<1x4xi32>) -> tensor<1x4x1xi32>
      %23 = stablehlo.broadcast_in_dim %12, dims = [0, 2] : (tensor<1x4xi32>) -> tensor<1x1x4xi32>
      %24 = stablehlo.broadcast_in_dim %22, dims = [0, 1, 2] : (tensor<1x4x1xi32>) -> tensor<1x4x4xi32>
      %25 = stablehlo.broadcast_in_dim %23, dims = [0, 1, 2] : (tensor<1x1x4xi32>) -> tensor<1x4x4xi32>
      %26 = stablehlo.compare GE, %24, %25, SIGNED : (tensor<1x4x4xi32>, tensor<1x4x4xi32>) -> tensor<1x4x4xi1>
      %cst_5 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %27 = func.call @_where_3(%26, %21, %cst_5) : (tensor<1x4x4xi1>, tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4x4xf32>
      %cst_6 = stablehlo.constant dense<0xFF800000> : tensor<f32>
      %28 = stablehlo.reduce(%27 init: %cst_6) applies stablehlo.maximum across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %29 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %30 = stablehlo.broadcast_in_dim %29, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x4xf32>
      %31 = stablehlo.subtract %27, %30 : tensor<1x4x4xf32>
      %32 = stablehlo.exponential %31 : tensor<1x4x4xf32>
      %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %33 = stablehlo.reduce(%32 init: %cst_7) applies stablehlo.add across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %34 = stablehlo.dot_general %32, %arg7, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x4x4xf32>, tensor<1x4x2xf32>) -> tensor<1x4x2xf32>
      %35 = stablehlo.maximum %arg3, %28 : tensor<1x4xf32>
      %36 = stablehlo.subtract %arg3, %35 : tensor<1x4xf32>
      %37 = stablehlo.exponential %36 : tensor<1x4xf32>
      %38 = stablehlo.subtract %28, %35 : tensor<1x4xf32>
      %39 = stablehlo.exponential %38 : tensor<1x4xf32>
      %40 = stablehlo.multiply %arg4, %37 : tensor<1x4xf32>
      %41 = stablehlo.multiply %33, %39 : tensor<1x4xf32>
      %42 = stablehlo.add %40, %41 : tensor<1x4xf32>
      %43 = stablehlo.broadcast_in_dim %37, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %44 = stablehlo.broadcast_in_dim %43, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %45 = stablehlo.multiply %arg5, %44 : tensor<1x4x2xf32>
      %46 = stablehlo.broadcast_in_dim %39, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %47 = stablehlo.broadcast_in_dim %46, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %48 = stablehlo.multiply %34, %47 : tensor<1x4x2xf32>
      %49 = stablehlo.add %45, %48 : tensor<1x4x2xf32>
      stablehlo.return %35, %42, %49 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }) : (tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
    return %17#0, %17#1, %17#2 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
  }
  func.func private @closed_call_5(%arg0: tensor<i32>, %arg1: tensor<i32>, %arg2: tensor<1x4x2xf32>, %arg3: tensor<1x4xf32>, %arg4: tensor<1x4xf32>, %arg5: tensor<1x4x2xf32>, %arg6: tensor<1x4x2xf32>, %arg7: tensor<1x4x2xf32>, %arg8: tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>) {
    %c = stablehlo.constant dense<12> : tensor<i32>
    %0 = stablehlo.multiply %arg0, %c : tensor<i32>
    %c_0 = stablehlo.constant dense<8> : tensor<i32>
    %1 = stablehlo.add %0, %c_0 : tensor<i32>
    %c_1 = stablehlo.constant dense<12> : tensor<i32>
    %2 = stablehlo.multiply %arg1, %c_1 : tensor<i32>
    %c_2 = stablehlo.constant dense<4> : tensor<i32>
    %3 = stablehlo.multiply %arg8, %c_2 : tensor<i32>
    %4 = stablehlo.add %2, %3 : tensor<i32>
    %5 = stablehlo.iota dim = 0 : tensor<4xi32>
    %6 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %7 = stablehlo.add %6, %5 : tensor<4xi32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %9 = stablehlo.iota dim = 0 : tensor<4xi32>
    %10 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<4xi32>
    %11 = stablehlo.add %10, %9 : tensor<4xi32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [1] : (tensor<4xi32>) -> tensor<1x4xi32>
    %c_3 = stablehlo.constant dense<4> : tensor<i32>
    %13 = stablehlo.add %1, %c_3 : tensor<i32>
    %c_4 = stablehlo.constant dense<1> : tensor<i32>
    %14 = stablehlo.subtract %13, %c_4 : tensor<i32>
    %15 = stablehlo.compare GE, %14, %4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %16 = stablehlo.convert %15 : (tensor<i1>) -> tensor<i32>
    %17:3 = "stablehlo.case"(%16) ({
      stablehlo.return %arg3, %arg4, %arg5 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }, {
      %18 = stablehlo.dot_general %arg2, %arg6, batching_dims = [0] x [0], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1x4x2xf32>, tensor<1x4x2xf32>) -> tensor<1x4x4xf32>
      %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
      %19 = stablehlo.sqrt %cst : tensor<f32>
      %20 = stablehlo.broadcast_in_dim %19, dims = [] : (tensor<f32>) -> tensor<1x4x4xf32>
      %21 = stablehlo.divide %18, %20 : tensor<1x4x4xf32>
      %22 = stablehlo.broadcast_in_dim %8, dims = [0, 1] : (tensor<1x4xi32>) -> tensor<1x4x1xi32>
      %23 = stablehlo.broadcast_in_dim %12, dims = [0, 2] : (tensor<1x4xi32>) -> tensor<1x1x4xi32>
      %24 = stablehlo.broadcast_in_dim %22, dims = [0, 1, 2] : (tensor<1x4x1xi32>) -> tensor<1x4x4xi32>
      %25 = stablehlo.broadcast_in_dim %23, dims = [0, 1, 2] : (tensor<1x1x4xi32>) -> tensor<1x4x4xi32>
      %26 = stablehlo.compare GE, %24, %25, SIGNED : (tensor<1x4x4xi32>, tensor<1x4x4xi32>) -> tensor<1x4x4xi1>
      %cst_5 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %27 = func.call @_where_3(%26, %21, %cst_5) : (tensor<1x4x4xi1>, tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4x4xf32>
      %cst_6 = stablehlo.constant dense<0xFF800000> : tensor<f32>
      %28 = stablehlo.reduce(%27 init: %cst_6) applies stablehlo.maximum across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %29 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %30 = stablehlo.broadcast_in_dim %29, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x4xf32>
      %31 = stablehlo.subtract %27, %30 : tensor<1x4x4xf32>
      %32 = stablehlo.exponential %31 : tensor<1x4x4xf32>
      %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %33 = stablehlo.reduce(%32 init: %cst_7) applies stablehlo.add across dimensions = [2] : (tensor<1x4x4xf32>, tensor<f32>) -> tensor<1x4xf32>
      %34 = stablehlo.dot_general %32, %arg7, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x4x4xf32>, tensor<1x4x2xf32>) -> tensor<1x4x2xf32>
      %35 = stablehlo.maximum %arg3, %28 : tensor<1x4xf32>
      %36 = stablehlo.subtract %arg3, %35 : tensor<1x4xf32>
      %37 = stablehlo.exponential %36 : tensor<1x4xf32>
      %38 = stablehlo.subtract %28, %35 : tensor<1x4xf32>
      %39 = stablehlo.exponential %38 : tensor<1x4xf32>
      %40 = stablehlo.multiply %arg4, %37 : tensor<1x4xf32>
      %41 = stablehlo.multiply %33, %39 : tensor<1x4xf32>
      %42 = stablehlo.add %40, %41 : tensor<1x4xf32>
      %43 = stablehlo.broadcast_in_dim %37, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %44 = stablehlo.broadcast_in_dim %43, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %45 = stablehlo.multiply %arg5, %44 : tensor<1x4x2xf32>
      %46 = stablehlo.broadcast_in_dim %39, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<1x4x1xf32>
      %47 = stablehlo.broadcast_in_dim %46, dims = [0, 1, 2] : (tensor<1x4x1xf32>) -> tensor<1x4x2xf32>
      %48 = stablehlo.multiply %34, %47 : tensor<1x4x2xf32>
      %49 = stablehlo.add %45, %48 : tensor<1x4x2xf32>
      stablehlo.return %35, %42, %49 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
    }) : (tensor<i32>) -> (tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>)
    return %17#0, %17#1, %17#2 : tensor<1x4xf32>, tensor<1x4xf32>, tensor<1x4x2xf32>
  }
}

// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=zigzag}' | FileCheck %s --check-prefix=ZIGZAG
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=striped}' | FileCheck %s --check-prefix=STRIPED
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=striped stripe=2}' | FileCheck %s --check-prefix=STRIPE2
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=zigzag}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT-Z
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=striped}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT-S
// RUN: %opt %s --split-input-file -p 'ring-reorder{strategy=striped stripe=2}' --report 2>&1 >/dev/null | FileCheck %s --check-prefix=REPORT-S2
// Positions computed from the device index, as JAX lowers `axis_index`: the kernel's global positions are
// `partition_id / 1 % 4 * 8 + iota` (queries, before the loop) and `((me - s) mod 4) * 8 + iota` (keys of the block
// visiting at ring step s, in the loop body's @closed_call, through jnp's floor-mod @remainder). They are right only
// for the contiguous layout; the analysis recognises them as c * n + j (ring coordinate c, n = 8 units of one token
// a device, local unit j) and the pass rewrites the one op that reads them (the causal mask's compare GE, both
// operands) to read the unit's position in the new order instead. The map sits right before the compare (its splat
// constants once per block and number, at the block's start):
//   zigzag (n/2 = 4):     c = v div 8, j = v rem 8, select(j < 4, c*4 + j, (2*4-1)*4 - c*4 + (j - 4))
//   striped, stripe s:    m = s units a stripe, ((j div m)*cp + c)*m + (j rem m)
// and q, k, v (sequence-sharded) are permuted, the result is restored. The second case (hand-written) shares the
// function that reads the positions between a region that is reordered and one that is not: the reads are rewritten
// in a copy for the first, the second keeps calling the original.
//
// Lowered with jax 0.10.2 (jax.jit(...).lower(...).as_text(), no debug info) from, on
// jax.make_mesh((1, 4), ("dp", "cp")) over 4 CPU devices, q, k, v of shape (1, 32, 2) sharded P("dp", "cp"):
//   def body(q, k, v):                       # jax.shard_map(body, mesh, in_specs=(P("dp", "cp"),) * 3, ...)
//     n, me = q.shape[1], jax.lax.axis_index("cp")
//     q_pos = me * n + jnp.arange(n)
//     def step(s, carry):
//       m0, l0, o0, k, v = carry
//       k_pos = ((me - s) % 4) * n + jnp.arange(n)
//       sc = jnp.where(q_pos[None, :, None] >= k_pos[None, None, :], jnp.einsum("bqd,bkd->bqk", q, k), -1e30)
//       ... online softmax merge into (m, l, o) ...
//       return m, l, o, ppermute(k, "cp", ring), ppermute(v, "cp", ring)
//     m, l, o, _, _ = jax.lax.fori_loop(0, 4, step, (q[..., 0] * 0 - 1e30, q[..., 0] * 0, q * 0, k, v))
//     return o / l[..., None]

// The three operands are permuted, the result is restored; the region is marked.
// ZIGZAG:      %0 = sdy.manual_computation(%arg0)
// ZIGZAG:      shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}
// ZIGZAG-NEXT: %1 = sdy.manual_computation(%arg1)
// ZIGZAG:      shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}
// ZIGZAG-NEXT: %2 = sdy.manual_computation(%arg2)
// ZIGZAG:      shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "zigzag", stripe = 1 : i64}
// ZIGZAG-NEXT: %[[R:.*]] = sdy.manual_computation(%0, %1, %2)
// The query positions before the loop are computed as before (only their reader changes).
// ZIGZAG:        %[[PID:.*]] = stablehlo.partition_id : tensor<ui32>
// ZIGZAG-NEXT:   %[[Q:.*]] = stablehlo.divide %[[PID]], %c : tensor<ui32>
// ZIGZAG-NEXT:   %[[C:.*]] = stablehlo.remainder %[[Q]], %c_0 : tensor<ui32>
// ZIGZAG-NEXT:   %[[CI:.*]] = stablehlo.convert %[[C]] : (tensor<ui32>) -> tensor<i32>
// ZIGZAG-NEXT:   %c_1 = stablehlo.constant dense<8> : tensor<i32>
// ZIGZAG-NEXT:   %[[START:.*]] = stablehlo.multiply %[[CI]], %c_1 : tensor<i32>
// ZIGZAG:      } {shardfix.ring_reorder = "zigzag"}
// ZIGZAG-NEXT: sdy.manual_computation(%[[R]])
// ZIGZAG:      shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = true, strategy = "zigzag", stripe = 1 : i64}
// ZIGZAG-NOT:  shardfix.sequence_permutation
// The key positions are still ((me - s) mod 4) * 8 + iota; the compare reads both through the zigzag map.
// ZIGZAG-LABEL: func.func private @closed_call
// ZIGZAG-DAG:    %[[TOP:.*]] = stablehlo.constant dense<28> : tensor<i32>
// ZIGZAG-DAG:    %[[TOPB:.*]] = stablehlo.broadcast_in_dim %[[TOP]], dims = [] : (tensor<i32>) -> tensor<1x8x8xi32>
// ZIGZAG-DAG:    %[[HALF:.*]] = stablehlo.constant dense<4> : tensor<i32>
// ZIGZAG-DAG:    %[[HALFB:.*]] = stablehlo.broadcast_in_dim %[[HALF]], dims = [] : (tensor<i32>) -> tensor<1x8x8xi32>
// ZIGZAG:        %[[KSTART:.*]] = stablehlo.multiply %{{.*}}, %{{.*}} : tensor<i32>
// ZIGZAG-NEXT:   %[[IOTA:.*]] = stablehlo.iota dim = 0 : tensor<8xi32>
// ZIGZAG-NEXT:   %[[KB:.*]] = stablehlo.broadcast_in_dim %[[KSTART]], dims = [] : (tensor<i32>) -> tensor<8xi32>
// ZIGZAG-NEXT:   %[[KPOS:.*]] = stablehlo.add %[[KB]], %[[IOTA]] : tensor<8xi32>
// ZIGZAG-NEXT:   %[[S:.*]] = stablehlo.dot_general
// ZIGZAG-NEXT:   %[[QB:.*]] = stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<8xi32>) -> tensor<1x8x1xi32>
// ZIGZAG-NEXT:   %[[KB2:.*]] = stablehlo.broadcast_in_dim %[[KPOS]], dims = [2] : (tensor<8xi32>) -> tensor<1x1x8xi32>
// ZIGZAG-NEXT:   %[[QV:.*]] = stablehlo.broadcast_in_dim %[[QB]], dims = [0, 1, 2] : (tensor<1x8x1xi32>) -> tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[KV:.*]] = stablehlo.broadcast_in_dim %[[KB2]], dims = [0, 1, 2] : (tensor<1x1x8xi32>) -> tensor<1x8x8xi32>
// Query positions: c = v div 8, j = v rem 8.
// ZIGZAG-NEXT:   %[[QC:.*]] = stablehlo.divide %[[QV]], %{{.*}} : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[QJ:.*]] = stablehlo.remainder %[[QV]], %{{.*}} : tensor<1x8x8xi32>
// First half: c*4 + j.
// ZIGZAG-NEXT:   %[[QC4:.*]] = stablehlo.multiply %[[QC]], %{{.*}} : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[QLO:.*]] = stablehlo.add %[[QC4]], %[[QJ]] : tensor<1x8x8xi32>
// Second half: (2cp-1)*4 - c*4 + (j - 4) = 28 - c*4 + (j - 4).
// ZIGZAG-NEXT:   %[[QC4B:.*]] = stablehlo.multiply %[[QC]], %{{.*}} : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[MIRROR:.*]] = stablehlo.subtract %[[TOPB]], %[[QC4B]] : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[QJ4:.*]] = stablehlo.subtract %[[QJ]], %{{.*}} : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[QHI:.*]] = stablehlo.add %[[MIRROR]], %[[QJ4]] : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[QFIRST:.*]] = stablehlo.compare LT, %[[QJ]], %[[HALFB]] : (tensor<1x8x8xi32>, tensor<1x8x8xi32>) -> tensor<1x8x8xi1>
// ZIGZAG-NEXT:   %[[QNEW:.*]] = stablehlo.select %[[QFIRST]], %[[QLO]], %[[QHI]] : tensor<1x8x8xi1>, tensor<1x8x8xi32>
// Key positions: the same map.
// ZIGZAG-NEXT:   %[[KC:.*]] = stablehlo.divide %[[KV]], %{{.*}} : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[KJ:.*]] = stablehlo.remainder %[[KV]], %{{.*}} : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[KC4:.*]] = stablehlo.multiply %[[KC]], %{{.*}} : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[KLO:.*]] = stablehlo.add %[[KC4]], %[[KJ]] : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[KC4B:.*]] = stablehlo.multiply %[[KC]], %{{.*}} : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[KMIRROR:.*]] = stablehlo.subtract %{{.*}}, %[[KC4B]] : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[KJ4:.*]] = stablehlo.subtract %[[KJ]], %{{.*}} : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[KHI:.*]] = stablehlo.add %[[KMIRROR]], %[[KJ4]] : tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[KFIRST:.*]] = stablehlo.compare LT, %[[KJ]], %[[HALFB]] : (tensor<1x8x8xi32>, tensor<1x8x8xi32>) -> tensor<1x8x8xi1>
// ZIGZAG-NEXT:   %[[KNEW:.*]] = stablehlo.select %[[KFIRST]], %[[KLO]], %[[KHI]] : tensor<1x8x8xi1>, tensor<1x8x8xi32>
// ZIGZAG-NEXT:   %[[MASK:.*]] = stablehlo.compare GE, %[[QNEW]], %[[KNEW]], SIGNED : (tensor<1x8x8xi32>, tensor<1x8x8xi32>) -> tensor<1x8x8xi1>
// ZIGZAG-NEXT:   %[[NEG:.*]] = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
// ZIGZAG-NEXT:   %{{.*}} = call @_where_0(%[[MASK]], %[[S]], %[[NEG]])
// Nothing else is rewritten.
// ZIGZAG-NOT:    stablehlo.select
// ZIGZAG-LABEL: func.func private @remainder

// Striped, stripe 1 (m = 1): ((j div 1)*4 + c)*1 + (j rem 1) = j*4 + c + 0.
// STRIPED:      shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "striped", stripe = 1 : i64}
// STRIPED:      shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "striped", stripe = 1 : i64}
// STRIPED:      shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = false, strategy = "striped", stripe = 1 : i64}
// STRIPED:      {shardfix.ring_reorder = "striped{stripe=1}"}
// STRIPED:      shardfix.sequence_permutation = {axis = "cp", dim = 1 : i64, inverse = true, strategy = "striped", stripe = 1 : i64}
// STRIPED-LABEL: func.func private @closed_call
// STRIPED:        %[[QV:.*]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [0, 1, 2] : (tensor<1x8x1xi32>) -> tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[KV:.*]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [0, 1, 2] : (tensor<1x1x8xi32>) -> tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[QC:.*]] = stablehlo.divide %[[QV]], %{{.*}} : tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[QJ:.*]] = stablehlo.remainder %[[QV]], %{{.*}} : tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[QJ4:.*]] = stablehlo.multiply %[[QJ]], %{{.*}} : tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[QU:.*]] = stablehlo.add %[[QJ4]], %[[QC]] : tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[QNEW:.*]] = stablehlo.add %[[QU]], %{{.*}} : tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[KC:.*]] = stablehlo.divide %[[KV]], %{{.*}} : tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[KJ:.*]] = stablehlo.remainder %[[KV]], %{{.*}} : tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[KJ4:.*]] = stablehlo.multiply %[[KJ]], %{{.*}} : tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[KU:.*]] = stablehlo.add %[[KJ4]], %[[KC]] : tensor<1x8x8xi32>
// STRIPED-NEXT:   %[[KNEW:.*]] = stablehlo.add %[[KU]], %{{.*}} : tensor<1x8x8xi32>
// STRIPED-NEXT:   stablehlo.compare GE, %[[QNEW]], %[[KNEW]], SIGNED : (tensor<1x8x8xi32>, tensor<1x8x8xi32>) -> tensor<1x8x8xi1>

// Striped, stripe 2 (m = 2): ((j div 2)*4 + c)*2 + (j rem 2).
// STRIPE2:      {shardfix.ring_reorder = "striped{stripe=2}"}
// STRIPE2-LABEL: func.func private @closed_call
// STRIPE2:        %[[QV:.*]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [0, 1, 2] : (tensor<1x8x1xi32>) -> tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[KV:.*]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [0, 1, 2] : (tensor<1x1x8xi32>) -> tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[QC:.*]] = stablehlo.divide %[[QV]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[QJ:.*]] = stablehlo.remainder %[[QV]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[QS:.*]] = stablehlo.divide %[[QJ]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[QS4:.*]] = stablehlo.multiply %[[QS]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[QSC:.*]] = stablehlo.add %[[QS4]], %[[QC]] : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[QT:.*]] = stablehlo.multiply %[[QSC]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[QM:.*]] = stablehlo.remainder %[[QJ]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[QNEW:.*]] = stablehlo.add %[[QT]], %[[QM]] : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[KC:.*]] = stablehlo.divide %[[KV]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[KJ:.*]] = stablehlo.remainder %[[KV]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[KS:.*]] = stablehlo.divide %[[KJ]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[KS4:.*]] = stablehlo.multiply %[[KS]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[KSC:.*]] = stablehlo.add %[[KS4]], %[[KC]] : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[KT:.*]] = stablehlo.multiply %[[KSC]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[KM:.*]] = stablehlo.remainder %[[KJ]], %{{.*}} : tensor<1x8x8xi32>
// STRIPE2-NEXT:   %[[KNEW:.*]] = stablehlo.add %[[KT]], %[[KM]] : tensor<1x8x8xi32>
// STRIPE2-NEXT:   stablehlo.compare GE, %[[QNEW]], %[[KNEW]], SIGNED : (tensor<1x8x8xi32>, tensor<1x8x8xi32>) -> tensor<1x8x8xi1>

module @jit_body attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["dp"=1, "cp"=4]> {stablehlo.mesh = {axes = [{name = "dp", size = 1 : i64}, {name = "cp", size = 4 : i64}]}}
  func.func public @main(%arg0: tensor<1x32x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}, %arg1: tensor<1x32x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}, %arg2: tensor<1x32x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}) -> (tensor<1x32x2xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"dp"}, {"cp"}, {}]>}) {
    // REPORT-Z: ring: {{.*}}positions.mlir:[[# @LINE + 3]]:10: axis "cp", zigzag: applied (3 operand(s) reordered, 1 result(s) restored, 2 position read(s) rewritten){{$}}
    // REPORT-S: ring: {{.*}}positions.mlir:[[# @LINE + 2]]:10: axis "cp", striped{stripe=1}: applied (3 operand(s) reordered, 1 result(s) restored, 2 position read(s) rewritten){{$}}
    // REPORT-S2: ring: {{.*}}positions.mlir:[[# @LINE + 1]]:10: axis "cp", striped{stripe=2}: applied (3 operand(s) reordered, 1 result(s) restored, 2 position read(s) rewritten){{$}}
    %0 = sdy.manual_computation(%arg0, %arg1, %arg2) in_shardings=[<@mesh, [{"dp"}, {"cp"}, {}]>, <@mesh, [{"dp"}, {"cp"}, {}]>, <@mesh, [{"dp"}, {"cp"}, {}]>] out_shardings=[<@mesh, [{"dp"}, {"cp"}, {}]>] manual_axes={"dp", "cp"} (%arg3: tensor<1x8x2xf32>, %arg4: tensor<1x8x2xf32>, %arg5: tensor<1x8x2xf32>) {
      %c = stablehlo.constant dense<1> : tensor<ui32>
      %c_0 = stablehlo.constant dense<4> : tensor<ui32>
      %1 = stablehlo.partition_id : tensor<ui32>
      %2 = stablehlo.divide %1, %c : tensor<ui32>
      %3 = stablehlo.remainder %2, %c_0 : tensor<ui32>
      %4 = stablehlo.convert %3 : (tensor<ui32>) -> tensor<i32>
      %c_1 = stablehlo.constant dense<8> : tensor<i32>
      %5 = stablehlo.multiply %4, %c_1 : tensor<i32>
      %6 = stablehlo.iota dim = 0 : tensor<8xi32>
      %7 = stablehlo.broadcast_in_dim %5, dims = [] : (tensor<i32>) -> tensor<8xi32>
      %8 = stablehlo.add %7, %6 : tensor<8xi32>
      %9 = stablehlo.slice %arg3 [0:1, 0:8, 0:1] : (tensor<1x8x2xf32>) -> tensor<1x8x1xf32>
      %10 = stablehlo.reshape %9 : (tensor<1x8x1xf32>) -> tensor<1x8xf32>
      %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %11 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<1x8xf32>
      %12 = stablehlo.multiply %10, %11 : tensor<1x8xf32>
      %cst_2 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %13 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1x8xf32>
      %14 = stablehlo.add %12, %13 : tensor<1x8xf32>
      %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %15 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<1x8x2xf32>
      %16 = stablehlo.multiply %arg3, %15 : tensor<1x8x2xf32>
      %c_4 = stablehlo.constant dense<0> : tensor<i32>
      %c_5 = stablehlo.constant dense<0> : tensor<i32>
      %17:10 = stablehlo.while(%iterArg = %4, %iterArg_6 = %arg3, %iterArg_7 = %8, %iterArg_8 = %c_5, %iterArg_9 = %c_4, %iterArg_10 = %14, %iterArg_11 = %12, %iterArg_12 = %16, %iterArg_13 = %arg4, %iterArg_14 = %arg5) : tensor<i32>, tensor<1x8x2xf32>, tensor<8xi32>, tensor<i32>, tensor<i32>, tensor<1x8xf32>, tensor<1x8xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>
      cond {
        %c_15 = stablehlo.constant dense<4> : tensor<i32>
        %21 = stablehlo.compare LT, %iterArg_8, %c_15, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %21 : tensor<i1>
      } do {
        %21:6 = func.call @closed_call(%iterArg, %iterArg_6, %iterArg_7, %iterArg_9, %iterArg_10, %iterArg_11, %iterArg_12, %iterArg_13, %iterArg_14) : (tensor<i32>, tensor<1x8x2xf32>, tensor<8xi32>, tensor<i32>, tensor<1x8xf32>, tensor<1x8xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>) -> (tensor<i32>, tensor<1x8xf32>, tensor<1x8xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>)
        %c_15 = stablehlo.constant dense<1> : tensor<i32>
        %22 = stablehlo.add %iterArg_8, %c_15 : tensor<i32>
        stablehlo.return %iterArg, %iterArg_6, %iterArg_7, %22, %21#0, %21#1, %21#2, %21#3, %21#4, %21#5 : tensor<i32>, tensor<1x8x2xf32>, tensor<8xi32>, tensor<i32>, tensor<i32>, tensor<1x8xf32>, tensor<1x8xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>
      }
      %18 = stablehlo.broadcast_in_dim %17#6, dims = [0, 1] : (tensor<1x8xf32>) -> tensor<1x8x1xf32>
      %19 = stablehlo.broadcast_in_dim %18, dims = [0, 1, 2] : (tensor<1x8x1xf32>) -> tensor<1x8x2xf32>
      %20 = stablehlo.divide %17#7, %19 : tensor<1x8x2xf32>
      sdy.return %20 : tensor<1x8x2xf32>
    } : (tensor<1x32x2xf32>, tensor<1x32x2xf32>, tensor<1x32x2xf32>) -> tensor<1x32x2xf32>
    return %0 : tensor<1x32x2xf32>
  }
  func.func private @closed_call(%arg0: tensor<i32>, %arg1: tensor<1x8x2xf32>, %arg2: tensor<8xi32>, %arg3: tensor<i32>, %arg4: tensor<1x8xf32>, %arg5: tensor<1x8xf32>, %arg6: tensor<1x8x2xf32>, %arg7: tensor<1x8x2xf32>, %arg8: tensor<1x8x2xf32>) -> (tensor<i32>, tensor<1x8xf32>, tensor<1x8xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>) {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %0 = stablehlo.add %arg3, %c : tensor<i32>
    %1 = stablehlo.convert %arg3 : tensor<i32>
    %2 = stablehlo.subtract %arg0, %1 : tensor<i32>
    %c_0 = stablehlo.constant dense<4> : tensor<i32>
    %3 = call @remainder(%2, %c_0) : (tensor<i32>, tensor<i32>) -> tensor<i32>
    %c_1 = stablehlo.constant dense<8> : tensor<i32>
    %4 = stablehlo.multiply %3, %c_1 : tensor<i32>
    %5 = stablehlo.iota dim = 0 : tensor<8xi32>
    %6 = stablehlo.broadcast_in_dim %4, dims = [] : (tensor<i32>) -> tensor<8xi32>
    %7 = stablehlo.add %6, %5 : tensor<8xi32>
    %8 = stablehlo.dot_general %arg1, %arg7, batching_dims = [0] x [0], contracting_dims = [2] x [2], precision = [DEFAULT, DEFAULT] : (tensor<1x8x2xf32>, tensor<1x8x2xf32>) -> tensor<1x8x8xf32>
    %9 = stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<8xi32>) -> tensor<1x8x1xi32>
    %10 = stablehlo.broadcast_in_dim %7, dims = [2] : (tensor<8xi32>) -> tensor<1x1x8xi32>
    %11 = stablehlo.broadcast_in_dim %9, dims = [0, 1, 2] : (tensor<1x8x1xi32>) -> tensor<1x8x8xi32>
    %12 = stablehlo.broadcast_in_dim %10, dims = [0, 1, 2] : (tensor<1x1x8xi32>) -> tensor<1x8x8xi32>
    %13 = stablehlo.compare GE, %11, %12, SIGNED : (tensor<1x8x8xi32>, tensor<1x8x8xi32>) -> tensor<1x8x8xi1>
    %cst = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
    %14 = call @_where_0(%13, %8, %cst) : (tensor<1x8x8xi1>, tensor<1x8x8xf32>, tensor<f32>) -> tensor<1x8x8xf32>
    %cst_2 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %15 = stablehlo.reduce(%14 init: %cst_2) applies stablehlo.maximum across dimensions = [2] : (tensor<1x8x8xf32>, tensor<f32>) -> tensor<1x8xf32>
    %16 = stablehlo.broadcast_in_dim %15, dims = [0, 1] : (tensor<1x8xf32>) -> tensor<1x8x1xf32>
    %17 = stablehlo.broadcast_in_dim %16, dims = [0, 1, 2] : (tensor<1x8x1xf32>) -> tensor<1x8x8xf32>
    %18 = stablehlo.subtract %14, %17 : tensor<1x8x8xf32>
    %19 = stablehlo.exponential %18 : tensor<1x8x8xf32>
    %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %20 = stablehlo.reduce(%19 init: %cst_3) applies stablehlo.add across dimensions = [2] : (tensor<1x8x8xf32>, tensor<f32>) -> tensor<1x8xf32>
    %21 = stablehlo.dot_general %19, %arg8, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x8x8xf32>, tensor<1x8x2xf32>) -> tensor<1x8x2xf32>
    %22 = stablehlo.maximum %arg4, %15 : tensor<1x8xf32>
    %23 = stablehlo.subtract %arg4, %22 : tensor<1x8xf32>
    %24 = stablehlo.exponential %23 : tensor<1x8xf32>
    %25 = stablehlo.subtract %15, %22 : tensor<1x8xf32>
    %26 = stablehlo.exponential %25 : tensor<1x8xf32>
    %27 = stablehlo.multiply %arg5, %24 : tensor<1x8xf32>
    %28 = stablehlo.multiply %20, %26 : tensor<1x8xf32>
    %29 = stablehlo.add %27, %28 : tensor<1x8xf32>
    %30 = stablehlo.broadcast_in_dim %24, dims = [0, 1] : (tensor<1x8xf32>) -> tensor<1x8x1xf32>
    %31 = stablehlo.broadcast_in_dim %30, dims = [0, 1, 2] : (tensor<1x8x1xf32>) -> tensor<1x8x2xf32>
    %32 = stablehlo.multiply %arg6, %31 : tensor<1x8x2xf32>
    %33 = stablehlo.broadcast_in_dim %26, dims = [0, 1] : (tensor<1x8xf32>) -> tensor<1x8x1xf32>
    %34 = stablehlo.broadcast_in_dim %33, dims = [0, 1, 2] : (tensor<1x8x1xf32>) -> tensor<1x8x2xf32>
    %35 = stablehlo.multiply %21, %34 : tensor<1x8x2xf32>
    %36 = stablehlo.add %32, %35 : tensor<1x8x2xf32>
    %37 = "stablehlo.collective_permute"(%arg7) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<1x8x2xf32>) -> tensor<1x8x2xf32>
    %38 = "stablehlo.collective_permute"(%arg8) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<1x8x2xf32>) -> tensor<1x8x2xf32>
    return %0, %22, %29, %36, %37, %38 : tensor<i32>, tensor<1x8xf32>, tensor<1x8xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>, tensor<1x8x2xf32>
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
  func.func private @_where_0(%arg0: tensor<1x8x8xi1>, %arg1: tensor<1x8x8xf32>, %arg2: tensor<f32>) -> tensor<1x8x8xf32> {
    %0 = stablehlo.convert %arg2 : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<1x8x8xf32>
    %2 = stablehlo.select %arg0, %arg1, %1 : tensor<1x8x8xi1>, tensor<1x8x8xf32>
    return %2 : tensor<1x8x8xf32>
  }
}

// -----

// @first_six keeps the tokens whose global position (c * 4 + iota, from the device index) is below 6. The first
// region (a total-sum of the kept tokens, proved) is reordered and calls a copy whose compare reads the zigzag map
// (4 tokens a device, halves of 2: select(j < 2, c*2 + j, 14 - c*2 + (j - 2))); the second (own tokens plus the
// neighbour's, refused) still calls the original, unchanged.
// ZIGZAG-LABEL: func.func private @first_six(
// ZIGZAG-NEXT:    %[[IOTA:.*]] = stablehlo.iota dim = 0 : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[START:.*]] = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<i32>) -> tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[POS:.*]] = stablehlo.add %[[START]], %[[IOTA]] : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[SIX:.*]] = stablehlo.constant dense<6> : tensor<4x8xi32>
// ZIGZAG-NEXT:    %{{.*}} = stablehlo.compare LT, %[[POS]], %[[SIX]], SIGNED : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<4x8xi1>
// ZIGZAG-LABEL: func.func private @first_six_{{[a-z0-9_]+}}(
// ZIGZAG:         %[[POS:.*]] = stablehlo.add %{{.*}}, %{{.*}} : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[SIX:.*]] = stablehlo.constant dense<6> : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[C:.*]] = stablehlo.divide %[[POS]], %{{.*}} : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[J:.*]] = stablehlo.remainder %[[POS]], %{{.*}} : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[C2:.*]] = stablehlo.multiply %[[C]], %{{.*}} : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[LO:.*]] = stablehlo.add %[[C2]], %[[J]] : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[C2B:.*]] = stablehlo.multiply %[[C]], %{{.*}} : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[M:.*]] = stablehlo.subtract %{{.*}}, %[[C2B]] : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[J2:.*]] = stablehlo.subtract %[[J]], %{{.*}} : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[HI:.*]] = stablehlo.add %[[M]], %[[J2]] : tensor<4x8xi32>
// ZIGZAG-NEXT:    %[[FIRST:.*]] = stablehlo.compare LT, %[[J]], %{{.*}} : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<4x8xi1>
// ZIGZAG-NEXT:    %[[NEW:.*]] = stablehlo.select %[[FIRST]], %[[LO]], %[[HI]] : tensor<4x8xi1>, tensor<4x8xi32>
// ZIGZAG-NEXT:    %{{.*}} = stablehlo.compare LT, %[[NEW]], %[[SIX]], SIGNED : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<4x8xi1>
// ZIGZAG-LABEL: func.func @shared(
// ZIGZAG:         func.call @first_six_{{[a-z0-9_]+}}(
// ZIGZAG:         } {shardfix.ring_reorder = "zigzag"}
// ZIGZAG:         func.call @first_six(
// ZIGZAG-NOT:     shardfix.ring_reorder
sdy.mesh @mesh = <["cp"=4]>

func.func private @first_six(%x: tensor<4x8xf32>, %start: tensor<i32>) -> tensor<4x8xf32> {
  %iota = stablehlo.iota dim = 0 : tensor<4x8xi32>
  %b = stablehlo.broadcast_in_dim %start, dims = [] : (tensor<i32>) -> tensor<4x8xi32>
  %pos = stablehlo.add %b, %iota : tensor<4x8xi32>
  %six = stablehlo.constant dense<6> : tensor<4x8xi32>
  %keep = stablehlo.compare LT, %pos, %six, SIGNED : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<4x8xi1>
  %zero = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  %y = stablehlo.select %keep, %x, %zero : tensor<4x8xi1>, tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// REPORT-Z: ring: {{.*}}positions.mlir:[[# @LINE + 36]]:10: axis "cp", zigzag: not applied (not provably safe: 'stablehlo.add' at {{.*}}positions.mlir:[[# @LINE + 36]]:10 combines data of different tokens (blocks or positions) elementwise){{$}}
// REPORT-Z-NEXT: ring: {{.*}}positions.mlir:[[# @LINE + 2]]:8: axis "cp", zigzag: applied (1 operand(s) reordered, 1 result(s) restored, 1 position read(s) rewritten){{$}}
func.func @shared(%arg0: tensor<16x8xf32>, %arg1: tensor<16x8xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  %0 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %id = stablehlo.partition_id : tensor<ui32>
    %one = stablehlo.constant dense<1> : tensor<ui32>
    %four = stablehlo.constant dense<4> : tensor<ui32>
    %q = stablehlo.divide %id, %one : tensor<ui32>
    %me = stablehlo.remainder %q, %four : tensor<ui32>
    %mi = stablehlo.convert %me : (tensor<ui32>) -> tensor<i32>
    %n = stablehlo.constant dense<4> : tensor<i32>
    %start = stablehlo.multiply %mi, %n : tensor<i32>
    %m = func.call @first_six(%x, %start) : (tensor<4x8xf32>, tensor<i32>) -> tensor<4x8xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%m init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4x8xf32>, tensor<f32>) -> tensor<8xf32>
    %p1 = "stablehlo.collective_permute"(%s) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p2 = "stablehlo.collective_permute"(%p1) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %p3 = "stablehlo.collective_permute"(%p2) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<8xf32>) -> tensor<8xf32>
    %t1 = stablehlo.add %s, %p1 : tensor<8xf32>
    %t2 = stablehlo.add %t1, %p2 : tensor<8xf32>
    %t = stablehlo.add %t2, %p3 : tensor<8xf32>
    %b = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %b : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> tensor<16x8xf32>
  %1 = sdy.manual_computation(%arg1) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%x: tensor<4x8xf32>) {
    %id = stablehlo.partition_id : tensor<ui32>
    %one = stablehlo.constant dense<1> : tensor<ui32>
    %four = stablehlo.constant dense<4> : tensor<ui32>
    %q = stablehlo.divide %id, %one : tensor<ui32>
    %me = stablehlo.remainder %q, %four : tensor<ui32>
    %mi = stablehlo.convert %me : (tensor<ui32>) -> tensor<i32>
    %n = stablehlo.constant dense<4> : tensor<i32>
    %start = stablehlo.multiply %mi, %n : tensor<i32>
    %m = func.call @first_six(%x, %start) : (tensor<4x8xf32>, tensor<i32>) -> tensor<4x8xf32>
    %p1 = "stablehlo.collective_permute"(%m) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %y = stablehlo.add %x, %p1 : tensor<4x8xf32>
    sdy.return %y : tensor<4x8xf32>
  } : (tensor<16x8xf32>) -> (tensor<16x8xf32>)
  return %0, %1 : tensor<16x8xf32>, tensor<16x8xf32>
}

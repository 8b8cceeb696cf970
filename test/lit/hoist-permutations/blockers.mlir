// RUN: %opt %s --split-input-file --verify-diagnostics -p "ring-reorder{mode=force},hoist-permutations"
// Whatever can't be shown to treat tokens alike along the sequence stops the motion, said at that op; the
// permutations on both sides of it stay (results are never changed).

sdy.mesh @mesh = <["cp"=2]>

func.func @reversed(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l1: tensor<4x4xf32>) {
    %p1 = "stablehlo.collective_permute"(%l1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s1 = stablehlo.maximum %l1, %p1 : tensor<4x4xf32>
    sdy.return %s1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // expected-remark @+2 {{hoist-permutations: an inverse zigzag permutation stops at 'stablehlo.reverse': it is not known to treat tokens alike}}
  // expected-remark @+1 {{hoist-permutations: a zigzag permutation stops at 'stablehlo.reverse': it is not known to treat tokens alike}}
  %b = stablehlo.reverse %r1, dims = [0] : tensor<8x4xf32>
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r2 = sdy.manual_computation(%b) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l2: tensor<4x4xf32>) {
    %p2 = "stablehlo.collective_permute"(%l2) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s2 = stablehlo.maximum %l2, %p2 : tensor<4x4xf32>
    sdy.return %s2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r2 : tensor<8x4xf32>
}

// -----

sdy.mesh @mesh = <["cp"=2]>

func.func @merges_sequence(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l1: tensor<4x4xf32>) {
    %p1 = "stablehlo.collective_permute"(%l1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s1 = stablehlo.maximum %l1, %p1 : tensor<4x4xf32>
    sdy.return %s1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // expected-remark @+1 {{an inverse zigzag permutation stops at 'stablehlo.reshape': it splits or merges the sequence dim}}
  %m = stablehlo.reshape %r1 : (tensor<8x4xf32>) -> tensor<32xf32>
  // expected-remark @+1 {{a zigzag permutation stops at 'stablehlo.reshape': it does not carry the sequence dim through from one operand}}
  %b = stablehlo.reshape %m : (tensor<32xf32>) -> tensor<8x4xf32>
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r2 = sdy.manual_computation(%b) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l2: tensor<4x4xf32>) {
    %p2 = "stablehlo.collective_permute"(%l2) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s2 = stablehlo.maximum %l2, %p2 : tensor<4x4xf32>
    sdy.return %s2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r2 : tensor<8x4xf32>
}

// -----

// An operand whose sequence dim is dynamic can't be shown to have the sequence's length: an elementwise op reading
// it beside a permuted value stops the motion.

sdy.mesh @mesh = <["cp"=2]>

func.func @dynamic_operand(%x: tensor<8x4xf32>, %d: tensor<?x4xf32>) -> tensor<8x4xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l1: tensor<4x4xf32>) {
    %p1 = "stablehlo.collective_permute"(%l1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s1 = stablehlo.maximum %l1, %p1 : tensor<4x4xf32>
    sdy.return %s1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // expected-remark @+2 {{hoist-permutations: an inverse zigzag permutation stops at 'stablehlo.add': it changes the sequence length}}
  // expected-remark @+1 {{hoist-permutations: a zigzag permutation stops at 'stablehlo.add': it changes the sequence length}}
  %b = stablehlo.add %r1, %d : (tensor<8x4xf32>, tensor<?x4xf32>) -> tensor<8x4xf32>
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r2 = sdy.manual_computation(%b) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l2: tensor<4x4xf32>) {
    %p2 = "stablehlo.collective_permute"(%l2) <{channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s2 = stablehlo.maximum %l2, %p2 : tensor<4x4xf32>
    sdy.return %s2 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return %r2 : tensor<8x4xf32>
}

// -----

// The same for a result whose sequence dim is dynamic: it couldn't be put back in order after the op.

sdy.mesh @mesh = <["cp"=2]>

func.func @dynamic_result(%x: tensor<8x4xf32>, %y: tensor<8x4xf32>) -> tensor<?x4xf32> {
  // expected-remark @+1 {{ring-reorder: axis "cp", zigzag: applied}}
  %r1 = sdy.manual_computation(%x) in_shardings=[<@mesh, [{"cp"}, {}]>] out_shardings=[<@mesh, [{"cp"}, {}]>] manual_axes={"cp"} (%l1: tensor<4x4xf32>) {
    %p1 = "stablehlo.collective_permute"(%l1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>}> : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %s1 = stablehlo.maximum %l1, %p1 : tensor<4x4xf32>
    sdy.return %s1 : tensor<4x4xf32>
  } : (tensor<8x4xf32>) -> tensor<8x4xf32>
  // expected-remark @+1 {{hoist-permutations: an inverse zigzag permutation stops at 'stablehlo.add': it changes the sequence length}}
  %b = stablehlo.add %r1, %y : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<?x4xf32>
  return %b : tensor<?x4xf32>
}

// RUN: %opt %s --split-input-file --verify-diagnostics
// Errors from parsing and from the sdy verifier are matched against expected-error comments.

sdy.mesh @mesh = <["a"=2]>
// expected-error @+1 {{unknown axis name: "c"}}
func.func @unknown_axis(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"c"}]>}) -> tensor<8xf32> {
  return %arg0 : tensor<8xf32>
}

// -----

func.func @syntax(%arg0: tensor<8xf32>) -> tensor<8xf32> {
  // expected-error @below {{expected SSA operand}}
  %0 = stablehlo.add %arg0, : tensor<8xf32>
  return %0 : tensor<8xf32>
}

// -----

func.func @type_mismatch(%arg0: tensor<8xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{type of return operand 0 ('tensor<8xf32>') doesn't match function result type ('tensor<4xf32>')}}
  return %arg0 : tensor<8xf32>
}

"""tools/opt's command line next to mlir-opt's: empty input, --split-input-file=MARKER, --emit-bytecode,
--mlir-print-ir-before-all/after-all (our passes named as MLIR names its own), --no-implicit-module,
--mlir-disable-threading, --help with the passes; and `python -m shardfix.run --help`."""

import io
import subprocess
import sys

import pytest

from shardfix.opt import OptMain, main

MODULE = b"func.func @id(%arg0: tensor<2xf32>) -> tensor<2xf32> {\n  return %arg0 : tensor<2xf32>\n}\n"
FIXABLE = (b'sdy.mesh @mesh = <["a"=2]>\nfunc.func @f(%arg0: tensor<3xf32> {sdy.sharding = #sdy.sharding<@mesh, '
           b'[{"a"}]>}) -> tensor<3xf32> {\n  return %arg0 : tensor<3xf32>\n}\n')
EMPTY_MODULE = "module {\n}\n"


def run(argv, stdin=MODULE):
    out, err = io.StringIO(), io.StringIO()
    code = OptMain(stdout=out, stderr=err, stdin=io.BytesIO(stdin)).run(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("text", [b"", b"  \n\n", b"// only a comment\n"])
def test_empty_input_is_an_empty_module(text):
    assert run(["-"], text) == (0, EMPTY_MODULE, "")
    assert run(["-", "-fix-shardings", "-canonicalize"], text) == (0, EMPTY_MODULE, "")


def test_split_input_file_with_a_marker_of_ones_own():
    text = MODULE + b"#### next\n" + MODULE.replace(b"@id", b"@other")
    code, out, err = run(["-", "--split-input-file=#### next"], text)
    assert (code, err) == (0, "")
    first, second = out.split("// -----\n")
    assert "@id" in first and "@other" in second and "@other" not in first
    code, out, err = run(["-", "--split-input-file=#### next", "--output-split-marker=// ==="], text)
    assert code == 0 and out.count("// ===\n") == 1
    assert run(["-", "--split-input-file"], text)[2].startswith("<stdin>:4:")  # not the default: one chunk


def test_emit_bytecode_round_trips(tmp_path):
    target = tmp_path / "out.mlirbc"
    assert run(["-", "-fix-shardings", "--emit-bytecode", "-o", str(target)], FIXABLE) == (0, "", "")
    data = target.read_bytes()
    assert data.startswith(b"ML\xefR")
    code, out, err = run(["-"], data)
    assert (code, err) == (0, "") and '#sdy.sharding<@mesh, [{}]>' in out  # the repaired module, read back
    assert run(["-", "--emit-bytecode", "--split-input-file"])[2] == (
        "shardfix-opt: error: --emit-bytecode with --split-input-file is not supported (bytecode holds one module; "
        "split the file first)\n")


def test_ir_printing_names_our_passes_as_mlir_names_its_own(capfd):
    code, _, _ = run(["-", "-fix-shardings", "-canonicalize", "--mlir-print-ir-before-all",
                      "--mlir-print-ir-after-all"], FIXABLE)
    assert code == 0
    dumps = [line for line in capfd.readouterr().err.splitlines() if "IR Dump" in line]
    assert [d.split("(")[0].split(":")[0] for d in dumps] == [
        "// -----// IR Dump Before FixShardings", "// -----// IR Dump After FixShardings",
        "// -----// IR Dump Before CanonicalizerPass", "// -----// IR Dump After CanonicalizerPass"]
    assert dumps[0].startswith("// -----// IR Dump Before FixShardings: fix-shardings ('builtin.module' operation)")
    assert not any("unknown<" in d for d in dumps)


def test_no_implicit_module():
    assert run(["-", "--no-implicit-module"], MODULE) == (0, MODULE.decode(), "")  # the op itself, no module
    wrapped = b"module {\n" + MODULE + b"}\n"
    code, out, err = run(["-", "--no-implicit-module", "-canonicalize"], wrapped)
    assert (code, err) == (0, "") and out.startswith("module {\n  func.func @id")
    assert run(["-", "--no-implicit-module", "-canonicalize"], MODULE)[2] == (
        "<stdin>:1:1: error: --no-implicit-module: the top-level operation is 'func.func', and the pipeline runs on "
        "'builtin.module'\n")
    assert run(["-", "--no-implicit-module"], MODULE + MODULE.replace(b"@id", b"@b"))[2] == (
        "<stdin>:1:1: error: source must contain a single top-level operation, found: 2\n")


def test_disable_threading_is_accepted():
    code, out, err = run(["-", "--mlir-disable-threading", "-fix-shardings"], FIXABLE)
    assert (code, err) == (0, "") and '[{}]>' in out


def test_help_lists_the_options_the_passes_and_the_pass_flags(capsys):
    code, out, err = run(["--help"])
    assert (code, err) == (0, "")
    for option in ("--split-input-file [MARKER]", "--emit-bytecode", "--no-implicit-module",
                   "--mlir-print-ir-before-all", "--mlir-disable-threading", "--timeout SECONDS"):
        assert option in out
    assert "-NAME adds the pass NAME to the pipeline" in out
    passes = out.split("shardfix passes")[1].splitlines()
    assert any(line.startswith("  -fix-shardings: repair invalid and indivisible sdy shardings") for line in passes)
    assert "    policy=auto|subaxis|prefix|drop (default: 'auto')" in passes
    assert any(line.startswith("  -ring-reorder: ") for line in passes)
    assert any(line.startswith("  -hoist-permutations: ") for line in passes)
    assert main(["-h"]) == 0 and capsys.readouterr().out == out  # the command: no child process, same text


def test_shardfix_run_help_and_usage_errors():
    done = subprocess.run([sys.executable, "-m", "shardfix.run", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("usage: python -m shardfix.run ") and "--ring-reorder" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "shardfix.run"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.endswith(
        "python -m shardfix.run: error: give a script, or -m and a module\n")

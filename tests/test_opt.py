"""The driver, run in-process through OptMain (as lit runs it through tools/opt)."""

import io
import json
import os

import pytest

from shardfix.opt import OptMain
from shardfix.pipeline import PipelineError, parse_pipeline

HERE = os.path.dirname(__file__)


def run(argv, stdin=b""):
    out, err = io.StringIO(), io.StringIO()
    code = OptMain(stdout=out, stderr=err, stdin=io.BytesIO(stdin)).run(argv)
    return code, out.getvalue(), err.getvalue()


INVALID = b'sdy.mesh @mesh = <["a"=2]>\nfunc.func @f(%arg0: tensor<3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {"q"}]>}) -> tensor<3xf32> {\n  return %arg0 : tensor<3xf32>\n}\n'


def test_fix_from_stdin_with_json_report():
    code, out, err = run(["-", "-p", "fix-shardings", "--report=json"], INVALID)
    assert code == 0
    assert '#sdy.sharding<@mesh, [{}]>' in out
    record = json.loads(err.splitlines()[0])
    assert record["reason"] == "rank-mismatch,indivisible" and record["location"] == "<stdin>:2:14"
    assert (record["shards_before"], record["shards_after"]) == (2, 1)


def test_strict_load_error_exit_code_and_no_output(tmp_path):
    target = tmp_path / "out.mlir"
    target.write_text("keep\n")
    source = tmp_path / "in.mlir"
    source.write_bytes(INVALID)
    code, out, err = run([str(source), "-o", str(target)])
    assert code == 1 and out == ""
    assert err == f'{source}:2:1: error: \'func.func\' op arg 0 - sharding doesn\'t match tensor rank: 2 != 1\n'
    assert target.read_text() == "keep\n"
    assert [p.name for p in tmp_path.iterdir()] == sorted(["in.mlir", "out.mlir"]) or \
        sorted(p.name for p in tmp_path.iterdir()) == ["in.mlir", "out.mlir"]  # no temporary left behind


def test_output_file_written_atomically(tmp_path):
    target = tmp_path / "out.mlir"
    code, out, err = run(["-", "-p", "fix-shardings", "-o", str(target)], INVALID)
    assert (code, out, err) == (0, "", "")
    assert "#sdy.sharding<@mesh, [{}]>" in target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mlir"]


@pytest.mark.parametrize("pipeline, col, message", [
    ("fix-shardings{policy=x}", 1, "option 'policy' of 'fix-shardings' must be one of auto, subaxis, prefix, drop; got 'x'"),
    ("cse, fix-shardings{a=1}", 6, "unknown option 'a' for pass 'fix-shardings'"),
    ("cse,)", 5, "unbalanced ')' in the pipeline"),
])
def test_pipeline_errors(pipeline, col, message):
    with pytest.raises(PipelineError) as e:
        parse_pipeline(pipeline)
    assert e.value.col == col and message in str(e.value)


def test_pipeline_elements():
    p = parse_pipeline("builtin.module(fix-shardings{policy=drop target-mesh=\"dp=4,tp=2\"},func.func(cse),"
                       "ring-reorder{strategy=striped stripe=2})")
    assert [e.text for e in p.elements] == ['fix-shardings{policy=drop target-mesh="dp=4,tp=2"}', "func.func(cse)",
                                            "ring-reorder{strategy=striped stripe=2}"]
    fix, mlir, ring = (e.ours for e in p.elements)
    assert (fix.policy, fix.target_mesh) == ("drop", "dp=4,tp=2") and mlir is None
    assert (ring.strategy, ring.stripe) == ("striped", 2)
    assert p.loads_leniently and not parse_pipeline("cse,fix-shardings").loads_leniently


def test_usage_errors_are_one_line():
    code, out, err = run(["--bogus"])
    assert code == 1 and err == "shardfix-opt: error: unrecognized arguments: --bogus\n"


def test_split_chunks_keep_line_numbers():
    text = (b"func.func @a() {\n  return\n}\n// -----\nfunc.func @b() {\n  %0 = stablehlo.bogus\n}\n")
    code, out, err = run(["-", "--split-input-file"], text)
    assert code == 1 and err.startswith("<stdin>:6:")

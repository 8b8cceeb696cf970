"""The report users see: one entry per (line, reason, before, after) with a count and the sites it stands for,
the warning text, JSON; the user's frame (libraries, the standard library and shardfix are never it)."""

import contextlib
import json
import os

import shardfix.report as report_module
from shardfix.locations import SourceLoc, caller_frame, is_library_file, user_stacklevel
from shardfix.report import Fix, Report, merge_fixes, render_fixes

HERE = SourceLoc("model.py", 12)


def fix(site, before="P('tp', None)", after="P(None, None)", loc=HERE, reasons=(("indivisible", "dim 0 ..."),)):
    return Fix("trace", site, loc, reasons, before, after, 4, 1)


def test_merge_counts_repeats_and_keeps_the_rest_apart():
    fixes = [fix("in_shardings['w']"), fix("out_shardings['w']"), fix("in_shardings['w']"),
             fix("reshard", after="P('dp', None)"), fix("reshard", loc=SourceLoc("model.py", 13)),
             fix("x", reasons=(("unknown-axis", "d"),))]
    merged = merge_fixes(fixes)
    assert [(f.site, f.location, f.reason, f.after, f.count, f.sites) for f in merged] == [
        ("in_shardings['w']", "model.py:12", "indivisible", "P(None, None)", 3,
         ("in_shardings['w']", "out_shardings['w']")),
        ("reshard", "model.py:12", "indivisible", "P('dp', None)", 1, ("reshard",)),
        ("reshard", "model.py:13", "indivisible", "P(None, None)", 1, ("reshard",)),
        ("x", "model.py:12", "unknown-axis", "P(None, None)", 1, ("x",)),
    ]
    assert merge_fixes(merged) == merged


def test_merged_details_are_kept_once_each():
    merged, = merge_fixes([fix("a", reasons=(("indivisible", "dim 0"),)),
                           fix("b", reasons=(("indivisible", "dim 0"), ("indivisible", "dim 1")))])
    assert merged.reasons == (("indivisible", "dim 0"), ("indivisible", "dim 1"))


def test_rendered_warning():
    merged = merge_fixes([fix("in_shardings['w'] (shape (6, 8))"), fix("out_shardings['w'] (shape (6, 8))"),
                          fix("reshard (shape (1, 6))", before="P('dp', 'fsdp')", after="P(None, None)",
                              loc=SourceLoc("model.py", 20),
                              reasons=(("unknown-axis", "dim 1: axis 'fsdp' is not in the mesh (dp=2, tp=4)"),
                                       ("indivisible", "dim 0 of size 1 ...")))])
    assert render_fixes(merged, "step") == "\n".join([
        "shardfix changed 3 sharding(s) of step:",
        "  model.py:12: in_shardings['w'] (shape (6, 8)) and 1 more site(s): P('tp', None) -> P(None, None) "
        "[indivisible] (x2)",
        "      dim 0 ...",
        "  model.py:20: reshard (shape (1, 6)): P('dp', 'fsdp') -> P(None, None) [unknown-axis,indivisible]",
        "      dim 1: axis 'fsdp' is not in the mesh (dp=2, tp=4)",
        "      dim 0 of size 1 ...",
    ])


def test_json_shows_counts_only_where_merged():
    single, = merge_fixes([fix("a")])
    double, = merge_fixes([fix("a"), fix("b")])
    assert "count" not in single.to_json()
    assert (double.to_json()["count"], double.to_json()["sites"]) == (2, ["a", "b"])
    text = Report(fixes=[double]).render_json()
    assert json.loads(text)["count"] == 2


def test_library_files_are_never_the_users():
    assert is_library_file(contextlib.__file__)  # the standard library
    assert is_library_file(os.path.join(os.sep, "venv", "lib", "site-packages", "flax", "linen", "spmd.py"))
    assert is_library_file(report_module.__file__)  # shardfix itself
    assert not is_library_file(__file__) and not is_library_file("<string>")


def test_caller_frame_and_stacklevel_skip_library_frames():
    with contextlib.nullcontext():  # a standard-library frame is no user frame either
        frame = caller_frame(0)
    assert frame.f_code is test_caller_frame_and_stacklevel_skip_library_frames.__code__
    assert user_stacklevel() == 2  # called from here: a warning in a callee of this function points here

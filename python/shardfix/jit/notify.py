"""Telling the user what shardfix changed: one ShardingFixWarning (or log record, or ShardingFixError) per report,
attributed to the user's own line; and notes."""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import warnings
from typing import Iterator

from .._log import logger
from ..locations import is_library_file
from ..report import Fix, ShardingFixError, ShardingFixWarning, merge_fixes, render_fixes
from .specs import in_user_terms

ON_FIX = ("warn", "log", "error", "ignore")


def tell(fixes: list[Fix], on_fix: str, name: str, also: str | None = None) -> None:
    """Report `fixes` made to the function `name` as `on_fix` says, in one message, with `also` (a note: something
    else the user should know) after them; the note alone when nothing was fixed."""
    if on_fix == "ignore":
        return
    if not fixes:
        if also:
            note(also, on_fix)
        return
    text = render_fixes(merge_fixes(in_user_terms(fixes)), name)
    if also:
        text += "\n" + also
    if on_fix == "error":
        raise ShardingFixError(text)
    if on_fix == "log":
        logger.warning(text)
    else:
        warnings.warn(text, ShardingFixWarning, stacklevel=user_stacklevel())


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def note(text: str, on_fix: str) -> None:
    """Something the user should know that changes nothing: a ShardingFixWarning, or a log record (on_fix="log")."""
    if on_fix == "log":
        logger.warning(text)
    else:
        warnings.warn(text, ShardingFixWarning, stacklevel=user_stacklevel())


@contextlib.contextmanager
def warnings_at_user_line() -> Iterator[None]:
    """Warnings raised in the block (by JAX, when shardfix calls it for the user) are raised again once each,
    attributed to the user's line as if the user had made the call."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    seen = set()
    for w in caught:
        if (w.category, str(w.message)) not in seen:
            seen.add((w.category, str(w.message)))
            warnings.warn(w.message, w.category, stacklevel=user_stacklevel())


def user_stacklevel() -> int:
    """The `stacklevel` that attributes a warning raised by our caller to the user's frame: the innermost frame
    outside shardfix, JAX, other installed libraries and Python's own (else the innermost outside shardfix)."""
    frame = sys._getframe(1)  # the frame that calls warnings.warn: stacklevel 1
    level, fallback = 1, None
    while frame is not None:
        path = frame.f_code.co_filename
        if not is_library_file(path) and not os.path.abspath(path).startswith(_STDLIB):
            return level
        if fallback is None and not os.path.abspath(path).startswith(_PACKAGE_DIR):
            fallback = level
        frame = frame.f_back
        # warnings.warn doesn't count the import system's frames (a warning raised while a module is imported)
        if frame is not None and not ("importlib" in frame.f_code.co_filename
                                      and "_bootstrap" in frame.f_code.co_filename):
            level += 1
    return fallback or 1


"""Writing the driver's output as mlir-opt does: standard output, or a file written through symlinks, keeping an
existing file's mode and refusing one the user may not write, replaced atomically when it is a regular file with
one name (a file with other hard links, a FIFO or a device is written in place, so all its names see the output).
Pure: imports neither MLIR nor JAX."""

from __future__ import annotations

import errno
import os
import stat
import tempfile


class OutputError(Exception):
    """The output could not be written; the message says where and why."""


def write_output(path: str, data: bytes, stdout_fd: int = 1) -> None:
    """Write `data` to `path` ("-" for the file descriptor `stdout_fd`)."""
    if path == "-":
        _write_fd(stdout_fd, data, "to standard output")
        return
    if not path:
        raise OutputError("no output file name given")
    target = os.path.realpath(path)  # through symlinks: the link stays, its target gets the output
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    except OSError as e:
        raise OutputError(f"cannot write output file '{path}': {e.strerror}") from None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise OutputError(f"cannot write output file '{path}': it is a directory")
    if info is not None and not os.access(target, os.W_OK):
        raise OutputError(f"cannot write output file '{path}': permission denied")
    if info is not None and (not stat.S_ISREG(info.st_mode) or info.st_nlink > 1):
        _write_in_place(path, target, data)
    else:
        _replace_regular(path, target, data, None if info is None else stat.S_IMODE(info.st_mode))


def _write_fd(fd: int, data: bytes, what: str) -> None:
    view = memoryview(data)
    try:
        while view:
            written = os.write(fd, view)
            view = view[written:]
    except OSError as e:
        reason = {errno.EPIPE: "it was closed by the reader", errno.EBADF: "it is closed",
                  errno.ENOSPC: "no space left on the device"}.get(e.errno, e.strerror)
        raise OutputError(f"cannot write {what}: {reason}") from None


def _write_in_place(path: str, target: str, data: bytes) -> None:
    """A FIFO, a character device, a file with several hard links: opened and written as it is."""
    try:
        fd = os.open(target, os.O_WRONLY | (os.O_TRUNC if stat.S_ISREG(os.stat(target).st_mode) else 0))
    except OSError as e:
        raise OutputError(f"cannot write output file '{path}': {e.strerror}") from None
    try:
        _write_fd(fd, data, f"output file '{path}'")
    finally:
        os.close(fd)


def _replace_regular(path: str, target: str, data: bytes, mode: int | None) -> None:
    """Write a temporary file beside the target and rename it over the target: never half a file."""
    directory = os.path.dirname(target) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix=".shardfix-", dir=directory)
    except OSError as e:
        raise OutputError(f"cannot write output file '{path}': {e.strerror}") from None
    try:
        try:
            _write_fd(fd, data, f"output file '{path}'")
            os.fchmod(fd, mode if mode is not None else 0o666 & ~_umask())
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except (OSError, OutputError) as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OutputError):
            raise
        raise OutputError(f"cannot write output file '{path}': {e.strerror}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

"""A time limit for a driver run. MLIR's parser, verifier and passes can't be interrupted from Python, so the run
happens in a forked child that sends its output back over a pipe; the parent (which never imports MLIR or JAX)
writes it only once the child has finished well. A child past the limit is killed, a crashed one reported, and in
both cases nothing is written. Pure: imports neither MLIR nor JAX."""

from __future__ import annotations

import os
import select
import signal
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from .output import OutputError, write_output

_HEADER = struct.Struct("<cQ")  # message kind, payload length


class Channel:
    """The child's end: progress (which input line it is working on) and the output to write."""

    def __init__(self, fd: int):
        self.fd = fd

    def _send(self, kind: bytes, payload: bytes) -> None:
        data = _HEADER.pack(kind, len(payload)) + payload
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def progress(self, line: int) -> None:
        self._send(b"P", str(line).encode())

    def output(self, path: str, text: str) -> None:
        self._send(b"O", path.encode("utf-8", "surrogateescape") + b"\0" + text.encode("utf-8", "surrogateescape"))


@dataclass
class _Received:
    line: int = 1
    outputs: list[tuple[str, bytes]] = field(default_factory=list)
    buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= _HEADER.size:
            kind, length = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + length:
                return
            payload = bytes(self.buffer[_HEADER.size:_HEADER.size + length])
            del self.buffer[:_HEADER.size + length]
            if kind == b"P":
                self.line = int(payload)
            else:
                path, _, text = payload.partition(b"\0")
                self.outputs.append((path.decode("utf-8", "surrogateescape"), text))


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):  # None where the stream was closed when Python started
        if stream is not None:
            stream.flush()


def run_guarded(work: Callable[[Channel], int], timeout: float, input_name: str, prog: str) -> int:
    """Run `work` in a forked child with a time limit; write what it sends as output; return the exit status."""
    stdout_open = _fd_open(1)
    for fd in (0, 1, 2):  # a closed standard stream must not be taken by the pipe below
        if not _fd_open(fd):
            os.dup2(os.open(os.devnull, os.O_RDWR), fd)
    read_end, write_end = os.pipe()
    _flush()
    pid = os.fork()
    if pid == 0:  # the child: do the work, report through the pipe, never return
        code = 70
        try:
            os.close(read_end)
            code = work(Channel(write_end))
        except BaseException as e:  # noqa: BLE001  (reported by the parent as an internal error)
            if sys.stderr is not None:
                print(f"{prog}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
            code = 70
        finally:
            _flush()
            os._exit(code)
    os.close(write_end)
    received, deadline = _Received(), time.monotonic() + timeout if timeout > 0 else None
    try:
        status = _collect(pid, read_end, received, deadline)
    except KeyboardInterrupt:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return 130
    finally:
        os.close(read_end)
    where = f"{input_name}:{received.line}:1"
    if status is None:
        print(f"{where}: error: no result after {timeout:g} s (MLIR's parser, verifier or a pass did not finish); "
              f"nothing was written; --timeout sets the limit", file=sys.stderr)
        return 1
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        print(f"{where}: error: internal error: the run died of {name} while working here; nothing was written",
              file=sys.stderr)
        return 1
    code = os.WEXITSTATUS(status)
    if code == 70:
        return 1
    for path, data in received.outputs:
        try:
            if path == "-" and not stdout_open:
                raise OutputError("cannot write to standard output: it is closed")
            write_output(path, data)
        except OutputError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 1
    return code


def _collect(pid: int, fd: int, received: _Received, deadline: float | None) -> int | None:
    """Read the child's messages until it exits; its wait status, or None when it ran past the deadline."""
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], wait)
        if ready:
            data = os.read(fd, 1 << 20)
            if data:
                received.feed(data)
                continue
            _, status = os.waitpid(pid, 0)  # the pipe closed: the child is done
            return status
        if deadline is not None and time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None

"""The console cnnpar prints to: names it cannot encode (a folder café on an ASCII console, a file name that is not
UTF-8) are escaped, not a UnicodeEncodeError traceback. The standard library only: the CLI, the children cnnpar
starts (bench's and tune's trials, compare's runners) and each module's own main (errors.main_saying_user_errors)
print through it."""

from __future__ import annotations

import codecs
import contextlib
import errno
import io
import os
import select
import sys
import threading

from cnnpar.errors import SIGPIPE, OutputNotWritable, note_stop, pending_stop, stop_for


def _printable(error: UnicodeError) -> tuple[str | bytes, int]:
    """A character the console's encoding lacks: a name's undecodable byte (a lone surrogate) as that byte, as `ls`
    shows it; anything else as a backslash escape (café as caf\\xe9 on an ASCII console)."""
    try:
        return codecs.lookup_error("surrogateescape")(error)
    except UnicodeError:
        return codecs.lookup_error("backslashreplace")(error)


codecs.register_error("cnnpar.printable", _printable)


@contextlib.contextmanager
def printable_stdio():
    """stdout and stderr print every character while the block runs, then get their error handler back. A console
    or pipe that cannot encode one (PYTHONIOENCODING=ascii, LC_ALL=C with PYTHONUTF8=0, a cp1252 console) stopped a
    run with a UnicodeEncodeError traceback at the first line naming a folder café or a class 日本, and so did a
    name that is not UTF-8 on a UTF-8 console (strict)."""
    kept = [(s, s.errors) for s in (sys.stdout, sys.stderr) if isinstance(s, io.TextIOWrapper) and not s.closed]
    for stream, _ in kept:
        stream.reconfigure(errors="cnnpar.printable")
    plain = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (None if s is None else StopWhenGone(s, name) for s, name in zip(plain, _NAMES))
    try:
        yield
    finally:
        if isinstance(sys.stdout, StopWhenGone):  # not one the command's caller set meanwhile
            sys.stdout = sys.stdout.stream
        if isinstance(sys.stderr, StopWhenGone):
            sys.stderr = sys.stderr.stream
        for stream, errors_kept in kept:
            with contextlib.suppress(ValueError):  # closed meanwhile
                stream.reconfigure(errors=errors_kept)


_NAMES = ("stdout", "stderr")


def say_stop_line(line: str, log=print) -> None:
    """A stop's line of what is kept and how to go on (train's run folder, tune's best config), as the command's other
    lines, and on stderr too where stdout's reader went away (`| head`, StopWhenGone): there it went nowhere."""
    log(line)
    if getattr(sys.stdout, "gone", False):
        print(line, file=sys.stderr, flush=True)


class StopWhenGone:
    """stdout or stderr, whose reader going away (`cnnpar train | head -2`) stops the command as SIGPIPE stops other
    Unix tools: Python ignores SIGPIPE, and the write raised BrokenPipeError, a 28-line traceback that ended training as
    a crash. No SIGPIPE handler: gloo's sockets and DataLoader's pipes rely on their EPIPE errors. The stream is
    pointed at os.devnull (later prints, the stop's own lines and the interpreter's exit flush raise nothing), the stop
    is noted (errors.note_stop: the loops' safe points and engine/stops.the_stop see it), and raised in the main thread
    (exit 141); another thread's write only notes it. A stream that cannot be written otherwise (stdout on /dev/full)
    ends the command in one line naming it, exit 2, where it was a traceback after the work. A full pipe on a
    non-blocking descriptor is waited for (select), as a blocking write waits."""

    def __init__(self, stream, name: str) -> None:
        self.stream, self.name, self.gone = stream, name, False
        self.pid = os.getpid()  # the command's process: a forked child (a DataLoader worker) inherits the stream

    def write(self, text: str) -> int:
        with self._said():
            if self._non_blocking():
                return self._write_when_writable(text)
            return self.stream.write(text)
        return len(text)

    def writelines(self, lines) -> None:
        with self._said():
            if self._non_blocking():
                self._write_when_writable("".join(lines))
            else:
                self.stream.writelines(lines)

    def flush(self) -> None:
        with self._said():
            if self._non_blocking():
                self._flush_when_writable()
            else:
                self.stream.flush()

    def _non_blocking(self) -> bool:
        """The stream's file descriptor is O_NONBLOCK (some CI runners leave it so on stdout): a full pipe then raises
        BlockingIOError (EAGAIN), which ended the command as a stream that cannot be written."""
        try:
            return isinstance(self.stream, io.TextIOWrapper) and not os.get_blocking(self.stream.fileno())
        except AttributeError:  # Windows' Python before 3.12 has no os.get_blocking: its pipes block
            return False
        except (OSError, ValueError, io.UnsupportedOperation):
            return False

    def _write_when_writable(self, text: str) -> int:
        """`text` written whole on a non-blocking descriptor, waiting where the pipe is full, as a blocking write
        does. Through the binary buffer: a TextIOWrapper that meets EAGAIN has dropped the bytes its buffer did
        not take, where BufferedWriter's BlockingIOError says how many it took (characters_written). Flushed at
        once: what a buffer still held at exit would meet EAGAIN in the interpreter's own flush, and be lost."""
        self._flush_when_writable()  # what the text layer holds goes first
        data = text.encode(self.stream.encoding, self.stream.errors or "strict")
        while data:
            try:
                data = data[self.stream.buffer.write(data) :]
            except BlockingIOError as e:
                data = data[e.characters_written :]
                self._wait_writable()
        self._flush_when_writable()
        return len(text)

    def _flush_when_writable(self) -> None:
        while True:
            try:
                self.stream.flush()  # on EAGAIN a BufferedWriter keeps what it could not write
                return
            except BlockingIOError:
                self._wait_writable()

    def _wait_writable(self) -> None:
        select.select([], [self.stream.fileno()], [])  # a full pipe is temporary: its reader empties it

    def __getattr__(self, name: str):  # fileno, isatty, encoding, buffer...: the stream's own
        return getattr(self.stream, name)

    @contextlib.contextmanager
    def _said(self):
        try:
            yield
        except OSError as e:
            if self.gone or e.errno == errno.EPIPE:
                self._to_devnull()
                if os.getpid() != self.pid:
                    # a forked worker's line goes nowhere, and the worker goes on: raised there, the stop ended its
                    # loop as a Ctrl-C would, and the command failed on "DataLoader worker exited unexpectedly"; the
                    # command's own process stops at its next write
                    return
                if not self.gone:
                    self.gone = True
                    # a stop under way (a SIGTERM, a Ctrl-C, the other stream's reader gone) whose own lines found
                    # this reader gone stays that stop: raised again, its clean-up after the line was cut short
                    # and its exit status (143, 130) read 141
                    if pending_stop() is None:
                        note_stop(SIGPIPE)
                        if threading.current_thread() is threading.main_thread():
                            raise stop_for(SIGPIPE) from None
                return
            self._to_devnull()
            self.gone = True
            raise OutputNotWritable(f"{self.name}: cannot be written ({e.strerror or e})") from None

    def _to_devnull(self) -> None:
        """The stream's file descriptor on os.devnull, so that what is still in its buffer, and the interpreter's
        flush at exit, go nowhere instead of raising again ("Exception ignored ... BrokenPipeError")."""
        with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
            fd = self.stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)


def rate_text(per_s: float) -> str:
    """A rate as a person reads it: whole numbers with thousands separators from 100 up, three significant figures
    below (ResNet-50 at 224 px on a laptop CPU trains under 1 img/s, which `,.0f` printed as "0 img/s")."""
    return f"{per_s:,.0f}" if abs(per_s) >= 100 or per_s == 0 else f"{per_s:.3g}"

"""The console cnnpar prints to: names it cannot encode (a folder café on an ASCII console, a file name that is not
UTF-8) are escaped, not a UnicodeEncodeError traceback. The standard library only: the CLI, the children cnnpar
starts (bench's and tune's trials, compare's runners) and each module's own main (errors.main_saying_user_errors)
print through it."""

from __future__ import annotations

import codecs
import contextlib
import io
import sys


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
    try:
        yield
    finally:
        for stream, errors_kept in kept:
            with contextlib.suppress(ValueError):  # closed meanwhile
                stream.reconfigure(errors=errors_kept)


def rate_text(per_s: float) -> str:
    """A rate as a person reads it: whole numbers with thousands separators from 100 up, three significant figures
    below (ResNet-50 at 224 px on a laptop CPU trains under 1 img/s, which `,.0f` printed as "0 img/s")."""
    return f"{per_s:,.0f}" if abs(per_s) >= 100 or per_s == 0 else f"{per_s:.3g}"

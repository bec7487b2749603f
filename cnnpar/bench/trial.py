"""One measurement in a child process that the parent kills at a hard time limit.

A torch.compile (max-autotune above all) can spend minutes inside one Python call; no timer in
the measuring process can stop it there. So the tuner's trials, and the claims whose compile has
no known bound, run as `python -m cnnpar.bench.trial SPEC.json RESULT.json`, and at the limit the
parent kills the child's whole process group.

Why a subprocess and not multiprocessing spawn: the child starts in a session of its own and is
killed with everything it started (Inductor's compile workers, DataLoader workers, in that session or
another: `kill_process_tree`), and the driver takes its device memory back at once; spawn's children share the
parent's group, would re-import the parent's `__main__` (the CLI), and need picklable arguments.
The child's output goes to a log file, whose last line says what it was doing when it was cut
off. Every trial also starts clean: no allocator fragments left by an earlier out-of-memory, no
Dynamo caches or cuDNN and TF32 flags carried over from the trial before. The cost is a fresh
`import torch` per trial (about 2 to 5 s), which the limit counts.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cnnpar.errors import raise_pending_stop
from cnnpar.process_tree import kill_process_tree, owned_temp_folder, parent_env

OK, FAILED, CUT_OFF = "ok", "failed", "cut off"
# the parent's process id, for the child to end with it (main): in a session of its own, a child of a parent killed
# outright (SIGKILL, the OOM killer) measured on with no time limit, holding the device
PARENT_ENV = "CNNPAR_TRIAL_PARENT"
POLL_S = 15.0  # how often a running child's progress (its last log line) is shown


@dataclass
class ChildResult:
    status: str  # OK, FAILED or CUT_OFF
    value: dict = field(default_factory=dict)  # what the child measured (OK); FAILED: "user_error" on bad input
    error: str = ""  # FAILED: the child's error line; CUT_OFF: the limit and the child's last line
    wall_s: float = 0.0


def child_command(spec_path: Path, result_path: Path) -> list[str]:
    return [sys.executable, "-m", "cnnpar.bench.trial", str(spec_path), str(result_path)]


MARK = "trial: "  # starts every progress line a child prints itself (`say`), so warnings are not shown


def say(text: str) -> None:
    """A child's progress line: the parent shows the last one while it waits, and when it cuts off."""
    print(MARK + text, flush=True)


def _log_lines(log: Path) -> list[str]:
    try:
        return [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []


def _progress_line(log: Path) -> str:
    """The child's last own progress line (`say`), "" before its first: a torch warning's traceback line
    ("warn_once(") read as the trial's progress."""
    own = [ln.removeprefix(MARK) for ln in _log_lines(log) if ln.startswith(MARK)]
    return own[-1][:200] if own else ""


def _last_line(log: Path) -> str:
    """What a child cut off or failed was doing: its last own line, else the log's last (an error's)."""
    return (_progress_line(log) or (_log_lines(log) or [""])[-1])[:200]


TRIAL_PREFIX = "cnnpar-trial-"  # then the parent's process id: a folder whose parent is gone is an orphan
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache_dir() -> str:
    """Where torch.compile keeps its cache in a process started with this one's environment: TORCHINDUCTOR_CACHE_DIR,
    else torch's default, `<temporary folder>/torchinductor_<user>` (torch._inductor's `default_cache_dir`, spelled
    out: importing it takes seconds; tests/unit/test_tune.py holds the two equal)."""
    if INDUCTOR_CACHE_ENV in os.environ:
        return os.environ[INDUCTOR_CACHE_ENV]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this user id (a container without a passwd entry)
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def child_env(temp: Path) -> dict[str, str]:
    """The child's environment: the parent's id (PARENT_ENV), and `temp`, inside the trial's folder, as its
    temporary folder. A child cut off at the limit is killed with everything it started, and none of them cleans up:
    gcc's `cc*.s` files from an Inductor compile and the DataLoader workers' `pymp-*` folders stayed in /tmp; now
    they go with the trial's folder. torch.compile's cache stays where it would have been (INDUCTOR_CACHE_ENV), shared
    by every trial and run, or each trial would compile from nothing."""
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        **parent_env(PARENT_ENV),
        INDUCTOR_CACHE_ENV: inductor_cache_dir(),
        "TMPDIR": str(temp),
    }


def run_child(
    spec: dict,
    limit_s: float,
    log: Callable[[str], None] = print,
    poll_s: float = POLL_S,
    command: Callable[[Path, Path], list[str]] = child_command,
) -> ChildResult:
    """Run `spec` in a child process; kill it (and its children) when `limit_s` seconds have passed."""
    # a stop noted, not raised, inside an import (errors.stop_on_signals): the child started and measured in full
    raise_pending_stop()
    # a SIGKILLed tune or bench (its child ends with it, `end_with_parent`) never ran the folder's clean-up
    with owned_temp_folder(TRIAL_PREFIX) as tmp:
        spec_path, result_path, log_path = Path(tmp, "spec.json"), Path(tmp, "result.json"), Path(tmp, "child.log")
        spec_path.write_text(json.dumps(spec))
        temp = Path(tmp, "tmp")
        temp.mkdir()
        env = child_env(temp)
        start = time.monotonic()
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(
                command(spec_path, result_path), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            try:
                while True:
                    left = limit_s - (time.monotonic() - start)
                    if left <= 0:
                        kill_process_tree(proc)
                        wall = time.monotonic() - start
                        last = _last_line(log_path)
                        # the log's last line quoted: it may hold brackets of its own ("warn_once(")
                        why = f"cut off at the {limit_s:.0f} s limit" + (f" (its last line: {last!r})" if last else "")
                        return ChildResult(CUT_OFF, error=why, wall_s=wall)
                    try:
                        proc.wait(timeout=min(left, poll_s))
                        break
                    except subprocess.TimeoutExpired:
                        log(f"  ... {time.monotonic() - start:.0f} s: {_progress_line(log_path) or 'starting'}")
            except BaseException:  # Ctrl-C in the parent: the child lives in its own session, so stop it here
                kill_process_tree(proc)
                raise
        wall = time.monotonic() - start
        if result_path.is_file():
            value = json.loads(result_path.read_text())
            if value.get("status") == OK:
                return ChildResult(OK, value, wall_s=wall)
            return ChildResult(FAILED, value, value.get("error", "") or _last_line(log_path), wall)
        return ChildResult(FAILED, error=f"exit code {proc.returncode}: {_last_line(log_path)}", wall_s=wall)


def _run(spec: dict) -> dict:
    """The child's side: dispatch on the spec's kind; import only what that kind needs."""
    kind = spec["kind"]
    if kind == "train":
        from .tune import measure_in_child

        return measure_in_child(spec)
    if kind == "claim":
        from .claims import measure_claim_in_child

        return measure_claim_in_child(spec)
    raise ValueError(f"unknown trial kind {kind!r}")


def main(argv: list[str] | None = None) -> int:
    from cnnpar.console import printable_stdio

    # the child prints as the CLI does: a folder café on an ASCII console failed every trial, the start one first
    with printable_stdio():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    from cnnpar.errors import SIGKILL, UserError, first_line, user_error_text
    from cnnpar.process_tree import end_with_parent_named_in
    from cnnpar.report.files import write_json_atomic
    from cnnpar.socket_folder import init_socket_folder

    # as the parent's own limit would: nothing here is worth keeping
    end_with_parent_named_in(PARENT_ENV, SIGKILL)
    spec_path, result_path = (argv if argv is not None else sys.argv[1:])[:2]
    spec = json.loads(Path(spec_path).read_text())
    try:
        # the trial's folder, this child's TMPDIR (child_env), adds some 34 characters: a TMPDIR that trains could
        # hold no socket of the DataLoader workers' under it. Made here, the fallback is one folder this child removes.
        init_socket_folder()
        value = {"status": OK, **_run(spec)}
        code = 0
    except UserError as e:  # bad input (data that does not load or decode): the parent may stop on it
        text = user_error_text(e)  # the file's name, not the DataLoader worker's "Caught DataError in ..."
        line = (text.strip().splitlines() or [""])[0]
        value = {"status": FAILED, "error": f"{type(e).__name__}: {line}"[:300], "oom": False, "user_error": text}
        code = 1
    except Exception as e:  # out of memory, an unsupported mode: a result the parent reports
        import torch

        oom = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()
        value = {"status": FAILED, "error": f"{type(e).__name__}: {first_line(e)}"[:300], "oom": oom}
        code = 1
    write_json_atomic(result_path, value, strict=False)  # read back by the parent alone (run_child), nan and all
    return code


if __name__ == "__main__":
    sys.exit(main())

"""Where a traced epoch's time went: `cnnpar.report.trace_reading` on a stored torch.profiler trace.

    python benchmarks/trace_summary.py trace.json.gz [--threads threads.json] [--json summary.json]

`--threads`: {native thread id: Python thread name} (benchmarks/jpeg_pipeline.py writes it beside each
trace); `--json`: the figures as JSON too (a few kB, unlike the trace: what benchmarks/summarize_h200.py
reads).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cnnpar.errors import UserError, main_saying_user_errors  # noqa: E402
from cnnpar.report.trace_reading import load_events, report, summarize  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--threads", type=Path, help="JSON {native thread id: Python thread name}")
    ap.add_argument("--json", type=Path, help="also write the figures there (a few kB, unlike the trace)")
    args = ap.parse_args()
    # each read ended in a FileNotFoundError traceback
    for flag, path in (("trace", args.trace), ("--threads", args.threads)):
        if path is not None and not path.is_file():
            raise UserError(f"{flag} {path}: file not found (expected a torch.profiler trace or its threads JSON)")
    names = {int(k): v for k, v in json.loads(args.threads.read_text()).items()} if args.threads else None
    s = summarize(load_events(args.trace), names)
    if args.json:
        args.json.write_text(json.dumps({"trace": args.trace.name, **s}, indent=1, default=str) + "\n")
    print(report(s))
    return 0


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "trace_summary"))

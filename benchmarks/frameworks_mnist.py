"""cnn3 on MNIST under every framework `cnnpar compare` knows, on this machine.

    python benchmarks/frameworks_mnist.py [--max-train 6000 --max-val 2000 --epochs 3 --devices 1]

Writes the per-framework CSVs, the combined table (.md, .csv) and the chart (.png) to
benchmarks/results/frameworks_<device type>/ (see cnnpar/frameworks/spec.py for the schema).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cnnpar.errors import main_saying_user_errors  # noqa: E402
from cnnpar.frameworks.compare import run_compare  # noqa: E402
from cnnpar.frameworks.spec import RunSpec, parse_frameworks  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="an .npz, a .csv or digits (default: the shared mnist.npz)")
    p.add_argument("--frameworks", default="all")
    p.add_argument("--max-train", type=int, default=6000)
    p.add_argument("--max-val", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--out", default="")
    args = p.parse_args()
    if args.data is None:  # only the default looks elsewhere: a --data given that was not there trained on this one
        near, alt = ROOT.parent / "shared" / "data" / "mnist.npz", Path("/work/shared/data/mnist.npz")
        args.data = str(alt if not near.is_file() and alt.is_file() else near)
    out = args.out or str(ROOT / "benchmarks" / "results" / "frameworks_cpu")
    spec = RunSpec(
        data=args.data,
        max_train=args.max_train,
        max_val=args.max_val,
        epochs=args.epochs,
        batch_size=args.batch_size,
        devices=args.devices,
        out=out,
    )
    rows = run_compare(parse_frameworks(args.frameworks), spec)
    return 1 if any(r["status"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main_saying_user_errors(main, "frameworks_mnist"))  # a missing --data: one line, exit 2

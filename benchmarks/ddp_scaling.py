"""DDP scaling at several world sizes in one run: see cnnpar/bench/ddp_scaling.py (also `cnnpar bench --ddp`).

python benchmarks/ddp_scaling.py --world-sizes 1,2 --out $OUT/ddp_scaling_h200x2
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed cnnpar

from cnnpar.bench.ddp_scaling import entry  # noqa: E402

if __name__ == "__main__":
    sys.exit(entry())

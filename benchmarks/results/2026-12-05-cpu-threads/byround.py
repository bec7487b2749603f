import collections
import re
import statistics as st
import sys

d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"(\d+) (\w+) (\w+) \| epoch (\d+)/\d+ .*?([\d,]+) img/s", line)
    if m:
        d[(m[2], m[3], m[1])].append(int(m[5].replace(",", "")))
for load in ("quiet", "loaded"):
    for arm in ("default", "passive", "spin10k", "omp1"):
        print(
            f"{load:6} {arm:8} "
            + "  ".join(f"r{r}:{st.median(d[(load, arm, r)]):.0f}" for r in "1234" if d.get((load, arm, r)))
        )

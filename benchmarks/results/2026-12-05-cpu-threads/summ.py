import collections
import re
import statistics as st
import sys

d = collections.defaultdict(list)
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"(\d+) (\w+) (\w+) \| epoch (\d+)/\d+ .*?([\d,]+) img/s", line)
    if not m:
        if "FAIL" in line:
            print(line.strip())
        continue
    r, load, arm, ep, v = m.groups()
    v = int(v.replace(",", ""))
    rows[(load, arm)].append(f"r{r}e{ep}:{v}")
    d[(load, arm)].append(v)
for load in ("quiet", "loaded"):
    for arm in ("default", "passive", "spin10k", "omp1"):
        v = d.get((load, arm))
        if not v:
            continue
        print(
            f"{load:6} {arm:8} n={len(v):2} median {st.median(v):6.0f}  range {min(v)}-{max(v)}  | "
            + " ".join(rows[(load, arm)])
        )

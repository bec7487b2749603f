#!/bin/bash
# The runs behind results.csv: cnn3, 3 epochs, `cnnpar train` defaults but --optimizer, --lr and --seed, on the
# built-in digits and on 5,000 CIFAR-10 images (made below). A row already in results.csv is skipped.
#   CNNPAR=/path/to/checkout bash benchmarks/results/default_lr_cpu/sweep.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd "${CNNPAR:-$here/../../..}"
export PYTHONPATH=$PWD
out=$here/results.csv
work=${WORK:-.devdata/default_lr}
mkdir -p "$work"
cifar=$work/cifar5k.npz
[ -f "$cifar" ] || python - "$cifar" <<'PY'
import io, sys
import numpy as np
from PIL import Image
d = np.load("/work/shared/data/cifar10_jpeg.npz")  # the JPEG-q75 copy: see /work/shared/data/README.md
def decode(buf, off, n):
    return np.stack([np.asarray(Image.open(io.BytesIO(buf[off[i]:off[i + 1]].tobytes())).convert("RGB"))
                     for i in range(n)])
np.savez(sys.argv[1], x_train=decode(d["train_jpeg"], d["train_offsets"], 5000),
         y_train=d["y_train"][:5000].astype(np.int64), x_test=decode(d["test_jpeg"], d["test_offsets"], 1000),
         y_test=d["y_test"][:1000].astype(np.int64), class_names=np.array([str(c) for c in d["class_names"]]))
PY
[ -f "$out" ] || echo "data,optimizer,lr,seed,best_val_acc,last_train_loss,seconds" > "$out"
run() { # data optimizer lr seed
  local data=$1 opt=$2 lr=$3 seed=$4
  grep -q "^$(basename "$data"),$opt,$lr,$seed," "$out" && return
  local t0=$(date +%s) log=$work/log-$(basename "$data")-$opt-$lr-$seed.txt
  python -m cnnpar train --data "$data" --optimizer "$opt" --lr "$lr" --seed "$seed" --epochs 3 --no-progress \
    --no-tensorboard --out-dir "$work/runs" > "$log" 2>&1
  local acc=$(grep -o "best val acc [0-9.]*" "$log" | awk '{print $4}')
  local loss=$(grep "^epoch 3/3" "$log" | grep -o "train loss [0-9.]*" | awk '{print $3}')
  echo "$(basename "$data"),$opt,$lr,$seed,$acc,$loss,$(( $(date +%s) - t0 ))" >> "$out"
}
for seed in 0 1 2 3 4; do
  for data in digits "$cifar"; do
    for lr in 0.002 0.0125 0.025 0.05 0.1; do run "$data" sgd $lr $seed; done
    for lr in 0.002 0.0125 0.025 0.05; do run "$data" muon $lr $seed; done
    run "$data" adamw 0.002 $seed
  done
done

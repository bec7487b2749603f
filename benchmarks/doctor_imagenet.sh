#!/usr/bin/env bash
# The bottleneck doctor on real photos: the ImageNet sample (300 full-size JPEGs, one per class),
# ResNet-50 at 224 px on one GPU, first as the textbook loop, then tuned. Both runs sample GPU and
# host telemetry (--monitor) and re-measure their top three recommendations (--try 3).
#
# usage: benchmarks/doctor_imagenet.sh [OUT_DIR] [TAR]
#   OUT_DIR  where the reports go (default benchmarks/results/doctor_imagenet)
#   TAR      imagenet_sample_300.tar (default .devdata/imagenet_sample_300.tar, extracted once
#            into .devdata/, which git ignores)
# Each report folder holds report.md, doctor.json (with device, driver, torch, git revision),
# phases.csv, recommendations.csv, doctor.png, telemetry.csv and telemetry.png.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-benchmarks/results/doctor_imagenet}
TAR=${2:-.devdata/imagenet_sample_300.tar}
DATA=.devdata/imagenet_sample
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ ! -d "$DATA" ]; then
  [ -f "$TAR" ] || { echo "no $TAR: copy imagenet_sample_300.tar there or pass its path" >&2; exit 2; }
  mkdir -p .devdata
  tar -xf "$TAR" -C .devdata
fi
mkdir -p "$OUT"

CORES=$(nproc)
WORKERS=$(( CORES > 17 ? 16 : CORES - 1 ))

# All 300 photos train (--val-fraction 0); 300 classes, one photo each: a throughput set.
COMMON=(--data "$DATA" --num-classes 300 --val-fraction 0 --model resnet50 --image-size 224
        --batch-size 64 --device cuda --monitor --try 3
        --warmup-steps 3 --measure-steps 20 --max-seconds 30)

# (a) the textbook loop: per-sample float transforms on the host, no workers, fp32, NCHW, pageable
#     memory, no side-stream copies, no compile.
python -m cnnpar doctor "${COMMON[@]}" \
  --loader textbook --workers 0 --pin-memory off --prefetch-stream off \
  --precision fp32 --channels-last off --compile off \
  --report-dir "$OUT/textbook" 2>&1 | tee "$OUT/textbook.log"

# (b) tuned: uint8 batches decoded by many workers, device-side transforms, pinned memory and a
#     side copy stream, bf16, channels_last. (compile stays off here so the half-batch probe runs;
#     the doctor recommends and tries it.)
python -m cnnpar doctor "${COMMON[@]}" \
  --loader fast --workers "$WORKERS" --pin-memory on --prefetch-stream on \
  --precision bf16 --channels-last on --compile off \
  --report-dir "$OUT/tuned" 2>&1 | tee "$OUT/tuned.log"

echo "reports: $OUT/textbook/report.md $OUT/tuned/report.md"

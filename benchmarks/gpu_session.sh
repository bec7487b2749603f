#!/usr/bin/env bash
# Everything cnnpar measures on a lent GPU machine, in phases, writing under OUTDIR.
# usage: benchmarks/gpu_session.sh PHASE OUTDIR
#   (PHASE: smoke | main | extra | rest | verify | frameworks | jpeg | jpeg_e2e | final | jpeg_pipeline |
#    claims_ladder | tune50 | record | s5cifar | s6a | s6b | s6c | s6d | s7a-s7d | s8a | s8c | s8d | s8e | s9a | s9b | s9c | s9d | s9e | s10a | s10b | s10c | s10d | s10e | s10f | s10g | s10h | s11a | s11b | s11c | s11d | s11e | s11f | s11g | s12a | s12b | s12c | s12d | s12e | s13a | s13b | s14a | s14b | s14c | s14d | s15a | s15b | s15c | s15d | s15e | s16a | s16b | s17a | s17b | s17c | s17d | s18a | s18b | s18c | s18d | s18e | s18f | s19a | s19b | s19c | s19d | s19e | s19f | s19g | s20b | s20c | s20d | s21b | s21c | s21d | s22a | s22b | s23a | s23b | s24a | s26a | s27b | s27c | s29b | s29c | s30a | s30b | s30c | s31a | s31b | s32a | s32b | s33a | s33b | s34a | s35a | s35b | s37a | s37b | s41c | s47b | s48a | s48b | s48d | s49a | s49b | s49c | s50c | s52b | s51a | s42a | s42b | s42c)
# Needs, in the git-ignored .devdata/: cifar10_jpeg.npz and imagenet_sample_300.tar; in .whl/:
# tomli_w (not in the GPU image) and the airbench sdist (the side-by-side speedrun).
set -uo pipefail
PHASE=$1; OUTDIR=$2
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# /tmp/site afresh each call: on a machine still warm from a call that carried fewer wheels, `pip --target` skipped
# a wheel whose top folder was there already (nvImageCodec's `nvidia/`, made by nvJPEG's: call ZZZZZI)
rm -rf /tmp/site; mkdir -p /tmp/site "$OUTDIR"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
for t in .whl/*.tar.gz; do [ -f "$t" ] || continue; tar xzf "$t" -C /tmp && cp -r /tmp/"$(basename "$t" .tar.gz)"/airbench /tmp/site/; done
export PYTHONPATH="$PWD:/tmp/site" PATH="/tmp/site/bin:$PATH"  # bin: py-spy's binary, where its wheel travelled
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
# the machine, torch and revision of every call, in its files too (the exit cases write no columns of their own)
{ nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  echo "git ${CNNPAR_GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null)}"; } | tee "$OUTDIR/environment.txt"

# data: decoded CIFAR-10 (npz + airbench's train.pt/test.pt), the ImageNet photos, and a 20x
# larger folder of hard links to the same photos so an epoch has enough batches to time
[ -f .devdata/cifar10.npz ] || [ ! -f .devdata/cifar10_jpeg.npz ] || python3 benchmarks/prepare_cifar10.py --src .devdata/cifar10_jpeg.npz --out .devdata
[ -d .devdata/imagenet_sample ] || tar xf .devdata/imagenet_sample_300.tar -C .devdata
# make_rep K DIR: a folder of K hard links to each photo (K x 300 files, no extra disk)
make_rep() {
  [ -d "$2" ] || python3 -c "
import os, sys, pathlib
k, dst = int(sys.argv[1]), pathlib.Path(sys.argv[2])
for f in sorted(pathlib.Path('.devdata/imagenet_sample').glob('*/*')):
    (dst / f.parent.name).mkdir(parents=True, exist_ok=True)
    for i in range(1, k + 1):
        os.link(f, dst / f.parent.name / f'{i}_{f.name}')" "$1" "$2"
}
make_rep 20 .devdata/imagenet_rep
ln -sfn .devdata/cifar10 cifar10   # airbench's test loader reads ./cifar10/test.pt
R="$OUTDIR/results"; mkdir -p "$R"
run() { echo "=== $*"; timeout "$1" "${@:2}" 2>&1 | grep -v -E "Warning|warn\(" | tail -25; }
# logged NAME SECONDS CMD...: CMD's whole output into $R/NAME.log, its exit code
# and the end of the log printed, without the libraries' known noise (LOG_FILTER, LOG_TAIL or TAIL)
logged() { local name=$1; shift; echo "=== $*"; timeout "$1" "${@:2}" > "$R/$name.log" 2>&1; echo "rc=$?";
           grep -v -E "${LOG_FILTER:-Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode}" "$R/$name.log" \
             | tail -"${TAIL:-${LOG_TAIL:-30}}"; }

# hang_case NAME CMD...: CMD in the background; one still alive AFTER_DONE s (10) after its "done:" line,
# or at HANG_LIMIT s (250), has its threads' states, kernel wait channels and kernel stacks read from /proc
# (and gdb's native stacks where gdb exists), then is killed; a summary goes to $R/NAME.summary
hang_case() {
  local name=$1 t=0 seen=""; shift
  "$@" > "$R/$name.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null && [ "$t" -lt "${HANG_LIMIT:-250}" ]; do
    [ -z "$seen" ] && grep -q "^done:" "$R/$name.log" && seen=$t
    [ -n "$seen" ] && [ $((t - seen)) -ge "${AFTER_DONE:-10}" ] && break
    sleep 1; t=$((t + 1))
  done
  {
    if kill -0 "$pid" 2>/dev/null; then
      echo "$name: still running at ${t} s (done: at ${seen:-never} s)"
      for task in /proc/"$pid"/task/*; do
        echo "  task $(basename "$task") $(cat "$task"/comm 2>/dev/null) state=$(awk '{print $3}' "$task"/stat 2>/dev/null)" \
          "wchan=$(cat "$task"/wchan 2>/dev/null)"
        sed 's/^/      /' "$task"/stack 2>/dev/null | head -12
      done
      echo "  children: $(pgrep -P "$pid" | tr '\n' ' ')"
      if command -v gdb > /dev/null; then
        timeout -s KILL 30 gdb -p "$pid" -batch -ex "info threads" -ex "thread apply all bt 20" > "$R/${name}_gdb.log" 2>&1
        grep -E "^Thread|^#[0-5] " "$R/${name}_gdb.log" | sed -E 's/ \(.*//' | cut -c1-110 | head -80
      fi
      kill -9 "$pid"; pkill -9 -P "$pid"; wait "$pid" 2>/dev/null
    else
      wait "$pid"; echo "$name: exited rc=$? at ${t} s (done: at ${seen:-never} s)"
    fi
    grep -E "^epoch|^done|rror" "$R/$name.log" | head -4
  } > "$R/$name.summary" 2>&1
}

# user_run FOLDER LIMIT: `cnnpar train --model resnet50 --epochs 3` on FOLDER with no other flag, as a user
# runs it, through hang_case (stacks written if it has not left 15 s after "done:"); its choices and epochs
# printed, its summary.json kept
user_run() {
  AFTER_DONE=${AFTER_DONE:-30} HANG_LIMIT=${HANG_LIMIT:-$2} CNNPAR_EXIT_STACKS=$R/default_stacks.txt \
      hang_case default python3 -m cnnpar train --data "$1" --model resnet50 --epochs 3 --no-progress \
      --out-dir /tmp/runs_default
  cat "$R"/default.summary; grep -E "^decode|^batch size|^cuda graphs|^epoch" "$R"/default.log
  cp /tmp/runs_default/*/summary.json "$R/default_summary.json" 2>/dev/null
}

case "$PHASE" in
jpeg)
  # issue 11: the CUDA decode tests, decode/crop/resize per batch, then ResNet-50 end to end from
  # the photos (nvImageCodec, nvJPEG, CPU workers) and from a prepared store of them. Full logs
  # under $R (at most 8 files come back), their ends printed.
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If'  # this phase's log display
  logged gpu_tests 200 python3 -m pytest -q -s -m gpu tests/unit/test_gpu_decode.py
  TAIL=60 logged jpeg_decode 240 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cuda \
      --profile --out "$R/jpeg_decode_cuda.csv"
  # the store for jpeg_e2e, made now while the machine is warm (kept between calls until it goes back)
  [ -f .devdata/imagenet_rep.cnnpar ] || logged prepare 120 python3 -m cnnpar prepare .devdata/imagenet_rep \
      --out .devdata/imagenet_rep.cnnpar --max-side 256
  ;;
jpeg_e2e)
  # issue 11, second half: the per-batch figures again (after changes), then ResNet-50 end to end
  # (a call of its own: with the tests, the two halves pass the 10 minutes a call may take)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If'  # this phase's log display
  [ -n "${E2E_ONLY:-}" ] || TAIL=40 logged jpeg_decode 150 python3 benchmarks/jpeg_decode.py \
      --folder .devdata/imagenet_sample --device cuda --profile --out "$R/jpeg_decode_cuda.csv"
  STORE=.devdata/imagenet_rep.cnnpar
  [ -f "$STORE" ] || logged prepare 120 python3 -m cnnpar prepare .devdata/imagenet_rep --out "$STORE" --max-side 256
  logged speed_records 380 python3 benchmarks/speed_records.py --parts jpeg --store "$STORE" \
      --out "$R/speed_records_jpeg.csv"
  ;;
final)
  # the CUDA tests, then the README's photo commands as a user runs them (defaults, one epoch each):
  # the log shows the decoder chosen and why, the graphs decision, and the prepare advice
  logged gpu_tests 200 python3 -m pytest -q -m gpu tests
  logged train_folder 120 python3 -m cnnpar train --data .devdata/imagenet_sample --model resnet50 --epochs 2 \
      --batch-size 64 --out-dir /tmp/runs
  logged train_store 90 bash -c "python3 -m cnnpar prepare .devdata/imagenet_sample --out /tmp/sample.cnnpar \
      --max-side 256 && python3 -m cnnpar train --data /tmp/sample.cnnpar --model resnet50 --epochs 2 --batch-size 64 \
      --out-dir /tmp/runs"
  ;;
jpeg_pipeline)
  # issue 11: the JPEG-folder loader alone against whole ResNet-50 epochs, a few variants
  logged jpeg_pipeline 480 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep ${VARIANTS:+--variants $VARIANTS} \
      ${GRAPHS:+--graphs $GRAPHS} --out "$R/jpeg_pipeline.csv"
  ;;
smoke)
  run 120 python3 -m pytest -q -m gpu tests
  run 120 python3 benchmarks/step_vs_plain.py --cases resnet18:32:512 --steps 5 --repeats 1 --warmup 3 \
      --variants "compile=off,cuda_graphs=on" --out "$R/smoke_svp.csv"
  run 150 python3 benchmarks/speed_records.py --parts cifar,jpeg,speedrun --seeds 1 --speed-epochs 2 --out "$R/smoke_sr.csv"
  [ "$GPUS" -ge 2 ] && run 150 python3 benchmarks/ddp_scaling.py --world-sizes 1,2 --steps 10 --repeats 1 \
      --out "$R/smoke_ddp"
  run 120 python3 -m cnnpar bench --device cuda --model resnet18 --data .devdata/cifar10.npz --timed-steps 5 \
      --warmup-steps 3 --repeats 1 --batch-size 256 --out "$R/smoke_bench"
  ;;
main)
  [ "$GPUS" -ge 2 ] && run 170 python3 benchmarks/ddp_scaling.py --world-sizes 1,2 --out "$R/ddp_scaling_resnet50"
  CUDA_VISIBLE_DEVICES=0 run 400 python3 benchmarks/step_vs_plain.py --out "$R/step_vs_plain.csv" > "$R/svp.log" &
  CUDA_VISIBLE_DEVICES=1 run 400 python3 -m cnnpar bench --device cuda --model resnet18 --data .devdata/cifar10.npz \
      --batch-size 512 --out "$R/ladder_resnet18_cifar10" > "$R/ladder18.log" &
  wait; cat "$R/svp.log" "$R/ladder18.log"
  ;;
extra)
  CUDA_VISIBLE_DEVICES=0 run 420 python3 benchmarks/speed_records.py --out "$R/speed_records.csv" > "$R/sr.log" &
  CUDA_VISIBLE_DEVICES=1 bash -c "run() { timeout \$1 \"\${@:2}\" 2>&1 | tail -8; }; \
      run 200 bash benchmarks/doctor_imagenet.sh '$R/doctor_imagenet'; \
      run 220 python3 -m cnnpar bench --device cuda --model resnet50 --data synthetic --image-shape 3x224x224 \
      --synthetic-samples 4096 --batch-size 256 --out '$R/ladder_resnet50_synthetic'" > "$R/other.log" 2>&1 &
  wait; cat "$R/sr.log" "$R/other.log"
  ;;
rest)
  # issue 6's remaining GPU results: the ResNet-50 ladder and the claims table (split across GPUs)
  CUDA_VISIBLE_DEVICES=0 run 560 python3 -m cnnpar bench --device cuda --model resnet50 --data synthetic \
      --image-shape 3x224x224 --synthetic-samples 4096 --batch-size 256 --out "$R/ladder_resnet50_synthetic" \
      > "$R/ladder50.log" &
  CUDA_VISIBLE_DEVICES=1 run 560 python3 -m cnnpar bench --claims --device cuda --out "$R/claims" > "$R/claims.log" &
  wait; cat "$R/ladder50.log" "$R/claims.log"
  ;;
verify)
  # what session 2 wrote without a GPU (notes/gpu.md): the CUDA tests (nvJPEG decode, batched
  # resize, stream safety), loop vs batched resize per batch and end to end, the new cifar10-speed
  # preset beside airbench94, and DDP with worker processes for in-memory data (issue 3's 1.97x)
  run 150 python3 -m pytest -q -m gpu tests
  run 150 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cuda --profile \
      --out "$R/jpeg_decode_cuda.csv"
  run 330 python3 benchmarks/speed_records.py --parts jpeg,speedrun --out "$R/speed_records_verify.csv"
  [ "$GPUS" -ge 2 ] && run 200 python3 benchmarks/ddp_scaling.py --world-sizes 1,2 --workers 2 \
      --out "$R/ddp_scaling_resnet50_workers2"
  ;;
s5cifar)
  # session 5, call A (two H200s, used independently): GPU 0 the batch-size search's GPU tests, a
  # fixed batch 64 against --batch-size auto (issue 15 item 2), then the claims table (item 5);
  # GPU 1 the CIFAR-10 record beside airbench94_muon (issue 13 item 1)
  LOG_FILTER='Warning|warn\('  # this phase's log display
  ( export CUDA_VISIBLE_DEVICES=0
    logged gpu_tests_step 120 python3 -m pytest -q -s -m gpu tests/unit/test_batch_size.py tests/unit/test_train_step.py
    TAIL=12 logged batch_auto 300 python3 benchmarks/batch_auto.py --data .devdata/cifar10.npz --model resnet18 \
        --epochs 10 --cases 64,auto --target 0.80 --out "$R/batch_auto.csv"
    TAIL=40 logged claims 200 python3 -m cnnpar bench --claims --device cuda --out "$R/claims" ) > "$R/gpu0.out" 2>&1 &
  ( export CUDA_VISIBLE_DEVICES=1
    TAIL=40 logged record 500 python3 benchmarks/cifar10_record.py --budget-s 480 --out "$R/cifar10_record.csv" \
        ${RECORD_ARGS:-} ) > "$R/gpu1.out" 2>&1 &
  wait; cat "$R/gpu0.out" "$R/gpu1.out"
  ;;
s5b)
  # session 5, call B (two H200s): GPU 0 the ResNet-50 ladder, the tuner, batch auto again (after its
  # rule changed); GPU 1 the cifar10-record preset through the CLI with one switch changed at a time
  # (call A measured 10 % accuracy on CUDA, 90.9 % on the CPU), then the doctor on the photos
  LOG_FILTER='Warning|warn\('  # this phase's log display
  ( export CUDA_VISIBLE_DEVICES=0
    TAIL=30 logged ladder50 200 python3 -m cnnpar bench --device cuda --model resnet50 --data synthetic \
        --image-shape 3x224x224 --synthetic-samples 4096 --batch-size 256 --budget-s 170 \
        --out "$R/ladder_resnet50_synthetic"
    start=$(date +%s)
    TAIL=30 logged tune50 240 python3 -m cnnpar tune --model resnet50 --data synthetic --image-shape 3x224x224 \
        --budget-s 200 --out "$R/tuned_resnet50.toml"
    echo "tune wall: $(( $(date +%s) - start )) s"
    TAIL=6 logged batch_auto2 120 python3 benchmarks/batch_auto.py --data .devdata/cifar10.npz --model resnet18 \
        --epochs 10 --cases auto --target 0.80 --out "$R/batch_auto_rule10.csv" ) > "$R/gpu0.out" 2>&1 &
  ( export CUDA_VISIBLE_DEVICES=1
    rec="python3 -m cnnpar train --preset cifar10-record --data .devdata/cifar10.npz --eval-every 1 --no-progress \
        --out-dir /tmp/dbg"
    TAIL=14 logged rec_as_is 100 $rec --name as_is
    TAIL=14 logged rec_eager_eval 100 $rec --name eager_eval --no-compile-eval
    TAIL=14 logged rec_no_compile 100 $rec --name no_compile --compile off --no-compile-eval
    TAIL=40 logged doctor50 260 python3 -m cnnpar doctor --data .devdata/imagenet_rep --model resnet50 --try 1 \
        --measure-steps 10 --report-dir "$R/doctor_resnet50_photos" ) > "$R/gpu1.out" 2>&1 &
  wait; cat "$R/gpu0.out" "$R/gpu1.out"
  ;;
s5c)
  # session 5, call C (two H200s): DDP 1 -> 2 GPUs through the one train step (eager at both sizes);
  # then GPU 0 `cnnpar compare` torch / keras-torch / keras-jax (issue 14; keras wheels in .whl/keras)
  # beside GPU 1 the record preset eager (compile NaNs on CUDA: call B) with airbench94_muon; then
  # compare --devices 2 where a framework has a data-parallel API
  LOG_FILTER='Warning|warn\('  # this phase's log display
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/keras/*.whl
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1
  TAIL=14 logged ddp_scaling 180 python3 benchmarks/ddp_scaling.py --world-sizes 1,2 --out "$R/ddp_scaling_resnet50"
  ( export CUDA_VISIBLE_DEVICES=0
    TAIL=30 logged compare1 200 python3 -m cnnpar compare --frameworks torch,keras-torch,keras-jax \
        --data .devdata/mnist.npz --epochs 3 --batch-size 128 --out "$R/frameworks_h200" ) > "$R/gpu0.out" 2>&1 &
  ( export CUDA_VISIBLE_DEVICES=1
    TAIL=12 logged record_eager 230 python3 benchmarks/cifar10_record.py --seeds 5 --budget-s 220 \
        --set speed.compile=off,speed.compile_eval=false --out "$R/cifar10_record_eager.csv" ) > "$R/gpu1.out" 2>&1 &
  wait; cat "$R/gpu0.out" "$R/gpu1.out"
  TAIL=20 logged compare2 100 python3 -m cnnpar compare --frameworks torch,keras-jax --devices 2 \
      --data .devdata/mnist.npz --epochs 3 --batch-size 256 --out "$R/frameworks_h200x2"
  ;;
s5d)
  # session 5, call D (one H200): the doctor on the README's CIFAR-10 ResNet-18 command with the old
  # batch 64 (issue 15 item 3: it should search and recommend a batch), then, when RECORD=1, the
  # record preset compiled again after the NaN fix, beside airbench94_muon
  LOG_FILTER='Warning|warn\('  # this phase's log display
  [ "${DOCTOR:-1}" = 1 ] && TAIL=40 logged doctor18 150 python3 -m cnnpar doctor --data .devdata/cifar10.npz --model resnet18 --batch-size 64 \
      --try 1 --measure-steps 10 --report-dir "$R/doctor_resnet18_b64"
  [ -n "${RECORD:-}" ] && TAIL=12 logged record 230 python3 benchmarks/cifar10_record.py --seeds 5 --budget-s "${RECORD_BUDGET:-220}" \
      --out "$R/cifar10_record_fixed.csv"
  ;;
claims_ladder)
  # issue 15 item 5: the claims table and the ResNet-50 ladder, one after the other on one H200, each
  # expected within 3 minutes (the claims keep a 170 s budget by default; the ladder is given one);
  # `timeout 200` only guards the call
  LOG_FILTER='Warning|warn\('  # this phase's log display
  TAIL=40 logged claims 200 python3 -m cnnpar bench --claims --device cuda --out "$R/claims"
  TAIL=40 logged ladder50 200 python3 -m cnnpar bench --device cuda --model resnet50 --data synthetic \
      --image-shape 3x224x224 --synthetic-samples 4096 --batch-size 256 --budget-s 170 \
      --out "$R/ladder_resnet50_synthetic"
  ;;
s6a)
  # session 6, call A (one H200): issue 11's GPU decoder after the two-stage feeder (and a split
  # backend, since removed: it measured no faster than nvImageCodec alone): the CUDA decode tests, decoder rows per batch
  # and through the two-thread feeder, then ResNet-50 224 end to end from the photos per variant
  TAIL=6 logged gpu_tests 150 python3 -m pytest -q -m gpu tests/unit/test_gpu_decode.py tests/unit/test_feeder.py
  TAIL=40 logged jpeg_decode 150 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cuda \
      --out "$R/jpeg_decode_cuda.csv"
  V=nvimgcodec:14:0,gpu:14:0,nvimgcodec:4:0,gpu:14:0:pipe=0,nvimgcodec:4:0:threads=4,nvimgcodec:14:0.3
  TAIL=14 logged jpeg_pipeline 300 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --budget-s "${PIPE_BUDGET:-230}" --variants "${VARIANTS:-$V}" --out "$R/jpeg_pipeline.csv"
  ;;
s6b)
  # session 6, call B (one H200): why nvImageCodec and the split lose during training (each decoder
  # beside a spinning Python thread; the split's shares), end to end with one-thread stages and a
  # short GIL switch interval; then the ResNet-50 ladder after its one-compile rework (issue 15)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^.?\[|^\s*$'  # this phase's log display
  TAIL=40 logged jpeg_decode 150 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cuda \
      --gil --repeats 3 --out "$R/jpeg_decode_cuda.csv"
  V=nvimgcodec:14:0,nvimgcodec:14:0:switch=0.0002,gpu:14:0:switch=0.0002
  TAIL=8 logged jpeg_pipeline 200 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --budget-s "${PIPE_BUDGET:-140}" --variants "${VARIANTS:-$V}" --out "$R/jpeg_pipeline.csv"
  start=$(date +%s)
  TAIL=30 logged ladder50 200 python3 -m cnnpar bench --device cuda --model resnet50 --data synthetic \
      --image-shape 3x224x224 --synthetic-samples 4096 --batch-size 256 --budget-s 170 \
      --out "$R/ladder_resnet50_synthetic"
  echo "ladder wall: $(( $(date +%s) - start )) s"
  TAIL=4 logged ladder_gpu_test 120 python3 -m pytest -q -m gpu tests/unit/test_ladder_time.py
  ;;
s6c)
  # session 6, call C (one H200): ResNet-50 end to end from the photos with nvImageCodec driven from
  # spawned worker processes (a GIL each), beside nvJPEG in-process and the CPU workers, same call
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^.?\[|^\s*$'  # this phase's log display
  V=nvimgcodec-workers:14:0,gpu:14:0,nvimgcodec-workers:8:0,cpu:14:0
  TAIL=8 logged jpeg_pipeline 290 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --budget-s "${PIPE_BUDGET:-200}" --variants "${VARIANTS:-$V}" --out "$R/jpeg_pipeline.csv"
  ;;
s6d)
  # session 6, call D (one H200): the doctor's batch advice for a user's fixed batch 64 (issue 15, on
  # synthetic CIFAR-sized data: the carry limit leaves no room for CIFAR-10 beside the photos), then
  # nvImageCodec in the workers (at the call, with raw=1: whole photos handed over, crop and resize
  # in the training process; measured slower, since removed)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^.?\[|^\s*$'  # this phase's log display
  TAIL=24 logged doctor18 120 python3 -m cnnpar doctor --data synthetic --image-shape 3x32x32 --synthetic-samples 50000 \
      --model resnet18 --batch-size 64 --try 1 --measure-steps 10 --report-dir "$R/doctor_resnet18_b64"
  V=nvimgcodec-workers:14:0,nvimgcodec-workers:8:0
  TAIL=6 logged jpeg_pipeline 200 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --budget-s "${PIPE_BUDGET:-120}" --variants "${VARIANTS:-$V}" --out "$R/jpeg_pipeline.csv"
  ;;
tune50)
  # issue 15 item 4: the tuner on ResNet-50, which must end by 220 s and leave tuned.toml
  LOG_FILTER='Warning|warn\('; LOG_TAIL=40  # this phase's log display
  start=$(date +%s)
  logged tune50 240 python3 -m cnnpar tune --model resnet50 --data synthetic --image-shape 3x224x224 \
      --budget-s 200 --out "$R/tuned_resnet50.toml"
  echo "tune wall: $(( $(date +%s) - start )) s"; cat "$R/tuned_resnet50.toml" 2>/dev/null | head -16
  ;;
record)
  # issue 13.1: the cifar10-record preset (a warm-up run, then 5 seeds) beside airbench94_muon (its
  # warm-up run, then 5 runs), train + TTA eval timed as each times itself. Needs, carried along:
  # .devdata/airbench/airbench94_muon.py (python benchmarks/cifar10_record.py --fetch-airbench GIT_DIR).
  # RECORD_ARGS: more flags, e.g. --airbench-gpu 1 on two GPUs, --variant speed.compile=max-autotune-no-cudagraphs
  run 540 python3 benchmarks/cifar10_record.py --seeds "${SEEDS:-5}" ${RECORD_ARGS:-} --out "$R/cifar10_record.csv"
  cat "$R/cifar10_record.md"
  ;;
s7a)
  # session 7, call A (one H200): nvJPEG's hardware backend through ctypes (--decode hardware): its CUDA
  # test beside the decode/feeder tests, decode-only rows (raw, whole call, beside a spinning Python
  # thread, pipelined) against torchvision's nvJPEG, then ResNet-50 end to end from the photos
  TAIL=15 logged gpu_tests 150 python3 -m pytest -q -m gpu tests/unit/test_hardware_decode.py \
      tests/unit/test_gpu_decode.py tests/unit/test_feeder.py
  TAIL=45 logged jpeg_decode 150 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cuda \
      --backends "${BACKENDS:-nvjpeg,hardware}" --gil --out "$R/jpeg_decode_cuda.csv"
  TAIL=12 logged jpeg_pipeline "${E2E_S:-330}" python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:graphs=on,gpu:14:0}" --budget-s "${E2E_BUDGET:-240}" \
      --out "$R/jpeg_pipeline.csv"
  ;;
s7b)
  # session 7, call B (one H200): after call A, the resize in fewer torch calls and the engines as the
  # default. The engines' CUDA test, decode-only rows, end to end (two threads against one), then the
  # user's command with every default (the decode line, batch auto, graphs decision) on the photos
  TAIL=6 logged gpu_tests 100 python3 -m pytest -q -m gpu tests/unit/test_hardware_decode.py
  TAIL=20 logged jpeg_decode 100 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cuda \
      --backends nvjpeg,hardware --out "$R/jpeg_decode_cuda.csv"
  TAIL=12 logged jpeg_pipeline 230 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:pipe=0,gpu:14:0}" --budget-s 170 --out "$R/jpeg_pipeline.csv"
  TAIL=25 logged train_default 150 python3 -m cnnpar train --data .devdata/imagenet_rep --model resnet50 --epochs 3 \
      --out-dir /tmp/runs --no-progress
  ;;
s7c)
  # session 7, call C (one H200): call B's end-to-end benchmark printed nothing in 230 s and the default
  # train run hung after its last line. With watchdogs that print every thread's stack: the engines'
  # lifecycle in child processes, then end to end, then the user's default command
  TAIL=60 logged lifecycle 120 python3 benchmarks/hw_lifecycle.py --folder .devdata/imagenet_sample --timeout-s 20
  TAIL=60 logged jpeg_pipeline 200 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants "${VARIANTS:-hardware:14:0,gpu:14:0,hardware:14:0:pipe=0}" --budget-s 120 --watchdog-s 185 \
      --out "$R/jpeg_pipeline.csv"
  TAIL=40 logged train_default 130 timeout -s ABRT 120 python3 -X faulthandler -m cnnpar train \
      --data .devdata/imagenet_rep --model resnet50 --epochs 2 --out-dir /tmp/runs --no-progress
  ;;
s7d)
  # session 7, call D (one H200): every nvJPEG call on one thread per decoder (call C: the shared state
  # hung inside nvjpegDecodeBatched). The same three checks as call C, shorter
  TAIL=20 logged lifecycle 90 python3 benchmarks/hw_lifecycle.py --folder .devdata/imagenet_sample --timeout-s 15
  TAIL=8 logged jpeg_pipeline 170 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants "${VARIANTS:-hardware:14:0,gpu:14:0}" --budget-s 100 --watchdog-s 160 --out "$R/jpeg_pipeline.csv"
  TAIL=12 logged train_default 125 timeout -s ABRT 115 python3 -X faulthandler -m cnnpar train \
      --data .devdata/imagenet_rep --model resnet50 --epochs 2 --out-dir /tmp/runs --no-progress ${TRAIN_ARGS:---decode hardware}
  ;;
s8a)
  # session 8, call A (one H200): the engines' lifecycle and CUDA tests after the stream syncs and the
  # closing of decoders; end to end with one epoch of each decoder under the profiler (where the time
  # goes when loader and step run together), one thread against two, high-priority feeder streams;
  # then the user's command with --decode hardware under a watchdog (does it exit now?)
  TAIL=20 logged lifecycle 90 python3 benchmarks/hw_lifecycle.py --folder .devdata/imagenet_sample --timeout-s 15
  TAIL=12 logged gpu_tests 100 python3 -m pytest -q -m gpu tests/unit/test_hardware_decode.py
  TAIL=120 logged jpeg_pipeline 300 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants "${VARIANTS:-hardware:14:0:trace=1,gpu:14:0:trace=1,hardware:14:0:pipe=0,hardware:14:0:prio=-1}" \
      --budget-s "${E2E_BUDGET:-210}" --watchdog-s 290 --out "$R/jpeg_pipeline.csv"
  mv "$R"/trace_*.json.gz "$OUTDIR"/ 2>/dev/null  # files of their own: results.tgz stays small
  TAIL=12 logged train_hardware 110 timeout -s ABRT 100 python3 -X faulthandler -m cnnpar train \
      --data .devdata/imagenet_rep --model resnet50 --epochs 2 --out-dir /tmp/runs --no-progress --decode hardware
  ;;
s8c)
  # session 8, call C (one H200): call A's trace showed the GPU idle 39 % of an epoch, waiting for launches
  # from a training thread that shares the GIL with the resize thread. The resize moved into the training
  # thread (one batch ahead, side stream) against the two-thread feeder in the same call; graphs on with
  # it, traced; the engines' CUDA tests (a cut file now kept from them); the decode-only rows.
  # (resize=training was removed after call Q, no faster: this phase ran at a56a9be and now stops at it)
  TAIL=6 logged gpu_tests 100 python3 -m pytest -q -m gpu tests/unit/test_hardware_decode.py
  TAIL=150 logged jpeg_pipeline 330 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants "${VARIANTS:-hardware:14:0:resize=training:trace=1,hardware:14:0,gpu:14:0:resize=training,hardware:14:0:graphs=on:resize=training:trace=1}" \
      --budget-s "${E2E_BUDGET:-230}" --watchdog-s 320 --out "$R/jpeg_pipeline.csv"
  mv "$R"/trace_*.json.gz "$OUTDIR"/ 2>/dev/null
  TAIL=20 logged jpeg_decode 100 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cuda \
      --backends nvjpeg,hardware --out "$R/jpeg_decode_cuda.csv"
  ;;
s8d)
  # session 8, call D (one H200): calls A and C point at the host: the compiled step's Python launches
  # (each Triton launch hands the GIL over) against the feeder's. Inductor's C++ wrapper launches the
  # step's kernels without Python: against the plain wrapper in the same call; the cut-file CUDA test
  # (ran at af67c20; its last variant's resize=training has been removed since)
  TAIL=6 logged gpu_tests 100 python3 -m pytest -q -m gpu tests/unit/test_hardware_decode.py
  TAIL=40 logged jpeg_pipeline 400 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants "${VARIANTS:-hardware:14:0:cpp=1,hardware:14:0,gpu:14:0:cpp=1,hardware:14:0:cpp=1:resize=training}" \
      --budget-s "${E2E_BUDGET:-300}" --watchdog-s 390 --out "$R/jpeg_pipeline.csv"
  ;;
s8e)
  # session 8, call E (one H200): which part of `cnnpar train --decode hardware` hangs at exit. Each case
  # runs in the background; a process still alive 8 s after its "done:" line is reported and killed.
  # A: as a user runs it; B: no validation split (one decoder fewer); C: the engines' handles never closed;
  # D: no worker processes (none forked after the engines started); E: no batch search, no TensorBoard
  # (ran at f3f45eb with a hang_case of its own that could also attach cuda-gdb, which failed to attach in
  # call R; now the shared hang_case above, stacks from /proc)
  export AFTER_DONE=8 HANG_LIMIT=100
  ARGS="train --data .devdata/imagenet_rep --model resnet50 --epochs 1 --out-dir /tmp/runs --no-progress --decode hardware"
  hang_case exit_a python3 -m cnnpar $ARGS
  hang_case exit_b python3 -m cnnpar $ARGS --val-fraction 0
  hang_case exit_c python3 -c "import sys; import cnnpar.data.nvjpeg_hw as h; h.HardwareJpegDecoder.close = lambda self: None; \
from cnnpar.cli import main; sys.exit(main(sys.argv[1:]))" $ARGS
  hang_case exit_d python3 -m cnnpar $ARGS --workers 0
  hang_case exit_e python3 -m cnnpar $ARGS --batch-size 128 --no-tensorboard
  cat "$R"/exit_*.summary
  ;;
s9a)
  # session 9, call A (one H200): the default GPU paths after session 8's refactors (CUDA tests), then
  # issue 11 end to end with graphs on beside the engines: call P saw nvJPEG's per-image event waits
  # stall behind the step's replays. High-priority feeder streams (their kernels jump the replay's
  # queue) and several decodes in flight (each waiting on its own) are the two cures tried, alone and
  # together; the compiled resize chunks without graphs; nvJPEG (the default decoder) as it is and cured
  # (ran at 9f30f42; dthreads= and cchunk= were removed after call T, no faster: this phase now stops at them)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  TAIL=14 logged gpu_tests 120 python3 -m pytest -v -m gpu tests/unit/test_gpu_decode.py \
      tests/unit/test_hardware_decode.py tests/unit/test_feeder.py
  V=hardware:14:0,hardware:14:0:graphs=on:prio=-1,hardware:14:0:graphs=on:dthreads=3
  V=$V,hardware:14:0:graphs=on:dthreads=3:prio=-1,hardware:14:0:cchunk=1,gpu:14:0,gpu:14:0:graphs=on:dthreads=3:prio=-1
  TAIL=40 logged jpeg_pipeline 430 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants "${VARIANTS:-$V}" --budget-s "${E2E_BUDGET:-300}" --watchdog-s 420 --out "$R/jpeg_pipeline.csv"
  ;;
s9c)
  # session 9, call C (one H200): call A (call-s/) hung in its third variant: the garbage collector
  # closed a JPEG-engines decoder whose executor thread it had already ended (nvjpeg_hw.LibraryThread
  # now). Again after the fix: the CUDA tests, then the variants call A did not reach, with the plain
  # engines row for comparison in the same call (ran at fb9d371; dthreads= and cchunk= removed since)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  TAIL=6 logged gpu_tests 120 python3 -m pytest -q -m gpu tests/unit/test_gpu_decode.py \
      tests/unit/test_hardware_decode.py tests/unit/test_feeder.py
  V=hardware:14:0,hardware:14:0:graphs=on:dthreads=3,hardware:14:0:cchunk=1,gpu:14:0
  V=$V,hardware:14:0:graphs=on:dthreads=3:cchunk=1
  TAIL=40 logged jpeg_pipeline 400 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants "${VARIANTS:-$V}" --budget-s "${E2E_BUDGET:-250}" --watchdog-s 380 --out "$R/jpeg_pipeline.csv"
  ;;
s9d)
  # session 9, call D (one H200): call B (call-u/) found the exit hang only where the run had worker
  # processes and searched its batch or wrote TensorBoard files (D and E exited). The main thread sat in
  # poll(). Now each process writes its own Python stacks once its command is done and it has not left
  # 15 s later (CNNPAR_EXIT_STACKS), and is given 150 s to leave. A: as a user runs it; G: the default
  # decoder (nvJPEG) as a user runs it; H: fixed batch 64, TensorBoard on; I: batch search, no TensorBoard
  ARGS="train --data .devdata/imagenet_rep --model resnet50 --epochs 1 --no-progress"
  export AFTER_DONE=${AFTER_DONE:-150} HANG_LIMIT=${HANG_LIMIT:-330}
  CNNPAR_EXIT_STACKS=$R/exit_a_stacks.txt hang_case exit_a python3 -m cnnpar $ARGS --out-dir /tmp/runs_a --decode hardware &
  CNNPAR_EXIT_STACKS=$R/exit_g_stacks.txt hang_case exit_g python3 -m cnnpar $ARGS --out-dir /tmp/runs_g &
  CNNPAR_EXIT_STACKS=$R/exit_h_stacks.txt hang_case exit_h python3 -m cnnpar $ARGS --out-dir /tmp/runs_h --decode hardware \
      --batch-size 64 &
  CNNPAR_EXIT_STACKS=$R/exit_i_stacks.txt hang_case exit_i python3 -m cnnpar $ARGS --out-dir /tmp/runs_i --decode hardware \
      --no-tensorboard &
  wait
  for f in "$R"/exit_*.summary; do head -2 "$f"; tail -2 "$f"; done
  for f in "$R"/exit_*_stacks.txt; do [ -s "$f" ] && { echo "== $f"; grep -v -E "threading.py|^\s*$" "$f" | head -60; }; done
  ;;
s9e)
  # session 9, call E (one H200): the slow exit found in call D (call-v/: torch's exit hook joining each
  # persistent worker for 5 s) after the fix (the run stops its loaders' workers when it ends). The user's
  # command, 3 epochs, one after the other: the JPEG engines, then the default decoder (nvJPEG); each must
  # leave within a few seconds of its last line (stacks written if it has not after 15 s)
  ARGS="train --data .devdata/imagenet_rep --model resnet50 --epochs 3 --no-progress"
  export AFTER_DONE=${AFTER_DONE:-45} HANG_LIMIT=${HANG_LIMIT:-200}
  CNNPAR_EXIT_STACKS=$R/exit_a_stacks.txt hang_case exit_a python3 -m cnnpar $ARGS --out-dir /tmp/runs_a --decode hardware
  CNNPAR_EXIT_STACKS=$R/exit_g_stacks.txt hang_case exit_g python3 -m cnnpar $ARGS --out-dir /tmp/runs_g
  for f in "$R"/exit_*.summary; do head -1 "$f"; tail -4 "$f"; done
  for f in "$R"/exit_*_stacks.txt; do [ -s "$f" ] && { echo "== $f"; grep -v -E "threading.py|_feed|^\s*$" "$f" | head -40; }; done
  grep -h -E "^decode|^batch size|^cuda graphs" "$R"/exit_a.log "$R"/exit_g.log
  ;;
s10a)
  # for the next session (one H200; written in session 9, not yet run): the CUDA tests after session 9's
  # changes (nvImageCodec's wheels carried, for the CPU-path comparison), then the user's command with no
  # decode flag (the rule should choose the engines and say so) and its exit; notes/gpu.md has predictions
  TAIL=14 logged gpu_tests 150 python3 -m pytest -v -m gpu tests/unit/test_gpu_decode.py \
      tests/unit/test_hardware_decode.py tests/unit/test_feeder.py
  user_run .devdata/imagenet_rep 220
  ;;
s10c)
  # session 10, call A (one H200): the CUDA tests after session 9's changes; the user's command with no
  # decode flag on a folder 4x larger (24,000 photos: an epoch of ~90 batches rather than ~20, so the
  # epoch's start and end weigh less); the engines end to end on that folder at batch 256 and 512 and
  # nvJPEG at 256; the engines on the usual 6,000 photos for the same call's comparison.
  # notes/gpu.md (session 10) has the predictions
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  TAIL=6 logged gpu_tests 150 python3 -m pytest -q -m gpu tests/unit/test_gpu_decode.py \
      tests/unit/test_hardware_decode.py tests/unit/test_feeder.py
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  TAIL=8 logged jpeg_pipeline80 250 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:batch=512,gpu:14:0}" --budget-s 170 --watchdog-s 245 \
      --out "$R/jpeg_pipeline80.csv"
  TAIL=4 logged jpeg_pipeline20 100 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants hardware:14:0 --watchdog-s 95 --out "$R/jpeg_pipeline20.csv"
  ;;
s10d)
  # session 10, call B (one H200): the resize as two Triton kernels (the default on CUDA since 1ad37c6)
  # against the matrix products, end to end on the 24,000 photos; the user's command with no flags
  # (the batch search now starts at 256 for photos decoded on the GPU); the decode-only rows, with the
  # resize beside a spinning Python thread. notes/gpu.md (session 10) has the predictions
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  TAIL=6 logged gpu_tests 120 python3 -m pytest -q -m gpu tests/unit/test_resize_kernel.py tests/unit/test_gpu_decode.py \
      tests/unit/test_hardware_decode.py tests/unit/test_feeder.py
  make_rep 80 .devdata/imagenet_rep80
  TAIL=8 logged jpeg_pipeline80 250 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0:kernel=fused,hardware:14:0:kernel=matmul,gpu:14:0:kernel=fused}" \
      --budget-s 170 --watchdog-s 245 --out "$R/jpeg_pipeline80.csv"
  user_run .devdata/imagenet_rep80 160
  TAIL=30 logged jpeg_decode 120 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cuda \
      --backends hardware,nvjpeg --gil --repeats 3 --out "$R/jpeg_decode_cuda.csv"
  ;;
s10e)
  # session 10, call C (one H200): the decode stage with NumPy crop boxes (c15b579) beside the fused resize:
  # end to end on the 24,000 and the 6,000 photos, the engines' stages beside a spinning Python thread
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  TAIL=6 logged gpu_tests 120 python3 -m pytest -q -m gpu tests/unit/test_resize_kernel.py tests/unit/test_gpu_decode.py \
      tests/unit/test_hardware_decode.py tests/unit/test_feeder.py
  make_rep 80 .devdata/imagenet_rep80
  TAIL=8 logged jpeg_pipeline80 200 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,gpu:14:0}" --budget-s 120 --watchdog-s 195 --out "$R/jpeg_pipeline80.csv"
  TAIL=4 logged jpeg_pipeline20 100 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants hardware:14:0 --watchdog-s 95 --out "$R/jpeg_pipeline20.csv"
  TAIL=30 logged jpeg_decode 100 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cuda \
      --backends hardware --gil --repeats 2 --out "$R/jpeg_decode_cuda.csv"
  ;;
s10f)
  # session 10, call D (one H200): each epoch prepares the next (1cf04f3) and a batch's small fields cross
  # from the workers as arrays (a886450): the engines end to end on the 24,000 and the 6,000 photos, then the
  # user's command with no flags on the 6,000 (the issue's folder)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  TAIL=6 logged gpu_tests 120 python3 -m pytest -q -m gpu tests/unit/test_resize_kernel.py tests/unit/test_gpu_decode.py \
      tests/unit/test_hardware_decode.py tests/unit/test_feeder.py
  make_rep 80 .devdata/imagenet_rep80
  TAIL=4 logged jpeg_pipeline80 130 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants hardware:14:0 --watchdog-s 125 --out "$R/jpeg_pipeline80.csv"
  TAIL=4 logged jpeg_pipeline20 100 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep \
      --variants hardware:14:0 --watchdog-s 95 --out "$R/jpeg_pipeline20.csv"
  user_run .devdata/imagenet_rep 150
  ;;
s10g)
  # session 10, call E (one H200): at the same revision as call D, the user's command with no flags on the
  # 24,000 photos (epochs of 75 batches: what a prepared epoch saves weighs little there), then the engines'
  # benchmark row on them again, for the spread between calls (call D 5,194, call Z 5,484)
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 160
  TAIL=4 logged jpeg_pipeline80 130 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants hardware:14:0 --watchdog-s 125 --out "$R/jpeg_pipeline80.csv"
  ;;
s10h)
  # session 10, call F (one H200, the last ~4 min of device time): calls D and E (5,194 and 5,120 img/s on the
  # 24,000 photos) ran below call Z (5,484), one revision before the prepared epochs and the array fields:
  # the prepared epochs off and on, in one call
  make_rep 80 .devdata/imagenet_rep80
  TAIL=4 logged jpeg_pipeline80 200 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants hardware:14:0:prepare=0,hardware:14:0:prepare=1 --watchdog-s 195 --out "$R/jpeg_pipeline80.csv"
  ;;
s11a)
  # session 11, call A (one H200): the CUDA tests (the kernels' int64 offsets among them); on the 24,000 photos
  # the prepared epochs off and on (session 10's unrun call F), then the same engines run with py-spy sampling
  # who holds the GIL in the timed epochs (carry py-spy's wheel in .whl/); jpeg_decode's GPU stage beside a
  # spinning thread (its array-field fix). notes/gpu.md (session 11) has the predictions
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  TAIL=6 logged gpu_tests 120 python3 -m pytest -q -m gpu tests/unit/test_resize_kernel.py tests/unit/test_gpu_decode.py \
      tests/unit/test_hardware_decode.py tests/unit/test_feeder.py
  make_rep 80 .devdata/imagenet_rep80
  TAIL=40 logged jpeg_pipeline80 290 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0:prepare=0,hardware:14:0:prepare=1,hardware:14:0:gil=1}" \
      --budget-s 200 --watchdog-s 285 --out "$R/jpeg_pipeline80.csv"
  TAIL=12 logged jpeg_decode 80 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --device cuda \
      --backends hardware --gil --repeats 2 --out "$R/jpeg_decode_cuda.csv"
  ;;
s11b)
  # session 11, call B (one H200): call A found the GIL held 67 % of the timed epochs, half of it by the step's
  # own launches (main thread and autograd's); CUDA graphs take those away. The engines with graphs off (the
  # default beside a GPU decoder), on, and with a 1 ms switch interval, each sampled by py-spy; nvJPEG with graphs
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  make_rep 80 .devdata/imagenet_rep80
  TAIL=12 logged jpeg_pipeline80 400 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0:gil=1,hardware:14:0:graphs=on:gil=1,hardware:14:0:switch=0.001:gil=1,gpu:14:0:graphs=on:gil=1}" \
      --budget-s 300 --watchdog-s 395 --out "$R/jpeg_pipeline80.csv"
  for f in "$R"/gil_*.summary.txt; do echo "== $f"; head -14 "$f"; done
  ;;
s11c)
  # session 11, call C (one H200): call B found the decoders starved beside graph replays with the GIL nearly
  # free (14 %): nvJPEG's blocking streams synchronise with the legacy default stream the step ran on. The
  # training thread now works on a non-blocking stream of its own beside a GPU decoder (parallel/streams.py):
  # its CUDA test, then on the 24,000 photos the legacy stream (as before), the own stream with graphs off
  # (the default) and on, and torchvision's nvJPEG with graphs on
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  TAIL=6 logged gpu_tests 90 python3 -m pytest -q -m gpu tests/unit/test_training_stream.py tests/unit/test_feeder.py
  make_rep 80 .devdata/imagenet_rep80
  TAIL=8 logged jpeg_pipeline80 400 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0:stream=legacy,hardware:14:0:gil=1,hardware:14:0:graphs=on:gil=1,gpu:14:0:graphs=on}" \
      --budget-s 300 --watchdog-s 395 --out "$R/jpeg_pipeline80.csv"
  for f in "$R"/gil_*.summary.txt; do echo "== $f"; head -6 "$f"; done
  ;;
s11d)
  # session 11, call D (one H200): `cnnpar train` with no flags on the 24,000 photos at the session's last
  # revision (the training thread on its own stream), then one engines run with py-spy's native frames: what
  # the decode thread holds the GIL for below its last Python frame (10 % of the wall time in calls ZC-ZE)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  grep -E "^training stream|^done" "$R"/default.log
  TAIL=4 logged jpeg_pipeline80 150 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0:gil=native}" --watchdog-s 145 --out "$R/jpeg_pipeline80.csv"
  for f in "$R"/gil_*.summary.txt; do echo "== $f"; head -40 "$f"; done
  ;;
s11e)
  # session 11, call E (one H200): encoded batches in shared slots made once (data/byte_slots.py) instead of a
  # segment per batch, unmapped with the GIL held in the decode thread (call ZF): the CUDA tests; on the 24,000
  # photos the old way, slots pinned (the default) and slots unpinned; then `cnnpar train` with no flags
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  TAIL=6 logged gpu_tests 120 python3 -m pytest -q -m gpu tests/unit/test_byte_slots.py tests/unit/test_training_stream.py \
      tests/unit/test_gpu_decode.py tests/unit/test_hardware_decode.py tests/unit/test_feeder.py
  make_rep 80 .devdata/imagenet_rep80
  TAIL=8 logged jpeg_pipeline80 300 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0:slots=0,hardware:14:0:gil=1,hardware:14:0:slots=unpinned}" \
      --budget-s 220 --watchdog-s 295 --out "$R/jpeg_pipeline80.csv"
  for f in "$R"/gil_*.summary.txt; do echo "== $f"; head -24 "$f"; done
  user_run .devdata/imagenet_rep80 150
  grep -E "^training stream|^done" "$R"/default.log
  ;;
s11f)
  # session 11, call F (one H200, the last ~8 min of device time): with the slots, batch 256 again (call ZG's
  # 5,934 repeated?) and batch 512, whose launches per image are half of 256's (the step's launches now hold
  # most of the GIL)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  make_rep 80 .devdata/imagenet_rep80
  TAIL=4 logged jpeg_pipeline80 300 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:batch=512}" --budget-s 200 --watchdog-s 295 \
      --out "$R/jpeg_pipeline80.csv"
  ;;
s11g)
  # session 11, call G (one H200, the last ~5 min): after the review's fixes (slots no longer page-locked, the
  # training stream entered last): the CUDA tests, then `cnnpar train` with no flags on the 24,000 photos
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  TAIL=6 logged gpu_tests 90 python3 -m pytest -q -m gpu tests/unit/test_byte_slots.py tests/unit/test_training_stream.py \
      tests/unit/test_feeder.py
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 140
  grep -E "^training stream|^encoded|^done" "$R"/default.log
  ;;
s12a)
  # session 12, call A (one H200): issue 11's end to end at the current revision, slots pageable since the
  # review: the default, the same under py-spy (gil_profile after its window and CPU fixes), and without slots
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'  # this phase's log display
  make_rep 80 .devdata/imagenet_rep80
  TAIL=6 logged jpeg_pipeline80 330 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:gil=1,hardware:14:0:slots=0}" --budget-s 230 \
      --watchdog-s 325 --out "$R/jpeg_pipeline80.csv"
  ;;
s12b)
  # session 12, call B (one H200): issue 13.2, where ResNet-50's step goes (cnnpar profile: the kernel
  # classes' shares) and inductor levers against the defaults and the plain compiled loop, MFU beside img/s
  TAIL=12 logged step_rn50_b256 300 python3 benchmarks/step_vs_plain.py --cases resnet50:224:256 --plain compile \
      --variants "${VARIANTS:-inductor.conv_1x1_as_mm=1;inductor.coordinate_descent_tuning=1}" \
      --out "$R/step_rn50_b256.csv"
  TAIL=40 logged profile_rn50 120 python3 -m cnnpar profile --model resnet50 --format synthetic \
      --image-shape 3x224x224 --batch-size 256 --synthetic-samples 4096 --report-dir "$R/profile_rn50" \
      --prof-wait 3 --prof-active 5 --no-progress
  gzip -f "$R"/profile_rn50/trace_rank0.json
  TAIL=4 logged step_rn50_b512 100 python3 benchmarks/step_vs_plain.py --cases resnet50:224:512 --plain none \
      --variants "" --out "$R/step_rn50_b512.csv"
  ;;
s12c)
  # session 12, call C (one H200): call B's profile put 47 % of ResNet-50's kernel time in the Triton-fused
  # BatchNorm passes; coordinate-descent tuning of those kernels (killed by call B's limit while compiling),
  # with the defaults beside it, then ResNet-18 at 32 px b512 (issue 13.3) with the same lever
  TAIL=6 logged step_rn50_cdt 330 python3 benchmarks/step_vs_plain.py --cases resnet50:224:256 --plain none \
      --variants "inductor.coordinate_descent_tuning=1" --out "$R/step_rn50_cdt.csv"
  TAIL=6 logged step_rn18_b512 200 python3 benchmarks/step_vs_plain.py --cases resnet18:32:512 --plain compile \
      --variants "${VARIANTS:-inductor.coordinate_descent_tuning=1}" --out "$R/step_rn18_b512.csv"
  ;;
s12d)
  # session 12, call D (one H200, ~6 min of the last 10): batch size as the lever, cnnpar's defaults only:
  # ResNet-18 at 32 px b1024 and b2048 (issue 13.3), ResNet-50 224 b512 (issue 13.2)
  TAIL=5 logged step_rn18_big 150 python3 benchmarks/step_vs_plain.py --cases resnet18:32:1024,resnet18:32:2048 \
      --plain none --variants "" --out "$R/step_rn18_big.csv"
  TAIL=4 logged step_rn50_b512 150 python3 benchmarks/step_vs_plain.py --cases resnet50:224:512 --plain none \
      --variants "" --steps 20 --out "$R/step_rn50_b512.csv"
  ;;
s12e)
  # session 12, call E (one H200, the last ~6 min): the new --compile-tuning switch (cnnpar's own step, not an
  # inductor patch) against the defaults at ResNet-18 32 px b2048, where the defaults ran 96,917 img/s (call D)
  TAIL=5 logged step_rn18_b2048_tuning 270 python3 benchmarks/step_vs_plain.py --cases "${CASES:-resnet18:32:2048}" \
      --plain none --variants "compile_tuning=on" --out "$R/step_rn18_b2048_tuning.csv"
  ;;
s13a)
  # session 13, calls C and D (ran at 2efb018 with stem_space_to_depth=1, when the switch was a bool and off by
  # default; since it is on by default with CUDA the defaults row has the stem and the variant turns it off)
  # (one H200, ~8 min with a cold start; built in session 12, CPU-tested): issue 13.2's two
  # levers from call ZK's trace, the space-to-depth stem and aten's max-pool backward, each against the defaults
  # at ResNet-50 224 b256, then the stem's CUDA test
  TAIL=5 logged step_rn50_s2d 420 python3 benchmarks/step_vs_plain.py --cases "${CASES:-resnet50:224:256}" \
      --plain none --variants "${VARIANTS:-stem_space_to_depth=off;fallback.max_pool2d_with_indices_backward=1}" \
      --out "$R/step_rn50_s2d.csv"
  TAIL=4 logged gpu_tests 60 python3 -m pytest -q -m gpu tests/unit/test_stem.py
  ;;
s13b)
  # session 13, call E (one H200, ~7 min with a cold start): the space-to-depth stem as the CUDA default (auto:
  # on with CUDA since call ZR): issue 11's photos with the stem off and at the new default; ResNet-50 b512 at the
  # new default and with inductor's autotuned pointwise/reduction configs (+1.6 % at b256 in call ZR); then
  # `cnnpar train` from the photos as a user runs it, for its printed lines (the stem's among them)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  make_rep 80 .devdata/imagenet_rep80
  TAIL=6 logged jpeg_pipeline80 240 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0:stem=off,hardware:14:0}" --budget-s 160 \
      --watchdog-s 235 --out "$R/jpeg_pipeline80.csv"
  TAIL=5 logged step_rn50_b512 240 python3 benchmarks/step_vs_plain.py --cases resnet50:224:512 --plain none \
      --variants "inductor.max_autotune_pointwise=1" --out "$R/step_rn50_b512.csv"
  TAIL=30 logged train_photos 110 python3 -m cnnpar train --data .devdata/imagenet_rep --model resnet50 --epochs 1 \
      --out-dir /tmp/runs --no-progress
  ;;
s14a)
  # session 14, call A (one H200, ~6 min with a cold start): every GPU-marked test at this revision (session 13's
  # profile mend first runs here), then the ladder's stem rung beside channels_last and compile (never run on a GPU)
  TAIL=12 logged gpu_tests 250 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=5
  TAIL=16 logged ladder_rn50 220 python3 -m cnnpar bench --device cuda --model resnet50 --data synthetic \
      --image-shape 3x224x224 --synthetic-samples 4096 --batch-size 256 --only channels_last,stem_space_to_depth,compile \
      --out-dir "$R/bench"
  ;;
s14b)
  # session 14, call B (one H200, ~7 min): issue 11 at this revision: `cnnpar train` from the 24,000 photos as a
  # user runs it (the stem on since session 13; the validation-overlap caveat), then the benchmark's default with
  # its fourth epoch under the profiler (where the GPU's time goes with the stem) and at batch 384
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  TAIL=40 logged jpeg_pipeline80 230 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0:trace=1,hardware:14:0:batch=384}" --budget-s 150 \
      --watchdog-s 225 --out "$R/jpeg_pipeline80.csv"
  ;;
s14c)
  # session 14, call E (one H200, ~5 min): CUDA's 32 hardware queues, now set by cnnpar itself: `cnnpar train`
  # from the 24,000 photos as a user runs it, then the benchmark's default and graphs on in one process
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  grep -E "^device queues" "$R"/default.log
  TAIL=6 logged jpeg_pipeline80 230 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:graphs=on}" --budget-s 150 \
      --watchdog-s 225 --out "$R/jpeg_pipeline80.csv"
  ;;
s14d)
  # session 14, call F (one H200, ~6 min): graphs kept beside the GPU decoder now that CUDA has 32 queues: `cnnpar
  # train` from the 24,000 photos as a user runs it, then the benchmark's default (graphs on by auto) and graphs off
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  grep -E "^device queues|^cuda graphs" "$R"/default.log
  TAIL=6 logged jpeg_pipeline80 230 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:graphs=off}" --budget-s 150 \
      --watchdog-s 225 --out "$R/jpeg_pipeline80.csv"
  ;;
s15a)
  # session 15, call A (one H200, ~5 min): `cnnpar train` from the 24,000 photos as a user runs it (the queue value
  # recorded at CUDA's start; each epoch's evaluation and checkpoint timed), then a `cnnpar prepare` store of them
  # and the same command from the store (issue 11.5)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  grep -E "^device queues|^cuda graphs" "$R"/default.log
  TAIL=4 logged prepare80 150 python3 -m cnnpar prepare .devdata/imagenet_rep80 --out /tmp/rep80.cnnpar --max-side 256
  TAIL=12 logged store80 170 python3 -m cnnpar train --data /tmp/rep80.cnnpar --model resnet50 --epochs 3 \
      --no-progress --out-dir /tmp/runs_store
  cp /tmp/runs_store/*/summary.json "$R/store80_summary.json" 2>/dev/null
  ;;
s15b)
  # session 15, call B (one H200, ~2.5 min with a cold start; the nvImageCodec wheels carried, not the photos): every
  # GPU-marked test at this revision
  TAIL=12 logged gpu_tests 200 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=5
  ;;
s15c)
  # session 15, call C (one H200, ~6 min; the photos carried): the store with no flags (the batch search's start for
  # photo-sized inputs; call A chose 64), then the engines against torchvision's nvJPEG end to end with CUDA's 32
  # queues (the decode default's rule was measured with 8)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  make_rep 80 .devdata/imagenet_rep80
  [ -f /tmp/rep80.cnnpar ] || TAIL=2 logged prepare80 150 python3 -m cnnpar prepare .devdata/imagenet_rep80 \
      --out /tmp/rep80.cnnpar --max-side 256
  TAIL=6 logged store80 170 python3 -m cnnpar train --data /tmp/rep80.cnnpar --model resnet50 --epochs 3 \
      --no-progress --out-dir /tmp/runs_store
  grep -E "^batch size" "$R"/store80.log
  TAIL=6 logged jpeg_pipeline80 230 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,gpu:14:0}" --budget-s 150 --watchdog-s 225 --out "$R/jpeg_pipeline80.csv"
  ;;
s15d)
  # session 15, call D (one H200, ~9.5 min): the tuner with room for its compile_tuning trial (the floor rule of
  # session 14 never ran on a GPU)
  TAIL=30 logged tune18 570 python3 -m cnnpar tune --device cuda --model resnet18 --data synthetic \
      --image-shape 3x32x32 --synthetic-samples 50000 --batch-size 2048 --budget-s 540 --out "$R/tuned_resnet18.toml"
  ;;
s15e)
  # session 15, call E (one H200, ~6 min with a cold start): issue 13.2, ResNet-50 224 b256 on device data, the
  # cnnpar defaults against inductor's cooperative reductions (BatchNorm's statistics are ~half the step's kernel
  # time, read at about a third of the memory bandwidth: call ZK), alone and with autotuned pointwise configs
  TAIL=8 logged step_rn50_coop 420 python3 benchmarks/step_vs_plain.py --cases resnet50:224:256 --plain none \
      --variants "${VARIANTS:-inductor.triton.cooperative_reductions=1;inductor.max_autotune_pointwise=1;inductor.triton.cooperative_reductions=1,inductor.max_autotune_pointwise=1}" \
      --out "$R/step_rn50_coop.csv"
  ;;
s16a)
  # session 16, call A (one H200, ~6 min with a cold start; the photos carried): the hardware decoder's CUDA tests
  # (one wait on the GPU per batch now: outputs from the decoder's own stream's pool, no wait before the call),
  # `cnnpar train` from the 24,000 photos as a user runs it (each evaluation's data wait on its epoch line), then
  # ddp_scaling at world size 1 (its workers leave by os._exit since session 15)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=8 logged gpu_tests 200 python3 -m pytest -q -m gpu tests/unit/test_hardware_decode.py \
      tests/unit/test_gpu_decode.py -p no:cacheprovider --durations=5
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  TAIL=8 logged ddp1 150 python3 benchmarks/ddp_scaling.py --world-sizes 1 --steps 60 --repeats 3 --out "$R/ddp1"
  ls "$R"/ddp1*
  ;;
s16b)
  # session 16, call B (one H200, ~8 min): issue 13.2, ResNet-50 224 b256 on device data: cnnpar's defaults beside
  # inductor's N-d tiling and tiled reductions (BatchNorm's channels-last reductions: ~half the kernel time, call
  # ZK), its mixed-order reductions, and aten's own BatchNorm kernels in place of the generated ones. An option
  # this torch lacks is dropped here, with a line, rather than stopping the run.
  V=$(python3 - "${VARIANTS:-inductor.triton.prefer_nd_tiling=1;inductor.triton.prefer_nd_tiling=1,inductor.triton.tile_reductions=1;inductor.triton.mix_order_reduction=1;fallback._native_batch_norm_legit_functional=1,fallback.native_batch_norm_backward=1}" <<'PY'
import sys
import torch._inductor.config as c
have = c.get_config_copy()
keep = []
for v in sys.argv[1].split(";"):
    missing = [k for k in (i.split("=")[0] for i in v.split(",")) if k.startswith("inductor.") and k[9:] not in have]
    if missing:
        print(f"dropped {v}: torch has no {missing}", file=sys.stderr)
    elif any(i.startswith("inductor.") and str(have[i.split('=')[0][9:]]) in ("1", "True") and i.endswith("=1")
             for i in v.split(",")) and len(v.split(",")) == 1:
        print(f"dropped {v}: already this torch's default", file=sys.stderr)
    else:
        keep.append(v)
print(";".join(keep))
PY
)
  echo "variants: $V"
  TAIL=8 logged step_rn50_bn 480 python3 benchmarks/step_vs_plain.py --cases resnet50:224:256 --plain none \
      --variants "$V" --out "$R/step_rn50_bn.csv"
  ;;
s17a)
  # for the next session (one H200, ~6 min with a cold start; the photos carried; written in session 16, not yet
  # run): the decoders' private streams (made with the CUDA runtime, never torch's pool) through their CUDA tests,
  # then `cnnpar train` from the 24,000 photos for 20 epochs with no flags: the feeder's stage streams are now kept
  # for the run, so no epoch's stage should share the training thread's stream (each epoch's rate and data wait)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=8 logged gpu_tests 200 python3 -m pytest -q -m gpu tests/unit/test_hardware_decode.py \
      tests/unit/test_gpu_decode.py -p no:cacheprovider --durations=5
  make_rep 80 .devdata/imagenet_rep80
  AFTER_DONE=30 HANG_LIMIT=330 CNNPAR_EXIT_STACKS=$R/long_stacks.txt hang_case long python3 -m cnnpar train \
      --data .devdata/imagenet_rep80 --model resnet50 --epochs 20 --no-progress --out-dir /tmp/runs_long
  cat "$R"/long.summary; grep -E "^epoch|^done" "$R"/long.log
  cp /tmp/runs_long/*/metrics.csv "$R/long_metrics.csv" 2>/dev/null
  # the first evaluation's ~2.5 s not waiting for data (ZZH): cuDNN timing its algorithms for the eval shapes
  # (batch 256 and the last, partial batch) on first sight? The eager ResNet-50 forward, bf16, channels_last,
  # first and second call at each shape, with cudnn.benchmark on and then off, each in a fresh process
  for bench in 1 0; do
    TAIL=6 logged first_eval_b$bench 90 python3 - "$bench" <<'PY'
import sys, time, torch, torchvision
torch.backends.cudnn.benchmark = sys.argv[1] == "1"
m = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last).eval()
torch.randn(8, 8, device="cuda").sum().item()  # the context made before any timing
for b in (256, 256, 96, 96):
    x = torch.randn(b, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        m(x)
    torch.cuda.synchronize()
    print(f"cudnn.benchmark={torch.backends.cudnn.benchmark} eval forward b{b}: {time.perf_counter() - t0:.3f} s")
PY
  done
  ;;
s17b)
  # session 17, call B (one H200, ~6 min): issue 13.2, ResNet-50 224 b256 on device data, cnnpar's defaults beside
  # aten's own BatchNorm kernels (forward and backward as extern kernels in the compiled graph; ZZI was cut off
  # before this variant). The caches are off for it (aten_fallbacks), so its compile is a cold one.
  TAIL=8 logged step_rn50_atenbn 420 python3 benchmarks/step_vs_plain.py --cases resnet50:224:256 --plain none \
      --variants "${VARIANTS:-fallback._native_batch_norm_legit_functional=1,fallback.native_batch_norm_backward=1}" \
      --out "$R/step_rn50_atenbn.csv"
  ;;
s17c)
  # session 17, call C (one H200, ~8 min): issue 13.2 at batch 512: cnnpar's defaults beside --compile-tiling
  # (7,545 against 7,139 at b256 in ZZK; b512 added 1-2 % to the best b256 variant in ZS)
  TAIL=8 logged step_rn50_b512_tiling 500 python3 benchmarks/step_vs_plain.py --cases resnet50:224:512 \
      --plain "${PLAIN:-none}" --variants "${VARIANTS:-compile_tiling=on}" --out "$R/step_rn50_b512_tiling.csv"
  ;;
s17d)
  # session 17, call F (one H200, ~4 min with a cold start): the CUDA tests of the compile switches now auto/on/off:
  # --compile-tiling on through torch.compile(options=...) on ResNet-18, and the long-run rule on a CUDA Trainer
  TAIL=8 logged gpu_tests 300 python3 -m pytest -q -m gpu tests/unit/test_train_step.py \
      tests/unit/test_long_compiles.py -p no:cacheprovider --durations=5
  ;;
s18a)
  # session 18, call A (one H200, ~5 min with a cold start): issue 13.2, ResNet-50 224 b512 on device data, cnnpar's
  # defaults with cuDNN's benchmark timing its default 10 algorithms per convolution, then (a process of its own:
  # torch caches the plan it picks per shape) timing every algorithm its heuristics return (benchmark_limit 0)
  for lim in 10 0; do
    TAIL=4 logged "step_rn50_b512_lim$lim" 280 python3 benchmarks/step_vs_plain.py --cases resnet50:224:512 \
        --plain none --variants "" --cudnn-benchmark-limit $lim --out "$R/step_rn50_b512_lim$lim.csv"
  done
  ;;
s18b)
  # session 18, call B (one H200, ~9 min, chained while warm): the pair of long compiles at b512 alone, after call
  # A's default compile only: its warm-up is a compile without the tiled or tuned kernels in the caches
  TAIL=6 logged step_rn50_b512_pair 540 python3 benchmarks/step_vs_plain.py --cases resnet50:224:512 --plain none \
      --skip-defaults --variants "compile_tiling=on,compile_tuning=on" --cudnn-benchmark-limit "${LIMIT:-10}" \
      --out "$R/step_rn50_b512_pair.csv"
  ;;
s18c)
  # session 18, call C (one H200, ~5 min, chained; rewritten after A showed the cuDNN limit changes nothing): the
  # plain compiled loop beside cnnpar's defaults and the pair (from call B's caches) at b512, and the plain loop at
  # b256 (issue 13's reference batch), in one call
  TAIL=8 logged step_rn50_b512_vs_plain 330 python3 benchmarks/step_vs_plain.py --cases resnet50:224:512 \
      --plain compile --variants "compile_tiling=on,compile_tuning=on" --out "$R/step_rn50_b512_vs_plain.csv"
  TAIL=4 logged step_rn50_b256_plain 200 python3 benchmarks/step_vs_plain.py --cases resnet50:224:256 \
      --plain compile --skip-defaults --variants "" --out "$R/step_rn50_b256_plain.csv"
  ;;
s18d)
  # session 18, call D (one H200, ~3 min): the doctor on a long ResNet-50 config (51 million images): it says that
  # `cnnpar train` would turn the long compiles on, and times the default compile (written in session 17)
  TAIL=40 logged doctor_long 300 python3 -m cnnpar doctor --model resnet50 --data synthetic --image-shape 3x224x224 \
      --synthetic-samples 51200 --epochs 1000 --batch-size 256
  ;;
s18e)
  # session 18, call E (one H200, the last ~9 min, chained): the pair from call B's caches, then the pair with
  # inductor's autotuned pointwise configs (+1.8 % on the defaults in ZZG), one process
  TAIL=6 logged step_rn50_b512_pair_map 520 python3 benchmarks/step_vs_plain.py --cases resnet50:224:512 \
      --plain none --skip-defaults --out "$R/step_rn50_b512_pair_map.csv" \
      --variants "compile_tiling=on,compile_tuning=on;compile_tiling=on,compile_tuning=on,inductor.max_autotune_pointwise=1"
  ;;
s18f)
  # session 18, call F (one H200, the last ~8 min, chained): the pair at b256 (the batch `--batch-size auto` picks
  # for photos), a compile of its own (other shapes), 450 s limit
  TAIL=6 logged step_rn50_b256_pair 450 python3 benchmarks/step_vs_plain.py --cases resnet50:224:256 \
      --plain none --skip-defaults --out "$R/step_rn50_b256_pair.csv" --variants "compile_tiling=on,compile_tuning=on"
  ;;
s19a)
  # session 19, call A (one H200, ~6 min with a cold start): issue 11.2, the ways to drive the JPEG engines
  # (nvjpeg_hw.EngineSettings): the CUDA tests, each way's decode alone with its host waits, kernels and copies per
  # batch, then the defaults against all three changes end to end in one process
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=8 logged gpu_tests 150 python3 -m pytest -q -m gpu tests/unit/test_hardware_decode.py -p no:cacheprovider
  TAIL=30 logged engines 150 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample --stages engines \
      --batch-size 256 --batches 2 --repeats 5 --out "$R/engines.csv"
  make_rep 80 .devdata/imagenet_rep80
  TAIL=8 logged jpeg_pipeline80 230 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:hw=bits=device+out=rgb+pools=1}" --budget-s 150 \
      --watchdog-s 225 --out "$R/jpeg_pipeline80.csv"
  ;;
s22a)
  # session 22, call A (one H200, ~3 min with a cold start): issue 11.2, whose waits the library's per-image
  # waits are: the engines' count (nvjpegGetHardwareDecoderInfo), the CUDA tests (the cut calls' pixels among
  # them), the defaults' waits at batches of 14 and 28 against 256, and a batch of 256 cut into calls of 7-64
  # files, each on a decode state of its own (at 5b8dddb and after; ZZZM ran fa03adf's states in turn and hung
  # on chunk=14 with one state), each with its host waits, the time they block, and its rate
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=8 logged gpu_tests 150 python3 -m pytest -q -m gpu tests/unit/test_hardware_decode.py -p no:cacheprovider
  for b in 14 28; do
    TAIL=6 logged "engines_b$b" 90 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample \
        --stages engines --hw-variants "" --batch-size "$b" --batches 2 --repeats 5 --out "$R/engines_b$b.csv"
  done
  TAIL=16 logged engines_cut 200 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample \
      --stages engines --hw-variants "${HW:-chunk=7;chunk=14;chunk=28;chunk=64}" \
      --batch-size 256 --batches 2 --repeats 5 --out "$R/engines_cut.csv"
  ;;
s26a)
  # session 26, call A (one H200, ~6 min with a cold start): why the cut (calls of 7 files on states of their own: no
  # library host waits) slows the step. ZZZR's trace: beside it the training thread's cudaLaunchKernel took 0.53 ms
  # a call (0.011 beside the defaults, call P), while the library's thread queued 256 pageable per-file copies a
  # batch at once. The guess: pageable copies stage through the driver's buffers and block with its lock held.
  # Page-locked slots make them plain DMA: the defaults and the cut, each with pageable and locked slots, then the
  # first one (the cut, locked) under the profiler for an epoch after its timed ones
  make_rep 80 .devdata/imagenet_rep80
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=40 logged jpeg_pipeline80 450 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0:hw=chunk=7:slots=locked:trace=1,hardware:14:0,hardware:14:0:slots=locked,hardware:14:0:hw=chunk=7,hardware:14:0:graphs=off:hw=chunk=7:slots=locked}" \
      --budget-s 330 --watchdog-s 430 --out "$R/jpeg_pipeline80.csv"
  ;;
s24a)
  # session 24, call A (one H200, ~6 min with a cold start): issue 11 item 2's no-wait cut (calls of 7 or 14 files on
  # states of their own) with the step's CUDA graphs off, against the defaults with graphs on and off in the same
  # call; then the cut with CUDA's 8 hardware queues instead of 32 (more library streams on the step's queue)
  make_rep 80 .devdata/imagenet_rep80
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=40 logged jpeg_pipeline80 400 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:graphs=off,hardware:14:0:graphs=off:hw=chunk=7,hardware:14:0:graphs=off:hw=chunk=14,hardware:14:0:hw=chunk=7}" \
      --budget-s 300 --watchdog-s 390 --out "$R/jpeg_pipeline80.csv"
  CUDA_DEVICE_MAX_CONNECTIONS=8 TAIL=14 logged jpeg_pipeline80_q8 150 python3 benchmarks/jpeg_pipeline.py \
      --folder .devdata/imagenet_rep80 --variants "${VARIANTS_Q8:-hardware:14:0:graphs=off:hw=chunk=7}" \
      --watchdog-s 140 --out "$R/jpeg_pipeline80_q8.csv"
  ;;
s23a)
  # session 23, call A (one H200, ~6 min with a cold start): why calls of 7 files on states of their own (no library
  # host waits) trained 20-24 % slower end to end than the defaults (ZZZO, ZZZP): the engines' stream at the highest
  # priority (each image's colour kernel on it queues for the SMs behind the step's, and with cut calls the next
  # image's engine work waits on the GPU behind it), with and without the feeders' streams high too, the defaults
  # at that priority, and the old cut once more under the profiler
  make_rep 80 .devdata/imagenet_rep80
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=40 logged jpeg_pipeline80 450 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0:hw=chunk=7+prio=-5,hardware:14:0,hardware:14:0:hw=prio=-5,hardware:14:0:hw=chunk=7+prio=-5:prio=-1,hardware:14:0:hw=chunk=7:trace=1}" \
      --budget-s 330 --watchdog-s 430 --out "$R/jpeg_pipeline80.csv"
  ;;
s22b)
  # session 22, call B (one H200, ~6 min): call A's cuts (calls of 7 or 14 files, each on a state of its own: no
  # library host waits, 16,719 and 15,837 img/s decode alone) end to end against the defaults, ResNet-50 from the
  # 24,000 photos, one process, with each one's loader alone
  make_rep 80 .devdata/imagenet_rep80
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=12 logged jpeg_pipeline80 330 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:hw=chunk=7,hardware:14:0:hw=chunk=14}" --budget-s 240 \
      --watchdog-s 310 --out "$R/jpeg_pipeline80.csv"
  ;;
s19b)
  # session 19, call B (one H200, ~6 min, chained): `cnnpar train` from the 24,000 photos as a user runs it, then
  # session 18's device-agnostic code (resume, the doctor's tried changes) on ResNet-18 synthetic
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  TAIL=6 logged r18_train 120 python3 -m cnnpar train --model resnet18 --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 8192 --epochs 2 --name r --no-progress --out-dir /tmp/runs_r18
  TAIL=8 logged r18_resume 120 python3 -m cnnpar train --resume auto --name r --epochs 3 --no-progress \
      --out-dir /tmp/runs_r18
  TAIL=40 logged r18_doctor 200 python3 -m cnnpar doctor --model resnet18 --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 8192 --try 2
  ;;
s19c)
  # session 19, call C (one H200, ~5 min, chained): the engines without the library's per-image pipelining
  # (NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE), alone with its waits counted, then end to end beside the defaults
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=12 logged engines_pipe 150 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample \
      --stages engines --hw-variants "pipe=0;pipe=0+pools=1" --batch-size 256 --batches 2 --repeats 5 \
      --out "$R/engines_pipe.csv"
  make_rep 80 .devdata/imagenet_rep80
  TAIL=8 logged jpeg_pipeline80 230 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:hw=pipe=0}" --budget-s 150 \
      --watchdog-s 225 --out "$R/jpeg_pipeline80.csv"
  ;;
s19d)
  # session 19, call D (one H200, ~2 min): the same batched library call on the SMs (backend GPU_HYBRID: Huffman
  # decoding on the GPU for batches over 50), for its waits per batch beside the engines'
  TAIL=12 logged engines_sms 150 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample \
      --stages engines --hw-variants "on=sms;on=sms+bits=device" --batch-size 256 --batches 2 --repeats 5 \
      --out "$R/engines_sms.csv"
  ;;
s19e)
  # session 19, call E (one H200, ~5 min with a cold start): every GPU-marked test at this revision (the engine
  # settings, and the merged run-folder removal and two-class check, among them)
  TAIL=14 logged gpu_tests 400 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=8
  ;;
s19f)
  # session 19, call F (one H200, ~5 min with a cold start): the data wait measured on the device (DataWait): its
  # CUDA test, ResNet-18 synthetic's epochs and the doctor's end to end (26 % host wait in call ZZZ), then `cnnpar
  # train` from the 24,000 photos as a user runs it
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=4 logged gpu_tests 100 python3 -m pytest -q -m gpu tests/unit/test_data_wait.py -p no:cacheprovider
  TAIL=4 logged r18_train 120 python3 -m cnnpar train --model resnet18 --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 8192 --epochs 2 --no-progress --out-dir /tmp/runs_r18
  TAIL=22 logged r18_doctor 200 python3 -m cnnpar doctor --model resnet18 --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 8192 --try 2
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  ;;
s21c)
  # session 21, call C (one H200, ~5 min with a cold start; the photos carried): `cnnpar prepare` now bounds the
  # shorter side (--short-side 256, the default) instead of the longer: the store of the 24,000 photos made both
  # ways and `cnnpar train` from each with no flags (the longer-side store's run should warn that 224 enlarges)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  make_rep 80 .devdata/imagenet_rep80
  TAIL=2 logged prepare_short 150 python3 -m cnnpar prepare .devdata/imagenet_rep80 --out /tmp/short.cnnpar \
      --no-progress
  TAIL=2 logged prepare_longer 150 python3 -m cnnpar prepare .devdata/imagenet_rep80 --out /tmp/longer.cnnpar \
      --max-side 256 --short-side 0 --no-progress
  ls -l /tmp/short.cnnpar /tmp/longer.cnnpar
  for s in short longer; do
    TAIL=6 logged "store_$s" 170 python3 -m cnnpar train --data "/tmp/$s.cnnpar" --model resnet50 --epochs 3 \
        --no-progress --out-dir "/tmp/runs_$s"
    grep -E "^batch size|^image size|^warning" "$R/store_$s.log"
  done
  ;;
s23b)
  # session 23, call B (one H200, ~8 min with a cold start): every GPU-marked test at the session's last code (the run
  # folder's claim, the resume checks, the launcher's end line, prepare's workers), then what a user who passes no
  # speed flags gets from the 24,000 photos (ResNet-50, 3 epochs)
  TAIL=14 logged gpu_tests 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=8
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  ;;
s27c)
  # session 27, call C (one H200, ~6 min with a cold start): the cut (calls of 14 files on states of their own, no
  # library host waits) with the library's thread sleeping between its calls (EngineSettings.pace_us), so the
  # training thread's launches find the driver between them as they do between the defaults' per-image waits
  make_rep 80 .devdata/imagenet_rep80
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=40 logged jpeg_pipeline80 450 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants "${VARIANTS:-hardware:14:0,hardware:14:0:hw=chunk=14+pace=800,hardware:14:0:hw=chunk=14,hardware:14:0:hw=chunk=14+pace=400,hardware:14:0:hw=chunk=7+pace=400}" \
      --budget-s 330 --watchdog-s 430 --out "$R/jpeg_pipeline80.csv"
  ;;
s27b)
  # session 27, call B (one H200, ~2 min warm; carry .whl and .devdata/cifar10_jpeg.npz alone): what a user who passes
  # no speed flags gets from the shared CIFAR-10 file as it is (JPEG bytes + offsets in an .npz, decoded at load)
  TAIL=10 logged cifar_encoded 240 python3 -m cnnpar train --data .devdata/cifar10_jpeg.npz --model resnet18 \
      --epochs 3 --no-progress --out-dir /tmp/runs_c10
  cp /tmp/runs_c10/*/summary.json "$R/cifar_encoded_summary.json" 2>/dev/null
  ;;
s37a)
  # session 37, call A (one H200, ~6 min with a cold start; carry .whl alone): every GPU-marked test at sessions
  # 35-36's last code (s35b's command, unrun in sessions 35 and 36: no machine was lent)
  TAIL=30 logged gpu_tests 500 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=10 -rs
  ;;
s48a)
  # session 48, call A (one GPU, ~5 min with a cold start; carry the three small wheels): tune's refusal of a trial
  # whose loss is not finite and its batch-lr rule, and the doctor's larger-batch advice carrying its lr into its try
  # (session 47's changes, run on a device only by CPU tests with fake trials); outputs copied flat into $R (at most 8
  # files come back, two folders down)
  TAIL=25 logged tune 280 python3 -m cnnpar tune --model resnet18 --data synthetic --image-shape 3x32x32 \
      --device cuda --budget-s 200 --out-dir /tmp/s48_tune
  TAIL=30 logged doctor 200 python3 -m cnnpar doctor --model resnet18 --data synthetic --image-shape 3x32x32 \
      --batch-size 64 --device cuda --try 1 --report-dir /tmp/s48_doctor
  for f in /tmp/s48_tune/*/*/tuned.toml /tmp/s48_tune/*/*/tuned.csv /tmp/s48_doctor/doctor.json; do
    [ -f "$f" ] && cp "$f" "$R/"; done
  head -30 "$R/tuned.toml" 2>/dev/null
  ;;
s48b)
  # session 48, call B (an H200 only, warm; carry the three small wheels and .devdata/imagenet_sample): issue 11 item
  # 1 as a user runs it at this session's code (s37b's command; last on an H200 in session 42: 6,777 img/s)
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 200
  ;;
s48d)
  # session 48, call D (one GPU, ~4 min with a cold start; carry .whl): the GPU-marked tests of the files this
  # session changed after call C's full run (predict through the evaluation's loader, the codec notice's one filter
  # and the fork warning beside GPU decode threads, the step's syncs, the OOM line, the doctor's capture), then the
  # count of Python 3.12's fork warnings in their log
  TAIL=30 logged gpu_tests 260 python3 -m pytest -q -m gpu -p no:cacheprovider -rs --durations=5 \
      tests/integration/test_predict_photos.py tests/integration/test_sample_accounting.py \
      tests/unit/test_codec_warnings.py tests/integration/test_doctor_gpu.py tests/unit/test_train_step.py \
      tests/integration/test_out_of_memory.py
  echo "use of fork() warnings: $(grep -c 'use of fork()' "$R/gpu_tests.log")"
  ;;
s49a)
  # session 49, call A (one GPU, ~6 min with a cold start; carry .whl): session 48's unrun call D (s48d), then the
  # out-of-memory line where another process holds the device's memory: a process keeps most of it, and cnnpar train
  # (ResNet-50 at 224, batch 1024, compile off) runs out: the line must say "other processes held"; then with all but
  # ~256 MiB held, a small model's first CUDA work (cuBLAS/cuDNN handles among it) must still end in one line, exit 2
  bash "$0" s48d "$OUTDIR"
  hog() {  # hog KEEP_GIB: hold all of the device's free memory but KEEP_GIB, until killed
    python3 -c "
import sys, time, torch
free, _ = torch.cuda.mem_get_info()
x = torch.empty(int(free - float(sys.argv[1]) * 2**30), dtype=torch.uint8, device='cuda')
print(f'hog: holding {x.numel() / 2**30:.2f} GiB', flush=True)
time.sleep(300)" "$1" &
    HOG=$!; sleep 12; }
  hog 20
  TAIL=6 logged oom_others 150 python3 -m cnnpar train --device cuda --data synthetic --image-shape 3x224x224 \
      --synthetic-samples 2048 --model resnet50 --batch-size 1024 --compile off --epochs 1 --no-progress \
      --out-dir /tmp/s49_oom
  grep -c "other processes held" "$R/oom_others.log"; kill $HOG; wait $HOG 2>/dev/null
  hog 0.25
  TAIL=6 logged oom_nearly_full 150 python3 -m cnnpar train --device cuda --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 2048 --model resnet18 --batch-size 64 --compile off --epochs 1 --no-progress \
      --out-dir /tmp/s49_oom2
  grep -c "Traceback" "$R/oom_nearly_full.log"; kill $HOG; wait $HOG 2>/dev/null
  ;;
s49b)
  # session 49, call B (one GPU; carry the three small wheels and .devdata/imagenet_sample): issue 11 item 1 as a user
  # runs it (s48b), then call A's last case again after its fix: all but ~256 MiB of the device held by another
  # process, cnnpar train must end in one line ("cuda:0 could not be started: CUDA error: out of memory; ..."), exit 2
  bash "$0" s48b "$OUTDIR"
  python3 -c "
import time, torch
free, _ = torch.cuda.mem_get_info()
x = torch.empty(int(free - 0.25 * 2**30), dtype=torch.uint8, device='cuda')
print(f'hog: holding {x.numel() / 2**30:.2f} GiB', flush=True)
time.sleep(300)" &
  HOG=$!; sleep 12
  TAIL=4 logged context_oom 120 python3 -m cnnpar train --device cuda --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 2048 --model resnet18 --batch-size 64 --compile off --epochs 1 --no-progress \
      --out-dir /tmp/s49_oom3
  grep -c "Traceback" "$R/context_oom.log"; kill $HOG; wait $HOG 2>/dev/null
  ;;
s50c)
  # session 50, call C (one GPU, ~7 min with a cold start; carry .whl): every GPU-marked test at the session's code
  # (the TF32 mend: call B's 13 errors), then the CPU tests of the float32-precision put-back on the image's torch 2.11
  TAIL=30 logged gpu_tests 480 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=10 -rs
  TAIL=8 logged precision_tests 90 python3 -m pytest -q -p no:cacheprovider -rs tests/unit/test_precision.py \
      tests/unit/test_in_process.py
  ;;
s51a)
  # for session 51 (one GPU, ~5 min with a cold start; carry .whl): session 50's GPU-side changes no device ran:
  # step_vs_plain's plain loops setting TF32 through set_float32_matmul_precision after cnnpar's step, and bench's new
  # refusals and kept DDP rows on CUDA (a budget spent before the first claim; --ddp 1 beside the ladder)
  TAIL=12 logged svp_tf32 240 python3 benchmarks/step_vs_plain.py --cases resnet18:32:512 --steps 5 --repeats 1 \
      --warmup 3 --plain fp32,bf16,compile --variants compile=off --skip-defaults --out "$R/svp_tf32.csv"
  TAIL=4 logged bench_claims_budget 120 python3 -m cnnpar bench --claims --device cuda --budget-s 1 --out "$R/claims1"
  TAIL=12 logged bench_ddp1 240 python3 -m cnnpar bench --device cuda --only baseline,bf16 --ddp 1 --out "$R/ddp1"
  ;;
s52b)
  # session 52, call B (one GPU, ~4 min with a cold start; carry .whl): the loader's early-ended pass stopping its own
  # workers (DeviceFeeder._one_pass, on the side-stream and threaded pipelines too) under s49c's GPU-marked files
  # (every loader on CUDA, the decoders, predict on photos) and the feeder's, stream's and data wait's
  TAIL=30 logged gpu_tests 330 python3 -m pytest -q -m gpu -p no:cacheprovider -rs --durations=5 \
      tests/unit/test_gpu_decode.py tests/unit/test_hardware_decode.py tests/unit/test_hybrid_decode.py \
      tests/unit/test_byte_slots.py tests/unit/test_odd_images.py tests/integration/test_sample_accounting.py \
      tests/integration/test_predict_photos.py tests/unit/test_feeder.py tests/unit/test_training_stream.py \
      tests/unit/test_data_wait.py tests/unit/test_worker_gpu_decode.py
  ;;
s49c)
  # session 49, call C (one GPU, ~5 min with a cold start; carry .whl): the GPU-marked tests of the data sets whose
  # file lists became one shared table (folder.PathTable: the CPU, nvJPEG, engines, hybrid, worker and store readers),
  # predict's photo path through them, and the odd files, at the session's last code
  TAIL=30 logged gpu_tests 330 python3 -m pytest -q -m gpu -p no:cacheprovider -rs --durations=5 \
      tests/unit/test_gpu_decode.py tests/unit/test_hardware_decode.py tests/unit/test_hybrid_decode.py \
      tests/unit/test_byte_slots.py tests/unit/test_odd_images.py tests/integration/test_sample_accounting.py \
      tests/integration/test_predict_photos.py
  ;;
s47b)
  # session 47, call B (one GPU, warm or cold; carry .whl): the founding document's claims table at the session's
  # code, after bench --claims' compiled_preprocess came to time cnnpar's own DeviceTransform (the last GPU claims
  # table, 2026-12-01-h200/call-a, timed a copy that normalised first); the claims keep their 170 s budget
  TAIL=40 logged claims 300 python3 -m cnnpar bench --claims --device cuda --out "$R/claims"
  ;;
s42a)
  # session 42, call A (one H100 or H200, ~6 min with a cold start; carry .whl without nvImageCodec's wheel and
  # .devdata/cifar10_jpeg.npz): benchmark scripts whose input checks changed in session 41 and that no device has run
  # since, as measurements: the step against plain PyTorch (ResNet-18 at 32 px), the three timers of one step, then
  # the cifar10-record preset (its Newton-Schulz dtype choice changed for CPUs; bf16 on CUDA as before)
  TAIL=6 logged step_vs_plain 150 python3 benchmarks/step_vs_plain.py --cases resnet18:32:512 --out "$R/step_vs_plain.csv"
  TAIL=10 logged one_step 150 python3 benchmarks/one_step.py --device cuda --out "$R/one_step.csv"
  TAIL=10 logged record 200 python3 benchmarks/cifar10_record.py --seeds 2 --skip-airbench --budget-s 150 \
      --out "$R/cifar10_record.csv"
  ;;
s42b)
  # session 42, call B (the same machine warm; carry as call A plus .devdata/imagenet_sample): --batch-size auto
  # against 64 (ResNet-18, CIFAR-10, 4 epochs), then speed_records' JPEG part on the 6,000 photo links, now led by
  # the decoder a user gets without --decode
  TAIL=8 logged batch_auto 200 python3 benchmarks/batch_auto.py --data .devdata/cifar10.npz --model resnet18 \
      --epochs 4 --cases 64,auto --target 0.6 --out "$R/batch_auto.csv"
  TAIL=8 logged speed_records 330 python3 benchmarks/speed_records.py --parts jpeg --folder .devdata/imagenet_rep \
      --out "$R/speed_records_jpeg.csv"
  ;;
s42c)
  # session 42, call G (one GPU, ~3 min with a cold start; carry .whl without nvImageCodec's wheel and
  # .devdata/imagenet_sample): the no-flags photo run with its bar asked for (no --no-progress) and stdout a file, so
  # the progress line every 30 s stands in for the bar: its epochs against call ZZZZZH's with --no-progress
  make_rep 80 .devdata/imagenet_rep80
  TAIL=8 logged progress_in_log 240 python3 -m cnnpar train --data .devdata/imagenet_rep80 --model resnet50 --epochs 3 \
      --out-dir /tmp/runs_progress
  grep -c -E "^epoch [0-9]+/[0-9]+: |^evaluating: " "$R/progress_in_log.log"
  ;;
s41c)
  # session 41, call D (one H100 or H200, ~5 min with a cold start; carry .whl without nvImageCodec's wheel and
  # .devdata/imagenet_sample): the GPU benchmark scripts whose input checks changed this session, measuring as a
  # user runs them: the engines' decode stage, then one ResNet-50 variant end to end (its data now loaded outside
  # the per-variant try)
  TAIL=10 logged engines 120 python3 benchmarks/jpeg_decode.py --folder .devdata/imagenet_sample \
      --stages engines --hw-variants "" --batch-size 256 --batches 2 --repeats 5 --out "$R/engines.csv"
  make_rep 80 .devdata/imagenet_rep80
  TAIL=12 logged jpeg_pipeline80 260 python3 benchmarks/jpeg_pipeline.py --folder .devdata/imagenet_rep80 \
      --variants hardware:14:0 --budget-s 150 --watchdog-s 250 --out "$R/jpeg_pipeline80.csv"
  ;;
s37b)
  # session 37, call B (one H200, ~4 min warm; carry .whl without nvImageCodec's wheel and .devdata/imagenet_sample):
  # issue 11 item 1 at the same code (the no-flags ResNet-50 run from 24,000 photo links; last measured in ZZZZU)
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 200
  ;;
s35b)
  # session 35, call B (one H200, ~6 min with a cold start; carry .whl alone): every GPU-marked test at the session's
  # last code (the stop, leftover, multi-node and decode fixes merged after call A among what they cover)
  TAIL=30 logged gpu_tests 420 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=10 -rs
  ;;
s35a)
  # session 35, call A (one H200, ~5 min with a cold start; carry .whl and .devdata/imagenet_sample): session 34's
  # not-run single-GPU commands (plain SGD at --momentum 0, fused on CUDA; the fp16 divergence stop), then issue 11
  # item 1 at the current code (the no-flags ResNet-50 run from 24,000 photo links; last measured at c96b035)
  TAIL=8 logged sgd_m0 120 python3 -m cnnpar train --device cuda --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 2048 --model resnet18 --optimizer sgd --momentum 0 --epochs 1 --no-progress \
      --out-dir /tmp/runs_m0
  TAIL=8 logged fp16_lr5 150 python3 -m cnnpar train --device cuda --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 4096 --model resnet18 --precision fp16 --optimizer sgd --lr 5 --epochs 3 --no-progress \
      --out-dir /tmp/runs_f16 --name f16
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 200
  ;;
s34a)
  # session 34, call A (one H200, ~7 min with a cold start; carry .whl alone, nvImageCodec's wheel in it): every
  # GPU-marked test at the session's last code (odd files through the three CUDA decoders among them), then the
  # divergence advice on CUDA (session 33 changed it after its calls)
  TAIL=30 logged gpu_tests 420 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=10 -rs
  TAIL=12 logged fp16_lr5 150 python3 -m cnnpar train --device cuda --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 4096 --model resnet18 --precision fp16 --optimizer sgd --lr 5 --epochs 3 --no-progress \
      --out-dir /tmp/runs_f16 --name f16
  ;;
s33a)
  # session 33, call A (one H200, ~5 min with a cold start; carry .whl alone): every GPU-marked test at the session's
  # last code
  TAIL=20 logged gpu_tests 420 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=10 -rs
  ;;
s33b)
  # session 33, call B (one H200, ~4 min warm; carry .whl and .devdata/imagenet_sample): the three paths session 32
  # changed and never ran on a device: the divergence check's fp16 branch, --crop-min-scale with the engines beside
  # the default, predict on the folder of a store-trained run
  TAIL=16 logged fp16_lr5 150 python3 -m cnnpar train --device cuda --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 4096 --model resnet18 --precision fp16 --optimizer sgd --lr 5 --epochs 3 --no-progress \
      --out-dir /tmp/runs_f16 --name f16
  python3 -c "
import sys, torch, pathlib
p = pathlib.Path('/tmp/runs_f16/f16/ckpt/last.pt')
if not p.exists(): sys.exit(print('no last.pt'))
ck = torch.load(p, map_location='cpu', weights_only=True)
bad = [k for k, v in ck['model'].items() if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]
print('last.pt epoch', ck.get('epoch'), 'non-finite tensors:', len(bad), bad[:3])"
  make_rep 80 .devdata/imagenet_rep80
  for scale in 0.08 0.25; do
    TAIL=8 logged "crop_$scale" 150 python3 -m cnnpar train --data .devdata/imagenet_rep80 --model resnet50 \
        --epochs 2 --crop-min-scale "$scale" --no-progress --out-dir /tmp/runs_crop
    grep -E "^data|^decode|^epoch" "$R/crop_$scale.log"
  done
  TAIL=6 logged prepare 120 python3 -m cnnpar prepare .devdata/imagenet_sample --out /tmp/s.cnnpar
  TAIL=6 logged store_train 150 python3 -m cnnpar train --data /tmp/s.cnnpar --model resnet18 --epochs 2 \
      --no-progress --out-dir /tmp/runs_st --name st
  TAIL=10 logged predict_folder 120 python3 -m cnnpar predict --checkpoint /tmp/runs_st/st \
      --data .devdata/imagenet_sample --out "$R/predictions.csv"
  ;;
s32a)
  # session 32, call A (two H200s, ~6 min with a cold start; carry .whl alone): every GPU-marked test at the
  # session's last code, the two-GPU ones included (SyncBN, and new: the ranks' agreement checks and a killed rank's
  # restart through NCCL)
  TAIL=20 logged gpu_tests 420 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=10 -rs
  ;;
s32b)
  # session 32, call B (two H200s, ~7 min; carry .whl and .devdata/imagenet_sample): the doctor's capped-batch advice
  # on CUDA (240 training photos); the dynamic_compile claim, whose compile probe now builds the step the way
  # train does (a helper saw a stride assertion in it at the earlier code); the no-flags ResNet-50 photo run
  TAIL=30 logged doctor_photos 150 python3 -m cnnpar doctor --data .devdata/imagenet_sample --model resnet18 \
      --device cuda
  TAIL=20 logged claim_compile 150 python3 -m cnnpar bench --claims --only dynamic_compile --device cuda \
      --out "$R/claim_compile"
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  ;;
s31a)
  # session 31, call A (one H200, ~8 min with a cold start; carry .whl and .devdata/cifar10_jpeg.npz): tune, whose
  # check now measures the start's config again after the best's where a trial was kept; then the cifar10-speed
  # preset's time to accuracy without and with --bias-decay (airbench94 decays its BatchNorm biases; the preset not)
  start=$(date +%s)
  TAIL=30 logged tune18 270 python3 -m cnnpar tune --device cuda --model resnet18 --data synthetic \
      --image-shape 3x32x32 --synthetic-samples 50000 --budget-s 240 --out "$R/tuned_resnet18.toml"
  echo "tune wall: $(( $(date +%s) - start )) s"; head -16 "$R/tuned_resnet18.toml" 2>/dev/null
  for bd in off on; do
    flag=(); [ "$bd" = on ] && flag=(--bias-decay)
    TAIL=14 logged "speed_bd_$bd" 150 python3 -m cnnpar bench --time-to-accuracy --preset cifar10-speed \
        --data .devdata/cifar10.npz --target 0.94 --repeats 5 "${flag[@]}" --out "$R/speed_bd_$bd"
  done
  ;;
s31b)
  # session 31, call B (one H200, ~7 min with a cold start; carry .whl and .devdata/imagenet_sample): every GPU-marked
  # test at the session's last code, then what a user who passes no speed flags gets from the 24,000 photos (each
  # epoch that improves validation accuracy now also writes ckpt/best.pt)
  TAIL=14 logged gpu_tests 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=8
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  ls -la /tmp/runs_default/*/ckpt/
  ;;
s30c)
  # session 30, call D (one H200, ~8 min with a cold start; carry .whl alone): every GPU-marked test at the session's
  # last code (each epoch now writes summary.json), then tune with a typed --precision, held: its trials skipped
  TAIL=14 logged gpu_tests 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=8
  TAIL=30 logged tune_held 240 python3 -m cnnpar tune --device cuda --model resnet18 --data synthetic \
      --image-shape 3x32x32 --synthetic-samples 50000 --precision bf16 --budget-s 200 --out "$R/tuned_held.toml"
  head -16 "$R/tuned_held.toml" 2>/dev/null
  ;;
s30a)
  # session 30, call A (one H200, ~7 min with a cold start; carry .whl, now with simplejpeg's wheel, and
  # .devdata/imagenet_sample): every GPU-marked test at the session's last code, then what a user who passes no speed
  # flags gets from the 24,000 photos (ResNet-50, 3 epochs) with simplejpeg installed, as it now is by default
  TAIL=14 logged gpu_tests 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=8
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  ;;
s30b)
  # session 30, call B (one H200, ~3 min warm; carry .whl and .devdata/cifar10_jpeg.npz alone): the no-flags CIFAR-10
  # run from the encoded npz with simplejpeg (call ZZZZF's load took 11.4 s through torchvision), then a ladder rung
  # with --ddp 1 on CUDA, whose rows now run and record the ladder's shape, classes and optimizer
  TAIL=10 logged cifar_encoded 240 python3 -m cnnpar train --data .devdata/cifar10_jpeg.npz --model resnet18 \
      --epochs 3 --no-progress --out-dir /tmp/runs_c10
  cp /tmp/runs_c10/*/summary.json "$R/cifar_encoded_summary.json" 2>/dev/null
  TAIL=12 logged bench_ddp 200 python3 -m cnnpar bench --device cuda --model resnet18 --data synthetic \
      --image-shape 3x32x32 --num-classes 10 --optimizer adamw --only baseline --ddp 1 --repeats 3 --out "$R/bench_ddp"
  python3 -c "import csv, sys; keys = ('world_size', 'images_per_s', 'image_shape', 'num_classes', 'optimizer',
      'precision', 'channels_last'); [print({k: r[k] for k in keys}) for r in csv.DictReader(open(sys.argv[1]))]" \
      "$R/bench_ddp/ddp.csv"
  ;;
s29b)
  # session 29, call B (one H200, ~6 min warm; carry .whl and .devdata/cifar10_jpeg.npz alone): tune's check (the best
  # config measured once more at the end: agrees / unsteady / skipped) on a GPU for the first time, then what a user
  # who passes no speed flags gets from the shared CIFAR-10 file as it is (the encoded npz's load line on a GPU)
  start=$(date +%s)
  TAIL=30 logged tune18 280 python3 -m cnnpar tune --device cuda --model resnet18 --data synthetic \
      --image-shape 3x32x32 --synthetic-samples 50000 --budget-s 240 --out "$R/tuned_resnet18.toml"
  echo "tune wall: $(( $(date +%s) - start )) s"; head -12 "$R/tuned_resnet18.toml" 2>/dev/null
  cut -d, -f1-8 "$R/tuned_resnet18.csv" 2>/dev/null | tail -4
  TAIL=10 logged cifar_encoded 240 python3 -m cnnpar train --data .devdata/cifar10_jpeg.npz --model resnet18 \
      --epochs 3 --no-progress --out-dir /tmp/runs_c10
  cp /tmp/runs_c10/*/summary.json "$R/cifar_encoded_summary.json" 2>/dev/null
  ;;
s29c)
  # session 29, call C (one H200, ~10 min with a cold start; carry .whl alone): tune's check on a GPU, with a budget
  # that leaves it room after ResNet-18's trials (call B's 240 s skipped it); TUNE_BUDGET sets another (call D: 260)
  start=$(date +%s)
  TAIL=30 logged tune18long 580 python3 -m cnnpar tune --device cuda --model resnet18 --data synthetic \
      --image-shape 3x32x32 --synthetic-samples 50000 --budget-s "${TUNE_BUDGET:-540}" --out "$R/tuned_resnet18.toml"
  echo "tune wall: $(( $(date +%s) - start )) s"; head -14 "$R/tuned_resnet18.toml" 2>/dev/null
  ;;
s21d)
  # session 21, call D (one H200, ~4.5 min with a cold start): every GPU-marked test at the session's last code (the
  # graphed-step test marked gpu this session, so `-m gpu` runs it for the first time)
  TAIL=14 logged gpu_tests 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=8
  ;;
s21b)
  # session 21, call B (one H200, ~3 min, chained after s20c; carry .devdata/cifar10_jpeg.npz alone, the photos
  # would pass the 64 MiB a call takes): what a user who passes no speed flags gets on CIFAR-10 ResNet-18 (the
  # reference at 5bfa0df: batch 64, 34,349 img/s), beside the step alone at the batch the search picks
  TAIL=8 logged cifar_default 240 python3 -m cnnpar train --data .devdata/cifar10.npz --model resnet18 --epochs 3 \
      --no-progress --out-dir /tmp/runs_cifar
  cp /tmp/runs_cifar/*/summary.json "$R/cifar_default_summary.json" 2>/dev/null
  TAIL=5 logged step_rn18 200 python3 benchmarks/step_vs_plain.py --cases "resnet18:32:${STEP_BATCH:-512}" \
      --plain none --variants "" --out "$R/step_rn18.csv"
  ;;
s20d)
  # session 20, call D (one H200, ~2 min with a cold start): the data-wait CUDA tests, the read-as-you-go one
  # rewritten after call ZZZG (its nested second meter differed by two records' host time a call)
  TAIL=4 logged gpu_tests 100 python3 -m pytest -q -m gpu tests/unit/test_data_wait.py -p no:cacheprovider
  ;;
s20c)
  # session 20, call C (one H200, ~6 min with a cold start): every GPU-marked test at the session's last code,
  # predict on CUDA with the run's test-time views, then `cnnpar train` from the 24,000 photos as a user runs it
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=14 logged gpu_tests 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=8
  TAIL=4 logged tta_train 60 python3 -m cnnpar train --epochs 2 --tta-level flip --no-progress --name tta \
      --out-dir /tmp/runs_tta
  TAIL=4 logged tta_predict 60 python3 -m cnnpar predict --checkpoint /tmp/runs_tta/tta --data digits \
      --device cuda --out "$R/predictions.csv"
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  ;;
s20b)
  # session 20, call B (one H200, ~3 min with a cold start): DataWait reusing its event pairs; the parts of
  # its cost (data_wait_cost.py's variants), its CUDA tests, and ResNet-18 synthetic's epochs (call ZZZD: 4 %)
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=4 logged gpu_tests 100 python3 -m pytest -q -m gpu tests/unit/test_data_wait.py -p no:cacheprovider
  TAIL=9 logged data_wait_cost 100 python3 benchmarks/data_wait_cost.py --out "$R/data_wait_cost.csv"
  TAIL=4 logged r18_train 120 python3 -m cnnpar train --model resnet18 --data synthetic --image-shape 3x32x32 \
      --synthetic-samples 8192 --epochs 2 --no-progress --out-dir /tmp/runs_r18
  ;;
s19g)
  # for the next session (written in session 19, not yet run): the data-wait code changed after call ZZZD (the
  # read-as-you-go event queue, seconds() waiting for its last event, the evaluation's wait on the device), then
  # `cnnpar train` from the 24,000 photos as a user runs it; ~3 min with a cold start
  LOG_FILTER='Warning|warn\(|nvjpeg2k|nvtiff|Note: If|ROI decode|WARNING|^\s*$'
  TAIL=4 logged gpu_tests 100 python3 -m pytest -q -m gpu tests/unit/test_data_wait.py -p no:cacheprovider
  TAIL=3 logged data_wait_cost 60 python3 benchmarks/data_wait_cost.py --out "$R/data_wait_cost.csv"
  make_rep 80 .devdata/imagenet_rep80
  user_run .devdata/imagenet_rep80 170
  ;;
s10b)
  # for the next session (two or four H200s; written in session 9, not yet run): issue 13.4, DDP's switches
  # against the default in the same call, ResNet-50 224 bf16 b256, host pipeline, compile off
  for v in "" "--ddp-broadcast-buffers off" "--ddp-bucket-mb 100" "--ddp-static-graph on"; do
    name=ddp${v// /_}; name=${name//--/_}
    TAIL=6 logged "$name" 200 python3 benchmarks/ddp_scaling.py --world-sizes "${WORLD_SIZES:-1,2}" --steps 60 \
        --repeats 3 $v --out "$R/$name"
  done
  ;;
s9b)
  # session 9, call B (one H200): which part of `cnnpar train --decode hardware` hangs at exit, the cases
  # side by side (each its own process; 16 cores shared). A process still alive 10 s after its "done:"
  # line has its threads' states, kernel wait channels and kernel stacks read from /proc (cuda-gdb could
  # not attach in call R), then a plain gdb's native stacks where gdb exists, then it is killed.
  # A: as a user runs it; B: no validation split; C: the engines' handles never closed; D: no worker
  # processes; E: fixed batch, no TensorBoard; F: the process leaves by os._exit once main() returns
  ARGS="train --data .devdata/imagenet_rep --model resnet50 --epochs 1 --out-dir /tmp/runs --no-progress --decode hardware"
  hang_case exit_a python3 -m cnnpar $ARGS --out-dir /tmp/runs_a &
  hang_case exit_b python3 -m cnnpar $ARGS --out-dir /tmp/runs_b --val-fraction 0 &
  hang_case exit_c python3 -c "import sys; import cnnpar.data.nvjpeg_hw as h; h.HardwareJpegDecoder.close = lambda self: None; \
from cnnpar.cli import main; sys.exit(main(sys.argv[1:]))" $ARGS --out-dir /tmp/runs_c &
  hang_case exit_d python3 -m cnnpar $ARGS --out-dir /tmp/runs_d --workers 0 &
  hang_case exit_e python3 -m cnnpar $ARGS --out-dir /tmp/runs_e --batch-size 128 --no-tensorboard &
  hang_case exit_f python3 -c "import os, sys; from cnnpar.cli import main; rc = main(sys.argv[1:]); \
sys.stdout.flush(); sys.stderr.flush(); os._exit(rc or 0)" $ARGS --out-dir /tmp/runs_f &
  wait
  cat "$R"/exit_*.summary
  ;;
frameworks)
  # issue 5 on the GPU: needs .devdata/mnist.npz and keras, namex, optree wheels (cp312) in .whl/.
  # JAX cannot travel: jaxlib + the CUDA plugin and PJRT wheels are ~230 MB against the 64 MiB carry
  # limit, so JAX on the GPU is out of reach of this tool; Keras runs on its torch backend there.
  run 560 python3 -m cnnpar compare --frameworks torch,keras-torch --data .devdata/mnist.npz \
      --epochs 3 --batch-size 128 --out "$R/frameworks_h200"
  ;;
esac
tar czf "$OUTDIR/results.tgz" -C "$OUTDIR" results && echo "packed $(du -sh "$OUTDIR/results.tgz")"

#!/usr/bin/env bash
# Issue 13's studies on the GPU machine (H200, torch 2.11, no network): `trtmc study MODEL --random-weights` for
# each model given, one after another, fp16, bf16, fp8 and int8 at batch 1, 32 and 128 (each study builds its
# bundles JOBS at a time in processes of its own, then times alone). Reports go to benchmarks/studies/MODEL; $OUT
# gets session.log and studies.tar.gz (the reports, without the work folders).
#   OUT=/tmp/out LIMIT=580 bash tools/gpu_studies.sh vit_base_patch16_224 resnet50
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-studies}
WORK=${WORK:-/tmp/trtmc-studies}
LIMIT=${LIMIT:-585}  # seconds this script may run, shared evenly by the studies not yet run
JOBS=${JOBS:-8}
mkdir -p "$OUT" "$WORK" benchmarks/studies
LOG="$OUT/session.log"
say() { echo "=== $(date +%T) +${SECONDS}s $*" | tee -a "$LOG"; }

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"; nproc; } >>"$LOG" 2>&1
# Which code ran: the device machine's .git can be older than the files copied to it, so the log records a
# digest of the source tree instead (compare it with the same command on a checkout).
digest() { find src tools -type f \( -name '*.py' -o -name '*.sh' \) | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16; }
echo "source digest: $(digest) (find src tools -name '*.py' -o -name '*.sh', sorted, sha256sum of sha256sums)" >>"$LOG"
find src tools -type f \( -name '*.py' -o -name '*.sh' \) | LC_ALL=C sort | xargs sha256sum >"$OUT/source-files.sha256"  # `sha256sum -c` it on a checkout
left_models=$#
for model in "$@"; do
    budget=$(( (LIMIT - SECONDS - 20) / left_models ))
    say "study $model (at most ${budget}s)"
    timeout "$budget" python3 -m trtmc study "$model" --random-weights --precision fp16 --precision bf16 \
        --precision fp8 --precision int8 --jobs "$JOBS" --workdir "$WORK/work-$model" \
        --out "benchmarks/studies/$model" >>"$LOG" 2>&1
    say "study $model: exit $?"
    left_models=$((left_models - 1))
done
tar -czf "$OUT/studies.tar.gz" benchmarks/studies 2>>"$LOG"
say "done"

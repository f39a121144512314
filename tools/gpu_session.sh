#!/usr/bin/env bash
# One call on the GPU machine (H200, torch 2.11, no network) for the numbers in benchmarks/NOTES.md:
#   1. cold start: `trtmc classify` of one photo in a fresh process, for lite0 (real weights), ghostnet_100 and
#      resnet50 (random weights), fp16, --max-batch 64 (issue 10);
#   2. folders: `trtmc classify` over 2,002 and 20,000 photos (the 22 repo photos linked round-robin):
#      images/s and peak RSS (issue 10);
#   3. the folder scope of `trtmc bench` on 2,002 files: trtmc against DataLoader + torch.compile (issue 10);
#   4. `trtmc bench` on vit_base_patch16_224 and ghostnet_100 against the expert baseline (issues 8 and 12).
# Every step has its own time limit and the next one runs whatever happened. $OUT receives session.log,
# measurements.jsonl (wall time and peak RSS per command) and bench/ (results.json, results.md, latency.png).
#   OUT=/tmp/out bash tools/gpu_session.sh
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-session}
WORK=${WORK:-/tmp/trtmc-gpu}
mkdir -p "$OUT" "$WORK"
LOG="$OUT/session.log"
step() { echo "=== $(date +%T) $*" | tee -a "$LOG"; }
trtmc() { python3 -m trtmc "$@"; }
measure() { local name=$1; shift; python3 tools/measure.py "$OUT/measurements.jsonl" "$name" -- "$@" >>"$LOG" 2>&1; }

step "machine"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"; nproc; } >>"$LOG" 2>&1

step "checkpoints and bundles (fp16, cuda, max batch 64), built in parallel"
python3 - >>"$LOG" 2>&1 <<'PY'
from pathlib import Path
from trtmc.random_weights import save_random_checkpoint
work = Path("/tmp/trtmc-gpu")
for arch in ("ghostnet_100", "resnet50"):
    if not (work / arch / "config.json").is_file():
        save_random_checkpoint(arch, work / arch)
PY
for model in lite0:examples/checkpoints/tf_efficientnet_lite0.in1k ghostnet_100:$WORK/ghostnet_100 resnet50:$WORK/resnet50; do
    name=${model%%:*}; path=${model#*:}
    ( timeout 240 python3 -m trtmc build "$path" -o "$WORK/$name.bundle" --precision fp16 --device cuda --max-batch 64 -q \
        >"$WORK/build-$name.log" 2>&1; echo "build $name: $?" >>"$LOG" ) &
done
wait
cat "$WORK"/build-*.log >>"$LOG"

step "cold start: one photo in a fresh process (lite0 twice), -v logs the breakdown"
for run in lite0:1 lite0:2 ghostnet_100:1 resnet50:1; do
    name=${run%%:*}
    measure "cold-$name-${run#*:}" timeout 90 python3 -m trtmc -v classify "$WORK/$name.bundle" examples/images/chelsea.png --top-k 1
done

step "folders of 2,002 and 20,000 photos through trtmc classify"
python3 - >>"$LOG" 2>&1 <<'PY'
import os
from pathlib import Path
photos = sorted(p.resolve() for p in Path("examples/images").iterdir() if p.suffix in (".jpg", ".png"))
for count in (2002, 20000):
    folder = Path(f"/tmp/trtmc-gpu/photos-{count}")
    folder.mkdir(exist_ok=True)
    for i in range(count):
        link = folder / f"{i:05d}{photos[i % len(photos)].suffix}"
        if not link.exists():
            os.symlink(photos[i % len(photos)], link)
PY
for count in 2002 20000; do
    measure "folder-lite0-$count" timeout 240 python3 -m trtmc classify "$WORK/lite0.bundle" "$WORK/photos-$count" --top-k 1 \
        --output "$WORK/scores-$count.csv"
done
head -3 "$WORK/scores-2002.csv" >>"$LOG"

step "bench folder scope: trtmc against DataLoader + torch.compile on 2,002 files"
timeout 240 python3 tools/folder_bench.py --out "$OUT/folder" --workdir "$WORK/folderbench" --images 2002 >>"$LOG" 2>&1
echo "folder bench: $?" >>"$LOG"
for f in bench.log summary.txt ray.json; do [ -f "$OUT/folder/$f" ] && { echo "--- folder/$f" >>"$LOG"; cat "$OUT/folder/$f" >>"$LOG"; rm "$OUT/folder/$f"; }; done

step "bench: vit_base_patch16_224 and ghostnet_100 against the expert baseline"
# What is left of a 590-second call goes to the bench (its results are written after each entry).
timeout $((590 - SECONDS)) python3 -m trtmc bench --random-weights --only vit_base_patch16_224 --only ghostnet_100 --baseline expert \
    --prepare-jobs 2 --workdir "$WORK/bench" --out "$OUT/bench" >>"$LOG" 2>&1
echo "bench: $?" >>"$LOG"
step "done"

#!/usr/bin/env bash
# The full bench (`trtmc bench --random-weights --baseline expert`, every entry of benchmarks/performance.yaml) on
# the GPU machine, in parts: one call is at most 10 minutes and the whole needs about 30 of device time.
#   OUT=$OUT LIMIT=570 bash tools/gpu_bench.sh prepare   # build what is not built yet, 12 entries at a time
#   OUT=$OUT LIMIT=570 bash tools/gpu_bench.sh time      # time what is not timed yet; the report once all are
# Each call copies the finished entries' records (WORKDIR/timed, a few hundred kB each) to $OUT/timed. Carried
# back into a later session as bench-records/timed (git-ignored; `carry: ["bench-records"]`), they are put in the
# work folder first, so `--resume` takes them there when the code (the report's source digest), the versions
# and the machine are the same, and times the rest.
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-bench}
WORK=${WORK:-/tmp/bw}
LIMIT=${LIMIT:-570}
mkdir -p "$OUT" "$WORK/timed"
[ -d bench-records/timed ] && cp -n bench-records/timed/*.pickle "$WORK/timed/" 2>/dev/null
python3 -c "from trtmc.bench.runner import source_digest; print('trtmc source', source_digest())" >>"$OUT/bench.log"
case "${1:-}" in
    prepare)
        # Two compile workers per build: twelve builds at once would otherwise start 16 workers each.
        TORCHINDUCTOR_COMPILE_THREADS=2 timeout "$LIMIT" python3 -m trtmc bench --random-weights --baseline expert \
            --prepare-only --reuse-prepared --prepare-jobs 12 --workdir "$WORK" --out "$OUT/prepared" >>"$OUT/bench.log" 2>&1 ;;
    time)
        timeout "$LIMIT" python3 -m trtmc bench --random-weights --baseline expert --reuse-prepared --resume \
            --workdir "$WORK" --out "$OUT/bench" >>"$OUT/bench.log" 2>&1 ;;
    *) echo "usage: OUT=DIR LIMIT=SECONDS bash tools/gpu_bench.sh prepare|time" >&2; exit 2 ;;
esac
echo "exit status $?" >>"$OUT/bench.log"
mkdir -p "$OUT/timed" && cp "$WORK"/timed/*.pickle "$OUT/timed/" 2>/dev/null
echo "$(ls "$OUT/timed" | wc -l) entries timed so far" | tee -a "$OUT/bench.log"

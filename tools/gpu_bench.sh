#!/usr/bin/env bash
# The full bench (`trtmc bench --random-weights --baseline expert`, every entry of benchmarks/performance.yaml) on
# the GPU machine, in parts: one call is at most 10 minutes, the whole needs about 31 minutes of device time (run 7:
# ~30 s of preparing and ~22 s of timing per entry), and a session has 30. So it runs as two halves, in two
# sessions, on one code:
#   PART=1/2 OUT=$OUT LIMIT=570 bash tools/gpu_bench.sh prepare   # build what is not built yet, 12 entries at a time
#   PART=1/2 OUT=$OUT LIMIT=570 bash tools/gpu_bench.sh time      # time them; their records to $OUT/timed.tar.gz
#   (commit those records, e.g. as benchmarks/results/RUN/records/; change nothing under src/ until part 2 has run)
#   RECORDS=benchmarks/results/RUN/records PART=2/2 OUT=$OUT LIMIT=570 bash tools/gpu_bench.sh prepare   # next session
#   RECORDS=benchmarks/results/RUN/records PART=2/2 OUT=$OUT LIMIT=570 bash tools/gpu_bench.sh time
#   RECORDS=benchmarks/results/RUN/records OUT=$OUT bash tools/gpu_bench.sh report   # the report, once every entry is timed
# PART=K/N takes every N-th entry from the K-th (heavy and light entries spread over the halves); ONLY="a b" takes
# those entries (a quick look at a few, e.g. the ones a change should move); without either, all.
# A record (WORKDIR/timed/NAME.pickle) is taken by `--resume` only when the code (trtmc's source digest), the versions,
# the machine and the entry are the same; RECORDS (default bench-records/timed) are copied into the work folder first.
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-bench}
WORK=${WORK:-/tmp/bw}
LIMIT=${LIMIT:-570}
RECORDS=${RECORDS:-bench-records/timed}
mkdir -p "$OUT" "$WORK/timed"
[ -d "$RECORDS" ] && cp -n "$RECORDS"/*.pickle "$WORK/timed/" 2>/dev/null
python3 -c "from trtmc.bench.runner import source_digest; print('trtmc source', source_digest())" >>"$OUT/bench.log"
names=$(python3 -m trtmc bench --list | awk '{print $1}')
only=()
for name in ${ONLY:-}; do
    only+=(--only "$name")
done
if [ -n "${PART:-}" ]; then
    for name in $(echo "$names" | awk -v k="${PART%/*}" -v n="${PART#*/}" '(NR - 1) % n == k - 1'); do
        only+=(--only "$name")
    done
fi
case "${1:-}" in
    prepare)
        # Two compile workers per build: twelve builds at once would otherwise start 16 workers each.
        TORCHINDUCTOR_COMPILE_THREADS=2 timeout "$LIMIT" python3 -m trtmc bench --random-weights --baseline expert \
            "${only[@]}" --prepare-only --reuse-prepared --prepare-jobs 12 --workdir "$WORK" --out "$OUT/prepared" \
            >>"$OUT/bench.log" 2>&1 ;;
    time)
        timeout "$LIMIT" python3 -m trtmc bench --random-weights --baseline expert "${only[@]}" --reuse-prepared --resume \
            --workdir "$WORK" --out "$OUT/bench" >>"$OUT/bench.log" 2>&1 ;;
    report)
        missing=$(for name in $names; do [ -f "$WORK/timed/$name.pickle" ] || echo "$name"; done)
        if [ -n "$missing" ]; then
            echo "not timed yet: $(echo $missing)" | tee -a "$OUT/bench.log"; exit 1
        fi
        # A record of other code or of another machine would be timed again here, unprepared: refuse instead,
        # naming what differs.
        if ! python3 - "$WORK/timed" >>"$OUT/bench.log" 2>&1 <<'PY'
import pickle, sys
from pathlib import Path
from trtmc.bench.runner import environment
here = environment("cuda")
differ = {}
for path in sorted(Path(sys.argv[1]).glob("*.pickle")):
    there = pickle.loads(path.read_bytes())["environment"]
    keys = sorted(k for k in set(here) | set(there) if here.get(k) != there.get(k))
    if keys:
        differ[path.stem] = {k: (there.get(k), here.get(k)) for k in keys}
if differ:
    sys.exit(f"records made by other code or on another machine (record, here): {differ}")
PY
        then
            tail -1 "$OUT/bench.log"; exit 1
        fi
        # Every entry from its record (each is checked against this code and machine; one that is not the same is
        # timed again, which needs its prepared bundle: the log says so).
        timeout "$LIMIT" python3 -m trtmc bench --random-weights --baseline expert --reuse-prepared --resume \
            --workdir "$WORK" --out "$OUT/bench" >>"$OUT/bench.log" 2>&1 ;;
    *) echo "usage: [PART=K/N | ONLY=\"NAME ...\"] [RECORDS=DIR] OUT=DIR LIMIT=SECONDS bash tools/gpu_bench.sh prepare|time|report" >&2; exit 2 ;;
esac
echo "exit status $?" >>"$OUT/bench.log"
# One archive: a call brings back at most 8 files.
tar -czf "$OUT/timed.tar.gz" -C "$WORK" timed
echo "$(ls "$WORK/timed" | wc -l) entries timed so far" | tee -a "$OUT/bench.log"

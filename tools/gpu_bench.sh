#!/usr/bin/env bash
# The full bench (`trtmc bench --random-weights --baseline expert`, every entry of benchmarks/performance.yaml) on
# the GPU machine. One call is at most 10 minutes and the whole takes more, so `run` does what one call can and
# the same command, repeated on the same machine (each call within the 30 s it stays warm), finishes it:
#   OUT=$OUT LIMIT=585 bash tools/gpu_bench.sh run   # prepare what is neither prepared nor timed by this code, time
#                                                    # what is prepared and not timed, the report once all are timed
# A session that runs out of device time keeps its records ($OUT/timed.tar.gz): unpacked into RECORDS and carried,
# the next session's calls (same code, same machine kind) prepare and time only the rest.
# Preparing runs JOBS processes at a time (default 14), an entry's build and its baselines' compiles in processes of
# their own, each with its share of the CPUs (`trtmc bench --prepare-jobs`); every entry's prepare leaves a note once
# both are done, so a prepare cut short by the time limit is taken up where it stopped, and timing never starts on
# an entry whose baselines were not compiled yet. Timing runs after preparing, never beside it (the task rows are
# timed on the host).
# The steps alone, as before:
#   [PART=K/N | ONLY="NAME ..."] OUT=$OUT LIMIT=570 bash tools/gpu_bench.sh run|prepare|time|report
# PART=K/N takes every N-th entry from the K-th; ONLY="a b" takes those entries; without either, all. `run` with
# them prepares and times those entries only. `time` times only prepared entries and names the others: given an
# unprepared entry, `trtmc bench` would build it inside the time limit (run 12 lost a call's last 270 s so).
# A record (WORKDIR/timed/NAME.pickle) is taken by `--resume` only when the code (trtmc's source digest), the versions,
# the machine and the entry are the same; RECORDS (default bench-records/timed; or a call's timed.tar.gz, as committed
# in the results folder of a bench cut short; several, separated by spaces, for the calls of a bench that lost its
# machine between them) are copied into the work folder first.
# $OUT gets bench.log, timed.tar.gz (the records) and, from `time` and `report`, bench/results.{json,md} and latency.png.
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-bench}
WORK=${WORK:-/tmp/bw}
LIMIT=${LIMIT:-570}
RECORDS=${RECORDS:-bench-records/timed}
# A dry run of this script's steps on a CPU machine (tiny entries, the reference engine), before a GPU session:
#   DEVICE=cpu BENCH_ARGS="--config FILE --backend reference" OUT=/tmp/dry bash tools/gpu_bench.sh run
DEVICE=${DEVICE:-cuda}
read -r -a BENCH_ARGS <<<"${BENCH_ARGS:-}"
mkdir -p "$OUT" "$WORK/timed"
for records in $RECORDS; do  # one or more, separated by spaces; a record already in the work folder stays
    if [ -f "$records" ]; then  # an archive a call brought back (committed beside a bench cut short)
        tar -xzf "$records" -C "$WORK" --skip-old-files
    elif [ -d "$records" ]; then
        cp -n "$records"/*.pickle "$WORK/timed/" 2>/dev/null
    fi
done
python3 -c "from trtmc.bench.runner import source_digest; print('trtmc source', source_digest())" >>"$OUT/bench.log"
names=$(python3 -m trtmc bench "${BENCH_ARGS[@]}" --list | awk '{print $1}')
JOBS=${JOBS:-14}

lowest_memory() {  # every 5 s until killed: the least memory available so far (MiB), in $WORK/lowest-memory
    local lowest=999999999 now
    while sleep 5; do
        now=$(awk '/^MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
        [ "$now" -lt "$lowest" ] && lowest=$now && echo "$lowest" >"$WORK/lowest-memory"
    done
}

prepare() {  # LIMIT [--only NAME ...]: the CPU-bound part of the entries not prepared yet, JOBS at a time
    local limit=$1 sampler; shift
    lowest_memory & sampler=$!  # JOBS processes, each with its compile workers: how close to the machine's memory
    timeout "$limit" python3 -m trtmc bench "${BENCH_ARGS[@]}" --device "$DEVICE" --random-weights --baseline expert "$@" --prepare-only --reuse-prepared \
        --prepare-jobs "$JOBS" --workdir "$WORK" --out "$OUT/prepared" >>"$OUT/bench.log" 2>&1
    echo "prepare exit status $?; least memory available while preparing: $(cat "$WORK/lowest-memory" 2>/dev/null) MiB" \
        >>"$OUT/bench.log"
    kill "$sampler" 2>/dev/null
}

timed() {  # LIMIT [--only NAME ...]: time with the prepared bundles; entries timed by this code come from their records
    local limit=$1; shift
    timeout "$limit" python3 -m trtmc bench "${BENCH_ARGS[@]}" --device "$DEVICE" --random-weights --baseline expert "$@" --reuse-prepared --resume \
        --workdir "$WORK" --out "$OUT/bench" >>"$OUT/bench.log" 2>&1
    echo "time exit status $?" >>"$OUT/bench.log"
}

unprepared() {  # the chosen entries whose prepare phase has not finished (no note in WORK/prepared)
    for name in $chosen; do [ -f "$WORK/prepared/$name.json" ] || echo "$name"; done
}

prepared() {  # NAME...: those whose prepare phase has finished
    for name in "$@"; do [ -f "$WORK/prepared/$name.json" ] && echo "$name"; done
}

stale() {  # NAME...: those with no record of this code's timing on this machine (the log says what differs)
    python3 - "$WORK" "$DEVICE" "$@" 2>>"$OUT/bench.log" <<'PY'
import pickle, sys
from pathlib import Path
from trtmc.bench.runner import environment, same_machine
work, device, names = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
here = environment(device)
for name in names:
    record = work / "timed" / f"{name}.pickle"
    if not record.is_file():
        print(name)
        continue
    there = pickle.loads(record.read_bytes())["environment"]
    if not same_machine(there, here):
        differ = {k: (there.get(k), here.get(k)) for k in sorted(set(here) | set(there)) if here.get(k) != there.get(k)}
        print(f"{name}: recorded by other code or on another machine (record, here): {differ}", file=sys.stderr)
        print(name)
PY
}

untimed() {  # the chosen prepared entries with no record of this code's timing on this machine
    stale $(prepared $chosen)
}

on() {  # FN LIMIT NAME...: FN (prepare or timed) for those entries only, or for every entry without a NAME
    local fn=$1 limit=$2 args=()
    shift 2
    for name in "$@"; do args+=(--only "$name"); done
    "$fn" "$limit" "${args[@]}"
}

selected="${ONLY:-}"
if [ -n "${PART:-}" ]; then
    selected="$selected $(echo "$names" | awk -v k="${PART%/*}" -v n="${PART#*/}" '(NR - 1) % n == k - 1')"
fi
chosen=${selected:-$names}
case "${1:-}" in
    prepare)
        on prepare "$LIMIT" $selected ;;
    time)
        left=$(unprepared)
        [ -n "$left" ] && echo "not prepared, so not timed: $(echo $left)" | tee -a "$OUT/bench.log"
        ready=$(prepared $chosen)
        if [ -n "$ready" ]; then on timed "$LIMIT" $ready; fi ;;
    run)
        { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv; nproc; free -g; } \
            >>"$OUT/bench.log" 2>&1
        # Entries already timed by this code (records from an earlier call or session) are not prepared again.
        toprepare=$(stale $(unprepared))
        [ -n "$toprepare" ] && on prepare $((LIMIT - SECONDS - 20)) $toprepare
        todo=$(untimed)
        if [ -n "$todo" ] && [ $((LIMIT - SECONDS)) -gt 60 ]; then
            on timed $((LIMIT - SECONDS - 15)) $todo
        fi
        if [ -z "$(stale $chosen)" ]; then
            echo "every chosen entry timed: the report" >>"$OUT/bench.log"
            on timed $((LIMIT - SECONDS - 5)) $selected
        fi ;;
    report)
        # A record of other code or of another machine would be timed again here, unprepared: refuse instead.
        missing=$(stale $chosen)
        if [ -n "$missing" ]; then
            echo "not timed by this code on this machine: $(echo $missing)" | tee -a "$OUT/bench.log"; exit 1
        fi
        on timed "$LIMIT" $selected ;;  # every chosen entry from its record
    *) echo "usage: [PART=K/N | ONLY=\"NAME ...\"] [RECORDS=\"DIR|ARCHIVE ...\"] OUT=DIR LIMIT=SECONDS bash tools/gpu_bench.sh run|prepare|time|report" >&2; exit 2 ;;
esac
echo "exit status $?" >>"$OUT/bench.log"
# One archive: a call brings back at most 8 files.
tar -czf "$OUT/timed.tar.gz" -C "$WORK" timed
echo "$(ls "$WORK/timed" | wc -l) entries timed so far" | tee -a "$OUT/bench.log"

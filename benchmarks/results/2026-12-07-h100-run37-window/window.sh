#!/usr/bin/env bash
# main's depthwise window (4 x 4) against 9da985b's 4 x 7 at batch > 1, convnext_tiny fp16 batch 128, trtmc engine only.
set -u
R=$PWD HERE=$(cd "$(dirname "$0")" && pwd); export PYTHONUNBUFFERED=1
rm -rf /tmp/win && mkdir -p /tmp/win && cp -r src /tmp/win/ && (cd /tmp/win && patch -p1 -s < "$HERE/window.patch") || exit 3
grep -c SEVEN_WIDE_TILE /tmp/win/src/trtmc/backends/depthwise_kernel.py >"$OUT/patched.txt"
args=(--only convnext_tiny --batch 128 --random-weights --no-baselines --device cuda)
prep() {  # SRC WORK NAME
    PYTHONPATH=$1 timeout 200 python3 -m trtmc bench "${args[@]}" --prepare-only --workdir "$2" --out "$OUT/prep-$3" >"$OUT/prep-$3.log" 2>&1
    echo "prepare $3 exit $? at $SECONDS s" >>"$OUT/steps.log"
}
timed() {  # SRC WORK NAME
    PYTHONPATH=$1 timeout 120 python3 -m trtmc bench "${args[@]}" --reuse-prepared --workdir "$2" --out "$OUT/$3" >"$OUT/$3.log" 2>&1
    echo "time $3 exit $? at $SECONDS s" >>"$OUT/steps.log"
    grep -E "convnext_tiny .* 128 " "$OUT/$3/results.md" | head -3 >>"$OUT/steps.log"
}
prep "$R/src" /tmp/wm main & prep /tmp/win/src /tmp/ww window & wait
timed "$R/src" /tmp/wm main-1
timed /tmp/win/src /tmp/ww window-1
timed "$R/src" /tmp/wm main-2
timed /tmp/win/src /tmp/ww window-2
cat "$OUT/steps.log"

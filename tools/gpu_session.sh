#!/usr/bin/env bash
# Issue 10's numbers on the GPU machine (H200, torch 2.11, no network), one call; benchmarks/NOTES.md reads them.
# Steps, run in the order given (default: bundles cold folders folderbench aoti):
#   bundles      lite0 (real weights), ghostnet_100 and resnet50 (random weights), fp16, cuda, --max-batch 64, in
#                parallel; `bundles-lite0` builds lite0 only
#   cold         `trtmc -v classify BUNDLE chelsea.png` in a fresh process with empty Inductor and Triton disk
#                caches (a user's first run on a new machine: only the bundle's caches): the quick start (the
#                default) for lite0 twice, ghostnet_100 and resnet50, then lite0 `--compiled` for comparison
#   coldkernel   convnext_tiny's bundle (the bench's where a bench ran here, else one built at max batch
#                COLDKERNEL_MAX_BATCH, default 1: random weights, its build keeps trtmc's Triton depthwise kernel),
#                then `trtmc -v classify BUNDLE chelsea.png --compiled` as `cold` runs it (empty Inductor and Triton
#                caches), then under cProfile: in empty caches without putting the bundle's Triton kernels back
#                (tools/classify_without_kernels.py: bundles before run 34), in empty caches, and again in the
#                caches that left (load-{cold-unrestored,cold,warm}.prof and .txt, by cumulative time);
#                load-kernels.txt: the Triton cache's kernels after the loads, each with its folder
#   buildalone   a user's build, alone on the machine (all CPUs, nothing beside it; the bench's prepare runs 14):
#                `trtmc -v build` at max batch 128, fp16, of each of BUILD_ARCHS (default vit_base_patch16_224, whose
#                gemm-templates candidate took 149 s of a 181 s build in run 25's prepare), random weights, in
#                fresh Inductor and Triton caches; wall time in measurements.jsonl, the build's log in session.log
#   enginegap    tools/engine_gap_probe.py at batch 1 and 128 on GAP_ARCHS (default resnet50 convnext_tiny
#                mobilenetv3_large_100): the bench's prepared bundle where a bench ran on this machine (/tmp/bw), else
#                one built here at max batch 128; the engine call's layers (replay alone, as the build times it,
#                up to engine(x), as the bench does) timed interleaved, and each one's host cost per call; results in
#                enginegap/ARCH.json
#   buildgap     tools/build_gap_probe.py at batch 1 on BUILDGAP_ARCHS (default resnet50 vit_base_patch16_224), each
#                built here first at max batch 1, alone on the machine: the bundle's graph as the bench replays it,
#                the same module captured from randn as the build captures, and the lowering compiled afresh in the
#                same process, timed interleaved, with the kernels of one replay (runs 26-27: the same graph 6-8%
#                quicker at build than in a later process, at the GPU's full clock); results in buildgap/ARCH.json
#   buildbusy    the same as buildgap with BUSY_CPUS (default 14) busy loops on the CPUs while each model builds, as
#                the bench's prepare keeps them busy with 13 other builds (run 27's prepare recorded resnet50's batch-1
#                graph at 0.303 ms, run 28's build alone at 0.322, as every later process times it); BUSY=gpu instead
#                runs tools/gpu_nudge.py (~200 us of GPU work every 5 ms from another process) through the build and
#                the probe; in buildbusy-cpu/ or buildbusy-gpu/
#   folders      `trtmc classify` over 2,002 and 20,000 photos (the 22 repo photos linked round-robin), then the
#                2,002 with `--compiled` and with `--resize-on workers`
#   firstcall    tools/first_call_probe.py: the quick start's first uncompiled call profiled, with cuDNN and with
#                the depthwise convolutions on PyTorch's own kernels, for the three bundles of `bundles`
#   dwshapes     tools/depthwise_shapes_probe.py: ghostnet_100's depthwise convolutions one by one, batch 1 and
#                128, eager: cuDNN's kernel for each, channels-last against NCHW and against stride-1 + subsample
#   resizecheck  tools/device_resize_check.py: the folder pipeline's GPU resize against its worker resize (logits
#                bit for bit on the photos and noise of awkward sizes, page-locked slots, images/s over 2,002 files)
#   taps         tools/depthwise_taps_probe.py: depthwise convolutions as fused taps against cuDNN's, ghostnet_100 and
#                efficientnet_b0 at batch 1 and 128 (compiled in parallel first, then timed one model at a time, an
#                equal share of the time left each)
#   templates    tools/autotune_probe.py (issue 12's template levers, never yet run on the GPU): Triton GEMM templates
#                with the GELU in their epilogue for vit_base_patch16_224 and convnext_tiny, then Triton convolution
#                templates for resnet50, each against the expert at batch 1 and 128, one model at a time (an equal
#                share of the time left each); results in templates/ARCH.json after every batch size;
#                TEMPLATES_ARCHS="vit_base_patch16_224 ..." and TEMPLATES_BATCHES="128" narrow it (run 24: one
#                model's two batch sizes need ~250 s); TEMPLATES_VARIANTS="gemm_templates,gemm_templates_tma" sets
#                every chosen model's variants (comma-separated, the probe's names)
#   dwtriton     tools/depthwise_taps_probe.py: the engine against the engine with every depthwise convolution it
#                leaves to cuDNN on trtmc's Triton kernel (`trtmc.backends.depthwise_kernel`; run 21), batch
#                1 and 128, for the four entries whose depthwise convolutions cuDNN still runs at batch 1
#                (edgenext_small's and convnext_tiny's 7x7, efficientnet_b0's and ghostnet_100's feeding
#                squeeze-excite means); compiled in parallel first, then timed one model at a time, an equal share
#                of the time left each; results in dwtriton/ARCH.json (DWTRITON_BATCHES="--batch 128": one size)
#   gelu         tools/gelu_products_probe.py on GELU_ARCHS (default convnext_tiny vit_base_patch16_224
#                edgenext_small) at GELU_BATCHES (default 1 and 128): the lowering a build keeps, and the same with
#                each GELU after a half-precision product computed with it as one cuBLASLt call; in gelu/ARCH.json
#   patches      tools/depthwise_taps_probe.py: the engine with its patch embeddings on cuDNN (padded to 8 channels,
#                run 26: 708 + 115 us of vit_base's 11.09 ms at batch 128) against the same as one matrix product each
#                (`patch_product_nodes`, every CUDA lowering since run 26), batch 1 and 128, for PATCHES_ARCHS
#                (default the ones not yet measured: swin_tiny_patch4_window7_224 edgenext_small beit_base_patch16_224;
#                run 26 measured vit_base_patch16_224 -13.5% / -6.2%, convnext_tiny -3.1% / +0.3%); in patches/ARCH.json
#   dwtune       tools/depthwise_kernel_tune.py: every depthwise convolution of convnext_tiny, edgenext_small,
#                efficientnet_b0, ghostnet_100, tf_efficientnetv2_s and fastvit_t8 one at a time at batch 1 and 128, on
#                cuDNN, on trtmc's Triton kernel as built and with other tiles, and on a row-tiled variant (run 22,
#                three models: 136 s; the tile built since was the quickest at batch 1); compiled in parallel
#                first, then timed one model at a time, an equal share of the time left each; results in
#                dwtune/ARCH.json (~300 s for all six); DWTUNE_VARIANTS=REGEX times only the variants it matches
#   pdl          tools/autotune_probe.py's `pdl` variant (Inductor's programmatic dependent launch, never yet run on
#                the GPU) against the expert for ghostnet_100 and efficientnet_b0 at batch 1 (where they are
#                launch-bound; ~70 s a model from cold caches), an equal share of the time left each; `pdl128` the same
#                at batch 128; results in pdl/ARCH.json
#   tapscap      tools/depthwise_taps_probe.py on mixnet_s at batch 1: the engine's taps (kernels up to 5x5 since run
#                16), the same with its 7x7 kernels too, with its 7x7 and 9x9 kernels, and no taps (run 15, all as
#                taps: the engine's batch-1 compile took 266 s of a 322 s build, over issue 12's 2 minutes; run 16:
#                up to 5x5 36 s and 0.774 ms, all 84 s and 0.665 ms); results in tapscap/mixnet_s.json
#   cachekey     tools/cache_key_probe.py on vit_base_patch16_224 (built as a bench prepare builds it, then loaded in a
#                fresh process; its load missed the bundle's caches in every run): the FX graph cache keys of both
#                processes and what differs, in cachekey/
#   probe        tools/pipeline_probe.py on the 2,002 photos: decoding alone and the whole pipeline, profiled
#   folderbench  the folder scope of `trtmc bench` (2,002 and 20,000 files, trtmc against timm + DataLoader +
#                torch.compile) and Ray Data over the 2,002 files (tools/folder_bench.py), with Ray from
#                .whl/ray-site.tar.xz where it was carried
#   ray          Ray Data alone over 2,002 files (1 actor, then 4 sharing the GPU), timm's top-1 from run 5's folder bench
#   aoti         the AOTInductor package (exported here unless `bundles` did) loaded in a fresh process with the system libstdc++ preloaded
#                (tools/aoti_cuda_probe.py load): load time and its profile, first call, parity, CUDA-graph capture
#   behind       the two entries behind the expert at batch 1 in run 18 (H100): edgenext_small's depthwise convolutions
#                that feed layer norms as taps (runs 9-10: 1.21x the expert on the H200) against cuDNN (since run 11:
#                0.95x), and mobilevit_s (0.94x) with its taps and without, then against the expert kernel by kernel
#                (tools/miss_profile.py on a bundle built here); results in behind/ (the taps probe's) and
#                behind/profile/ (miss_profile's: run 18 wrote both to behind/mobilevit_s.json, the probe's was lost);
#                `behind-profile` builds the bundle and runs miss_profile only (~150 s)
#   misses       tools/miss_profile.py (trtmc's engine against the expert, timed interleaved and kernel by kernel, batch
#                1 and 128) for each of MISS_ARCHS (default efficientvit_b1, run 30's one row slower than the expert
#                beyond the margin, at batch 128): the bench's prepared bundle where a bench ran on this machine
#                (/tmp/bw), else one built here at max batch 128; results in misses/ARCH.json (each launch in order
#                under `launches`); MISS_CODE=TEXT runs it in an empty Inductor cache and keeps in misses/code/ the
#                generated Python (output code and Triton kernels: the bundle's, the recompiled and the expert's) that
#                names TEXT; MISS_OPTIONS='{"coordinate_descent_tuning": true}' (Inductor options, JSON) adds a row
#                compiled with them and MISS_BATCHES="128" times that batch size alone (tools/miss_profile.py)
#   cudnnbench   cuDNN's benchmark mode against its heuristic's pick, for trtmc's engine and the expert alike (each
#                mode a process of its own: ATen caches one plan per convolution shape whatever the flag), batch 1 and
#                128, for each of CUDNN_ARCHS (default resnet50 efficientnet_b0 ghostnet_100, issue 12's convolutional
#                misses): bundles as `misses` takes them (built here three at a time otherwise); results in
#                cudnnbench/ARCH-heuristic.json and ARCH-benchmark.json
# Every step has its own time limit. $OUT gets session.log and results.tar.gz (measurements.jsonl: wall time and
# peak RSS per command; folder/: the bench's results and ray.json; aoti/; probe/; clocks-STEP.csv: the GPU's SM and
# memory clocks, power and temperature every 200 ms while the step ran, as nvidia-smi reads them).
#   OUT=/tmp/out bash tools/gpu_session.sh bundles-lite0 probe folderbench aoti
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu-session}
WORK=${WORK:-/tmp/trtmc-gpu}
LIMIT=${LIMIT:-585}  # seconds this script may run: the last step gets what is left
RESULTS="$WORK/results"
mkdir -p "$OUT" "$RESULTS/aoti"
LOG="$OUT/session.log"
say() { echo "=== $(date +%T) +${SECONDS}s $*" | tee -a "$LOG"; }
measure() { local name=$1; shift; python3 tools/measure.py "$RESULTS/measurements.jsonl" "$name" -- "$@" >>"$LOG" 2>&1; }
left() { echo $((LIMIT - SECONDS)); }

machine() {
    # Each source file's digest: `sha256sum -c source-files.sha256` on a checkout names any file that differs
    # (the machine's .git can be stale, and one digest of the whole tree cannot say which file changed).
    find src tools -type f \( -name '*.py' -o -name '*.sh' \) | LC_ALL=C sort | xargs sha256sum >"$OUT/source-files.sha256"
    { nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"; nproc; } >>"$LOG" 2>&1
    if [ -f .whl/ray-site.tar.xz ]; then
        ( mkdir -p /tmp/raysite && tar -xJf .whl/ray-site.tar.xz -C /tmp/raysite && echo "ray unpacked" >>"$LOG" ) &
    fi
    python3 - >>"$LOG" 2>&1 <<'PY'
import os
from pathlib import Path
photos = sorted(p.resolve() for p in Path("examples/images").iterdir() if p.suffix in (".jpg", ".png"))
for count in (2002, 20000):
    folder = Path(f"/tmp/trtmc-gpu/photos-{count}")
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        link = folder / f"{i:05d}{photos[i % len(photos)].suffix}"
        if not link.exists():
            os.symlink(photos[i % len(photos)], link)
PY
}

build_one() {  # NAME CHECKPOINT [MAX_BATCH, default 64]
    timeout 300 python3 -m trtmc build "$2" -o "$WORK/$1.bundle" --precision fp16 --device cuda --max-batch "${3:-64}" -q \
        >"$WORK/build-$1.log" 2>&1
    echo "build $1: $?" >>"$LOG"
}

random_checkpoints() {  # ARCH...: timm's architecture with random weights in $WORK/ARCH, each saved once
    python3 - "$WORK" "$@" >>"$LOG" 2>&1 <<'PY'
import sys
from pathlib import Path
from trtmc.random_weights import save_random_checkpoint
work = Path(sys.argv[1])
for arch in sys.argv[2:]:
    if not (work / arch / "config.json").is_file():
        save_random_checkpoint(arch, work / arch)
PY
}

aoti_export() {
    timeout 240 python3 tools/aoti_cuda_probe.py export "$WORK/lite0.bundle" "$RESULTS/aoti" 1 >"$WORK/aoti-export.log" 2>&1
    echo "aoti export: $?" >>"$LOG"
}

bundles() {
    random_checkpoints ghostnet_100 resnet50
    build_one lite0 examples/checkpoints/tf_efficientnet_lite0.in1k &
    build_one ghostnet_100 "$WORK/ghostnet_100" &
    build_one resnet50 "$WORK/resnet50" &
    wait
    cat "$WORK"/build-*.log >>"$LOG" 2>/dev/null
}

bundles_lite0() { build_one lite0 examples/checkpoints/tf_efficientnet_lite0.in1k; cat "$WORK/build-lite0.log" >>"$LOG"; }

measure_cold() {  # NAME [ENV=VALUE ...] COMMAND...: measured with empty Inductor and Triton disk caches (a new machine's)
    local name=$1; shift
    local caches; caches=$(mktemp -d)
    measure "$name" env TORCHINDUCTOR_CACHE_DIR="$caches/inductor" TRITON_CACHE_DIR="$caches/triton" "$@"
    rm -rf "$caches"
}

cold_one() {  # NAME BUNDLE [ENV=VALUE ...]
    local name=$1 bundle=$2; shift 2
    measure_cold "$name" "$@" \
        timeout 90 python3 -m trtmc -v classify "$WORK/$bundle.bundle" examples/images/chelsea.png --top-k 1 $EXTRA
}

cold() {  # builds the bundles first where `bundles` has not (run 24's `cold` alone found none)
    [ -f "$WORK/lite0.bundle" ] && [ -f "$WORK/ghostnet_100.bundle" ] && [ -f "$WORK/resnet50.bundle" ] || bundles
    EXTRA= cold_one cold-lite0-1 lite0
    EXTRA= cold_one cold-lite0-2 lite0
    EXTRA= cold_one cold-ghostnet_100 ghostnet_100
    EXTRA= cold_one cold-resnet50 resnet50
    EXTRA=--compiled cold_one cold-lite0-compiled lite0
}

coldkernel() {  # convnext_tiny, whose build keeps trtmc's Triton depthwise kernel at batch 1: the compiled first
    # answer in a fresh process whose Triton cache never saw the kernel, then where loads spend their time
    local bundle=/tmp/bw/bundles/convnext_tiny-fp16-inductor.bundle caches  # the bench's, where a bench ran here
    if [ ! -f "$bundle" ]; then
        random_checkpoints convnext_tiny
        [ -f "$WORK/convnext_tiny.bundle" ] || build_one convnext_tiny "$WORK/convnext_tiny" "${COLDKERNEL_MAX_BATCH:-1}"
        cat "$WORK/build-convnext_tiny.log" >>"$LOG" 2>/dev/null
        bundle=$WORK/convnext_tiny.bundle
    fi
    local args=(-v classify "$bundle" examples/images/chelsea.png --top-k 1 --compiled)
    measure_cold cold-convnext_tiny-compiled-1 timeout 90 python3 -m trtmc "${args[@]}"
    profiled_load cold-unrestored "$(mktemp -d)" tools/classify_without_kernels.py "${args[@]}"  # as before run 34
    caches=$(mktemp -d)
    profiled_load cold "$caches" -m trtmc "${args[@]}"  # empty caches, the bundle's Triton kernels put back
    profiled_load warm "$caches" -m trtmc "${args[@]}"  # the caches the cold load left, as the bench's loads find them
    find "$caches/triton" -name '*.json' ! -name '__grp__*' -exec python3 -c \
        'import json, sys; [print(json.load(open(f)).get("name"), f.split("/")[-2]) for f in sys.argv[1:]]' {} + \
        | sort >"$RESULTS/load-kernels.txt" 2>>"$LOG"
    rm -rf "$caches"
}

profiled_load() {  # NAME CACHES CLASSIFY...: a load under cProfile with CACHES/{inductor,triton}; load-NAME.{prof,txt}
    local name=$1 caches=$2; shift 2
    measure "load-$name-profiled" env TORCHINDUCTOR_CACHE_DIR="$caches/inductor" TRITON_CACHE_DIR="$caches/triton" \
        timeout 150 python3 -m cProfile -o "$RESULTS/load-$name.prof" "$@"
    python3 -c 'import pstats, sys; pstats.Stats(sys.argv[1], stream=sys.stdout).sort_stats("cumulative").print_stats(80)' \
        "$RESULTS/load-$name.prof" >"$RESULTS/load-$name.txt" 2>>"$LOG"
}

buildalone() {  # issue 12's 2 minutes, for a user's build
    local arch
    for arch in ${BUILD_ARCHS:-vit_base_patch16_224}; do
        random_checkpoints "$arch"
        measure_cold "build-alone-$arch" timeout "$(left)" python3 -m trtmc -v build "$WORK/$arch" \
            -o "$WORK/$arch-alone.bundle" --precision fp16 --device cuda --max-batch 128
    done
}

enginegap() {  # run 25: the bench's engine row 8-20% slower than the build's replay of the same lowering at batch 1
    local arch bundle
    mkdir -p "$RESULTS/enginegap"
    for arch in ${GAP_ARCHS:-resnet50 convnext_tiny mobilenetv3_large_100}; do
        bundle=/tmp/bw/bundles/$arch-fp16-inductor.bundle
        if [ ! -f "$bundle" ]; then
            random_checkpoints "$arch"
            [ -f "$WORK/$arch.bundle" ] || build_one "$arch" "$WORK/$arch" 128
            bundle=$WORK/$arch.bundle
        fi
        timeout "$(left)" python3 tools/engine_gap_probe.py "$bundle" "$RESULTS/enginegap/$arch.json" 1 128 >>"$LOG" 2>&1
        echo "engine gap $arch: $?" >>"$LOG"
    done
}

folders() {
    for count in 2002 20000; do
        measure "folder-lite0-$count" timeout 150 python3 -m trtmc -v classify "$WORK/lite0.bundle" "$WORK/photos-$count" \
            --top-k 1 --output "$WORK/scores-$count.csv"
    done
    measure "folder-lite0-2002-compiled" timeout 150 python3 -m trtmc -v classify "$WORK/lite0.bundle" \
        "$WORK/photos-2002" --top-k 1 --output "$WORK/scores-2002-compiled.csv" --compiled
    measure "folder-lite0-2002-resize-on-workers" timeout 150 python3 -m trtmc -v classify "$WORK/lite0.bundle" \
        "$WORK/photos-2002" --top-k 1 --output "$WORK/scores-2002-workers.csv" --resize-on workers
    head -3 "$WORK/scores-2002.csv" >>"$LOG"
}

firstcall() {  # the quick start's first call, profiled, with cuDNN and without it for depthwise convolutions, each in a
    # fresh process (tools/first_call_probe.py; run 8 found NCHW no faster than channels-last)
    for name in ghostnet_100 lite0 resnet50; do
        for cudnn in on off-for-grouped; do
            timeout 60 python3 tools/first_call_probe.py "$WORK/$name.bundle" "$RESULTS/firstcall/$name-cudnn-$cudnn.json" \
                --cudnn "$cudnn" >>"$LOG" 2>&1
        done
    done
}

dwshapes() {
    timeout 120 python3 tools/depthwise_shapes_probe.py "$RESULTS/depthwise-shapes.json" ghostnet_100 >>"$LOG" 2>&1
    echo "depthwise shapes probe: $?" >>"$LOG"
}

resizecheck() {
    timeout 200 python3 tools/device_resize_check.py "$WORK/lite0.bundle" "$RESULTS/resize-check.json" "$WORK/photos-2002" \
        >>"$LOG" 2>&1
    echo "resize check: $?" >>"$LOG"
}

per_arch_probe() {  # PROBE FOLDER THREADS "ARCH..." [PROBE ARGS...]: tools/PROBE `--compile-only` for every ARCH in
    local probe=$1 folder=$2 threads=$3 archs=$4 arch n  # parallel (THREADS compile workers each), then each ARCH
    shift 4                                              # timed, an equal share of the time left each; results in
    local compile_s=$(($(left) / 2))                     # FOLDER/ARCH.json. The compiles get at most half the time
    [ "$compile_s" -gt 240 ] && compile_s=240            # left; -k: a compile that ignores SIGTERM is killed
    for arch in $archs; do
        TORCHINDUCTOR_COMPILE_THREADS=$threads timeout -k 5 "$compile_s" python3 "tools/$probe" "$RESULTS/$folder" \
            "$arch" "$@" --compile-only >"$WORK/$folder-compile-$arch.log" 2>&1 &
    done
    wait
    tail -n 3 "$WORK/$folder"-compile-*.log >>"$LOG"
    n=$(wc -w <<<"$archs")
    for arch in $archs; do
        timeout -k 5 $(($(left) / n)) python3 "tools/$probe" "$RESULTS/$folder" "$arch" "$@" >>"$LOG" 2>&1
        echo "$folder $arch: $?" >>"$LOG"
        n=$((n - 1))
    done
}

taps() { per_arch_probe depthwise_taps_probe.py taps 8 "${TAPS_ARCHS:-ghostnet_100 efficientnet_b0}"; }

dwtriton() {
    per_arch_probe depthwise_taps_probe.py dwtriton 4 "${DWTRITON_ARCHS:-edgenext_small convnext_tiny efficientnet_b0 ghostnet_100}" \
        ${DWTRITON_BATCHES:---batch 1 --batch 128} --variant "the engine" --variant "the engine, the rest triton"
}

patches() {  # patch embeddings as cuDNN's padded convolution against one matrix product (run 26's lever)
    per_arch_probe depthwise_taps_probe.py patches 4 \
        "${PATCHES_ARCHS:-swin_tiny_patch4_window7_224 edgenext_small beit_base_patch16_224}" \
        --batch 1 --batch 128 --variant "the engine" --variant "the engine, patch products"
}

gelu() {  # a GELU's matrix product, bias and GELU as one cuBLASLt call, against the lowering a build keeps
    per_arch_probe gelu_products_probe.py gelu 4 "${GELU_ARCHS:-convnext_tiny vit_base_patch16_224 edgenext_small}" \
        ${GELU_BATCHES:---batch 1 --batch 128}
}

dwtune() {  # the tune probe writes ARCH.json after each batch size: a time limit keeps what was timed
    per_arch_probe depthwise_kernel_tune.py dwtune 1 \
        "${DWTUNE_ARCHS:-convnext_tiny edgenext_small efficientnet_b0 ghostnet_100 tf_efficientnetv2_s fastvit_t8}" \
        ${DWTUNE_VARIANTS:+--variants "$DWTUNE_VARIANTS"}
}

build_for_profile() {  # ARCH: a bundle (random weights, max batch 128) as `trtmc build` makes one, for miss_profile;
    # the bench's own prepared bundle where a bench ran on this machine (/tmp/bw), as `enginegap` takes it
    local prepared=/tmp/bw/bundles/$1-fp16-inductor.bundle
    if [ -f "$prepared" ]; then
        ln -sf "$prepared" "$WORK/$1.bundle" && echo "profile $1: the bench's prepared bundle" >>"$LOG"
        return
    fi
    random_checkpoints "$1"
    build_one "$1" "$WORK/$1" 128
    tail -n 2 "$WORK/build-$1.log" >>"$LOG"
}

profile_misses() {  # FOLDER ARCH...: tools/miss_profile.py on each one's bundle against the expert, batch 1 and 128
    local folder=$1 arch
    shift
    for arch in "$@"; do
        timeout "$(left)" python3 tools/miss_profile.py "$RESULTS/$folder" "$arch=$arch=$WORK/$arch.bundle" >>"$LOG" 2>&1
        echo "miss_profile $arch: $?" >>"$LOG"
    done
}

behind() {
    local edgenext=(--variant "the engine" --variant "the engine, taps into norms" --variant "taps into norms up to 9x9"
                    --variant "cudnn depthwise") mobilevit=(--variant "the engine" --variant "cudnn depthwise")
    build_for_profile mobilevit_s &
    TORCHINDUCTOR_COMPILE_THREADS=6 timeout 300 python3 tools/depthwise_taps_probe.py "$RESULTS/behind" edgenext_small \
        --batch 1 "${edgenext[@]}" --compile-only >"$WORK/behind-edgenext.log" 2>&1 &
    TORCHINDUCTOR_COMPILE_THREADS=4 timeout 300 python3 tools/depthwise_taps_probe.py "$RESULTS/behind" mobilevit_s \
        --batch 1 "${mobilevit[@]}" --compile-only >"$WORK/behind-mobilevit.log" 2>&1 &
    wait
    tail -n 4 "$WORK"/behind-*.log >>"$LOG"
    timeout "$(left)" python3 tools/depthwise_taps_probe.py "$RESULTS/behind" edgenext_small --batch 1 "${edgenext[@]}" >>"$LOG" 2>&1
    echo "taps edgenext_small: $?" >>"$LOG"
    timeout "$(left)" python3 tools/depthwise_taps_probe.py "$RESULTS/behind" mobilevit_s --batch 1 "${mobilevit[@]}" >>"$LOG" 2>&1
    echo "taps mobilevit_s: $?" >>"$LOG"
    profile_misses behind/profile mobilevit_s
}

behind_profile() { build_for_profile mobilevit_s; profile_misses behind/profile mobilevit_s; }

misses() {  # run 30: efficientvit_b1 at batch 128 the one row slower than the expert beyond the margin (0.95x)
    local archs=${MISS_ARCHS:-efficientvit_b1} arch
    for arch in $archs; do build_for_profile "$arch"; done
    if [ -z "${MISS_CODE:-}" ]; then
        profile_misses misses $archs
        return
    fi
    # MISS_CODE=TEXT: the profile in an empty Inductor cache, then the generated code that names TEXT kept
    rm -rf "$WORK/misses-inductor"
    TORCHINDUCTOR_CACHE_DIR="$WORK/misses-inductor" profile_misses misses $archs
    mkdir -p "$RESULTS/misses/code"
    grep -rl --include='*.py' -e "$MISS_CODE" "$WORK/misses-inductor" | while read -r file; do
        cp "$file" "$RESULTS/misses/code/$(basename "$(dirname "$file")")-$(basename "$file")"
    done
    echo "misses: $(ls "$RESULTS/misses/code" | wc -l) generated files naming $MISS_CODE" >>"$LOG"
}

cudnnbench() {
    local archs=${CUDNN_ARCHS:-resnet50 efficientnet_b0 ghostnet_100} arch mode
    for arch in $archs; do build_for_profile "$arch" & done
    wait
    for arch in $archs; do
        for mode in heuristic:0 benchmark:1; do  # label:MISS_CUDNN_BENCHMARK
            MISS_RECOMPILE=0 MISS_CUDNN_BENCHMARK=${mode#*:} timeout "$(left)" python3 tools/miss_profile.py \
                "$RESULTS/cudnnbench" "$arch-${mode%:*}=$arch=$WORK/$arch.bundle" >>"$LOG" 2>&1
            echo "cudnnbench $arch ${mode%:*}: $?" >>"$LOG"
        done
    done
}

inductor_options() {  # FOLDER "BATCH..." ARCH:VARIANT...: tools/autotune_probe.py per model, each an equal share of
    local folder=$1 batches=$2 pair arch variants n  # the time left
    shift 2
    mkdir -p "$RESULTS/$folder"
    n=$#  # the models left: each gets an equal share of the time left when it starts
    for pair in "$@"; do
        arch=${pair%%:*} variants=expert,${pair#*:}
        VARIANTS=$variants timeout $(($(left) / n)) python3 tools/autotune_probe.py "$arch" \
            "$RESULTS/$folder/$arch.json" $batches >>"$LOG" 2>&1
        echo "$folder $arch ($variants): $?" >>"$LOG"
        n=$((n - 1))
    done
}

templates() {  # TEMPLATES_ARCHS picks models (run 24: a 300 s call measured vit_base's batch 1 only)
    local pairs=(vit_base_patch16_224:gemm_templates convnext_tiny:gemm_templates resnet50:max_autotune_templates)
    local chosen=() pair
    for pair in "${pairs[@]}"; do
        [ -n "${TEMPLATES_VARIANTS:-}" ] && pair="${pair%%:*}:$TEMPLATES_VARIANTS"  # e.g. gemm_templates,gemm_templates_tma
        [[ " ${TEMPLATES_ARCHS:-${pairs[*]%%:*}} " == *" ${pair%%:*} "* ]] && chosen+=("$pair")
    done
    inductor_options templates "${TEMPLATES_BATCHES:-1 128}" "${chosen[@]}"
}

gap_probe() {  # ARCH NAME FOLDER: tools/build_gap_probe.py at batch 1 on $WORK/NAME.bundle (its build log first)
    cat "$WORK/build-$2.log" >>"$LOG"
    timeout "$(left)" python3 tools/build_gap_probe.py "$WORK/$2.bundle" "$RESULTS/$3/$1.json" 1 >>"$LOG" 2>&1
    echo "$3 $1: $?" >>"$LOG"
}

buildgap() {  # runs 26-27: a replay at build 6-8% quicker than the same graph's in a later process, not the clock
    local arch
    mkdir -p "$RESULTS/buildgap"
    for arch in ${BUILDGAP_ARCHS:-resnet50 vit_base_patch16_224}; do
        random_checkpoints "$arch"
        [ -f "$WORK/$arch-b1.bundle" ] || build_one "$arch-b1" "$WORK/$arch" 1
        gap_probe "$arch" "$arch-b1" buildgap
    done
}

buildbusy() {  # run 28: built alone, each b1 build timed its graph as a later process does (within 1%), while run
    local arch hogs i  # 27's 14-build prepare recorded the same graphs 6-13% quicker: the busy CPUs? bursts on the GPU?
    local kind=${BUSY:-cpu}
    mkdir -p "$RESULTS/buildbusy-$kind"
    for arch in ${BUILDGAP_ARCHS:-resnet50 vit_base_patch16_224}; do
        random_checkpoints "$arch"
        hogs=()
        if [ "$kind" = gpu ]; then  # through the build and the probe: does a later replay speed up beside it too?
            timeout 600 python3 tools/gpu_nudge.py "$(left)" >>"$LOG" 2>&1 & hogs+=($!)
        else  # through the build only, as in the prepare
            for i in $(seq "${BUSY_CPUS:-14}"); do timeout 300 sh -c 'while :; do :; done' & hogs+=($!); done
        fi
        build_one "$arch-b1-busy-$kind" "$WORK/$arch" 1
        [ "$kind" = gpu ] || kill "${hogs[@]}" 2>/dev/null
        gap_probe "$arch" "$arch-b1-busy-$kind" "buildbusy-$kind"
        kill "${hogs[@]}" 2>/dev/null
    done
}

pdl() {
    inductor_options pdl 1 ghostnet_100:pdl efficientnet_b0:pdl
}

pdl128() {
    inductor_options pdl128 128 ghostnet_100:pdl efficientnet_b0:pdl
}

tapscap() {  # mixnet_s at batch 1: its 7x7 and 9x9 depthwise convolutions as taps or on cuDNN (compile time, speed)
    timeout "$(left)" python3 tools/depthwise_taps_probe.py "$RESULTS/tapscap" mixnet_s --batch 1 --variant "the engine" \
        --variant "the engine, taps up to 7x7" --variant "the engine, taps up to 9x9" --variant "cudnn depthwise" >>"$LOG" 2>&1
    echo "tapscap mixnet_s: $?" >>"$LOG"
}

cachekey() {  # vit_base_patch16_224 built as a bench prepare builds it, then loaded in a fresh process: which keys miss
    timeout "$(left)" python3 tools/cache_key_probe.py "$RESULTS/cachekey" vit_base_patch16_224 >>"$LOG" 2>&1
    echo "cachekey vit_base_patch16_224: $?" >>"$LOG"
    rm -f "$RESULTS"/cachekey/*.bundle; rm -rf "$RESULTS/cachekey/work"  # 350 MB and the random checkpoint
}

probe() {
    timeout 200 python3 tools/pipeline_probe.py "$WORK/lite0.bundle" "$WORK/photos-2002" "$RESULTS/probe" >>"$LOG" 2>&1
    echo "pipeline probe: $?" >>"$LOG"
}

folderbench() {
    wait  # the Ray unpacking
    local path=$PYTHONPATH
    [ -d /tmp/raysite/ray ] && path="$PYTHONPATH:/tmp/raysite"
    PYTHONPATH=$path timeout "$(left)" python3 tools/folder_bench.py --out "$RESULTS/folder" --workdir "$WORK/folderbench" \
        --images 2002 --images 20000 >>"$LOG" 2>&1
    echo "folder bench: $?" >>"$LOG"
    cat "$RESULTS/folder/summary.txt" >>"$LOG" 2>/dev/null
}

ray() {  # Ray Data alone, 1 and 4 actors sharing the GPU, with run 5's folder-bench results as timm's top-1
    local name=tf_efficientnet_lite0 bench="$WORK/folderbench"
    mkdir -p "$bench/bundles" "$RESULTS/folder/bench"
    [ -f "$bench/bundles/$name-fp16-inductor.bundle" ] || timeout 200 python3 -m trtmc build \
        examples/checkpoints/tf_efficientnet_lite0.in1k -o "$bench/bundles/$name-fp16-inductor.bundle" \
        --precision fp16 --device cuda --max-batch 64 -q >>"$LOG" 2>&1
    cp benchmarks/results/2026-12-01-h200-run5/folder-results.json "$RESULTS/folder/bench/results.json"
    wait  # the Ray unpacking
    for actors in 1 4; do
        PYTHONPATH="$PYTHONPATH:/tmp/raysite" timeout "$(left)" python3 tools/folder_bench.py --out "$RESULTS/folder" \
            --workdir "$bench" --images 2002 --skip-bench --ray-actors "$actors" --ray-json "ray-$actors.json" >>"$LOG" 2>&1
        cat "$RESULTS/folder/ray-$actors.json" >>"$LOG"
    done
}

aoti() {
    [ -f "$RESULTS/aoti/b1.pt2" ] || aoti_export
    cat "$WORK/aoti-export.log" >>"$LOG" 2>/dev/null
    local preload; preload=$(readlink -f "$(g++ -print-file-name=libstdc++.so.6)")
    echo "LD_PRELOAD=$preload" >>"$LOG"
    LD_PRELOAD=$preload timeout "$(left)" python3 tools/aoti_cuda_probe.py load "$WORK/lite0.bundle" "$RESULTS/aoti" 1 >>"$LOG" 2>&1
    echo "aoti load: $?" >>"$LOG"
}

clocks() {  # STEP: the GPU's clocks, power and temperature every 200 ms (read, never set) until killed
    command -v nvidia-smi >/dev/null || return 0
    exec nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
        --format=csv,noheader -lms 200 >"$RESULTS/clocks-$1.csv" 2>/dev/null
}

say machine; machine
for step in "${@:-bundles cold folders folderbench aoti}"; do
    for s in $step; do
        say "$s"
        clocks "$s" & sampler=$!  # whether a step ran at the GPU's full clock (run 26: replays 4-9% slower than at build)
        disown "$sampler"  # a step's own `wait` must not wait for the sampler (run 28: two calls hung there)
        "${s//-/_}"
        kill "$sampler" 2>/dev/null
        tar --exclude='*.pt2' -C "$RESULTS" -czf "$OUT/results.tar.gz" .  # after every step: a timeout loses only the step it hit
    done
done
say done

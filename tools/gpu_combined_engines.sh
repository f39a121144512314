#!/usr/bin/env bash
# On the GPU: a bundle holding a TensorRT-RTX plan (built on a CPU machine, carried in) and an inductor
# CUDA engine built here; classify must fall back to the inductor engine with one line saying why.
#   tools/gpu_combined_engines.sh TRT_BUNDLE OUT_DIR
set -u
trt_bundle=$1; out=$2
python3 -m trtmc build examples/checkpoints/tf_efficientnet_lite0.in1k -o "$out/combined.bundle" \
  --backend inductor --device cuda --precision fp16 --add-engines-from "$trt_bundle" -q
python3 -m trtmc inspect "$out/combined.bundle" | sed -n '/^engines/,$p'
echo "--- classify (default engine choice):"
python3 -m trtmc classify "$out/combined.bundle" --image examples/images/chelsea.png --top-k 2
echo "--- classify --engine tensorrt (must fail with the fix):"
python3 -m trtmc classify "$out/combined.bundle" --image examples/images/chelsea.png --engine tensorrt; echo "exit code $?"

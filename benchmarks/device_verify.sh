#!/usr/bin/env bash
# The whole GPU verification in one device call (see ../shared/device/README.md):
#   source .device/env.sh && bash benchmarks/device_verify.sh
set -o pipefail
OUT=${OUT:-/tmp/minidl-verify}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest tests/gpu -q 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "FAILED|passed|failed" | head -12
/usr/bin/time -f "wall %e s" python3 -m minidl.train --model lenet --epochs 1 2>&1 | tee "$OUT/lenet.log" | grep -vE "^loading|^step"
/usr/bin/time -f "wall %e s" python3 -m minidl.train -b32 -n500 -m100 -r50 2>&1 | tee "$OUT/r50.log" | grep -v "^loading"
timeout 300 python3 -m minidl.bench train --json "$OUT/bench-train.json" 2>&1 | tee "$OUT/bench-train.log" | tail -13
timeout 200 python3 -m minidl.bench infer --json "$OUT/bench-infer.json" 2>&1 | tee "$OUT/bench-infer.log" | tail -14

#!/usr/bin/env bash
# The whole GPU verification in one device call, from the repository root:
#   bash benchmarks/device_verify.sh          (logs and JSON in $OUT, default /tmp/minidl-verify)
# Stops at once when nvidia-smi fails: without a GPU nothing below means anything.
set -o pipefail
OUT=${OUT:-/tmp/minidl-verify}; mkdir -p "$OUT"
if ! nvidia-smi --query-gpu=name --format=csv,noheader; then
    echo "device_verify: nvidia-smi failed: no usable GPU here" >&2
    exit 2
fi
python3 -m pytest tests/gpu -q 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "FAILED|passed|failed" | head -12
/usr/bin/time -f "wall %e s" python3 -m minidl.train --model lenet --epochs 1 2>&1 | tee "$OUT/lenet.log" | grep -vE "^loading|^step"
/usr/bin/time -f "wall %e s" python3 -m minidl.train -b32 -n500 -m100 -r50 2>&1 | tee "$OUT/r50.log" | grep -v "^loading"
timeout 300 python3 benchmarks/bench.py train --json "$OUT/bench-train.json" 2>&1 | tee "$OUT/bench-train.log" | tail -14
timeout 200 python3 benchmarks/bench.py infer --json "$OUT/bench-infer.json" 2>&1 | tee "$OUT/bench-infer.log" | tail -15

#!/usr/bin/env bash
# Candidate recipes for the GPU rows, each as flags added to the bare command, under several seeds:
# the evidence the defaults in minidl/cli/recipes.py are chosen from (docs/results.md, The default recipes: targets and evidence).
#   bash benchmarks/recipe_sweep.sh                (logs in $OUT, default /tmp/minidl-sweep)
#   SEEDS="0 1 2" ONLY=r50 bash benchmarks/recipe_sweep.sh     (ONLY: r50, r18 or fashion)
# Prints one table row per command and candidate: the accuracy of each seed, their mean and minimum.
set -o pipefail
OUT=${OUT:-/tmp/minidl-sweep}; mkdir -p "$OUT"
SEEDS=${SEEDS:-0 1}
if ! nvidia-smi --query-gpu=name --format=csv,noheader; then
    echo "recipe_sweep: nvidia-smi failed: no usable GPU here" >&2
    exit 2
fi
# name | target | command flags | candidate flags ("" is the recipe as it stands)
RUNS=(
    "r50|97.5|-b32 -n500 -m100 -r50|"
    "r50|97.5|-b32 -n500 -m100 -r50|--lr 0.05 --warmup 50"
    "r50|97.5|-b32 -n500 -m100 -r50|--label-smoothing 0"
    "r50|97.5|-b32 -n500 -m100 -r50|--lr 0.035"
    "r50|97.5|-b32 -n500 -m100 -r50|--lr 0.02"
    "r18|99.6|--model resnet --epochs 5|"
    "r18|99.6|--model resnet --epochs 5|--lr 0.05 --warmup 50"
    "r18|99.6|--model resnet --epochs 5|--lr 0.05"
    "r18|99.6|--model resnet --epochs 5|--weight-decay 5e-4"
    "fashion|92.0|--dataset fashion-mnist --epochs 10|"
    "fashion|92.0|--dataset fashion-mnist --epochs 10|--label-smoothing 0 --shift 0 --warmup 0"
)
echo "| command | candidate flags | accuracy per seed ($SEEDS) | mean | min | target |" > "$OUT/sweep.md"
echo "|---|---|---|---|---|---|" >> "$OUT/sweep.md"
for run in "${RUNS[@]}"; do
    IFS='|' read -r name target flags cand <<< "$run"
    [ -n "$ONLY" ] && [ "$ONLY" != "$name" ] && continue
    accs=()
    for seed in $SEEDS; do
        log="$OUT/$(echo "$flags $cand --seed $seed" | tr ' /' '__').log"
        # shellcheck disable=SC2086
        python3 -m minidl.train $flags $cand --seed "$seed" --device cuda > "$log" 2>&1
        acc=$(grep -oE "^loss: [0-9.]+, accuracy: [0-9.]+%" "$log" | tail -1 | grep -oE "[0-9.]+%$" | tr -d %)
        accs+=("${acc:-ERR}")
    done
    stats=$(printf '%s\n' "${accs[@]}" | awk '$1 != "ERR" { s += $1; n++; if (n == 1 || $1 < m) m = $1 }
                                             END { if (n) printf "%.2f | %.2f", s / n, m; else printf "- | -" }')
    row="| \`$flags\` | \`${cand:-(the recipe)}\` | ${accs[*]} | $stats | $target |"
    echo "$row" | tee -a "$OUT/sweep.md"
done
echo "table: $OUT/sweep.md; logs: $OUT"

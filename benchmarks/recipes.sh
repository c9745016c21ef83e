#!/usr/bin/env bash
# The default recipes against their targets (docs/results.md, The default recipes: targets and evidence), from the repository root:
#   bash benchmarks/recipes.sh             (logs in $OUT, default /tmp/minidl-recipes; $MINIDL_DATA as set)
#   SEEDS="0 1 2" bash benchmarks/recipes.sh       (each command under several seeds: the margin)
# Every command is the bare recipe (no flags beyond the command); all run on the GPU except the
# one measured on the CPU. A last row runs that CPU command on the GPU too: the defaults must hold there.
set -o pipefail
OUT=${OUT:-/tmp/minidl-recipes}; mkdir -p "$OUT"
SEEDS=${SEEDS:-0}
if ! nvidia-smi --query-gpu=name --format=csv,noheader; then
    echo "recipes: nvidia-smi failed: no usable GPU here" >&2
    exit 2
fi
# target | device | flags (after python -m minidl.train)
RUNS=(
    "97.5|cuda|-b32 -n500 -m100 -r50"
    "95.5|cpu|-n300"
    "99.3|cuda|--epochs 10"
    "92.0|cuda|--dataset fashion-mnist --epochs 10"
    "99.6|cuda|--model resnet --epochs 5"
    "95.5|cuda|-n300"
)
rows=()
fails=0
for run in "${RUNS[@]}"; do
    IFS='|' read -r target device flags <<< "$run"
    for seed in $SEEDS; do
        extra=""; [ "$seed" != 0 ] && extra=" --seed $seed"       # seed 0 is the recipe's own
        log="$OUT/$(echo "$device $flags$extra" | tr ' /' '__').log"
        start=$(date +%s)
        # shellcheck disable=SC2086
        python3 -m minidl.train $flags --device "$device"$extra > "$log" 2>&1
        rc=$?
        secs=$(( $(date +%s) - start ))
        acc=$(grep -oE "^loss: [0-9.]+, accuracy: [0-9.]+%" "$log" | tail -1 | grep -oE "[0-9.]+%$" | tr -d %)
        recipe=$(grep -m1 "^recipe: " "$log")
        if [ $rc -ne 0 ] || [ -z "$acc" ]; then
            verdict="ERROR (exit $rc, $log)"; fails=$((fails + 1))
        elif awk -v a="$acc" -v t="$target" 'BEGIN { exit !(a >= t) }'; then
            verdict="ok (+$(awk -v a="$acc" -v t="$target" 'BEGIN { printf "%.2f", a - t }'))"
        else
            verdict="BELOW"; fails=$((fails + 1))
        fi
        rows+=("| \`python -m minidl.train $flags$extra\` | $device | >= $target% | ${acc:-?}% | $verdict | ${secs} s |")
        echo "$recipe" >> "$OUT/recipes.txt"
    done
done
echo
echo "| command | device | target | test accuracy | verdict | wall |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}" | tee "$OUT/table.md"
echo
echo "recipes printed by the runs: $OUT/recipes.txt; logs: $OUT"
exit $(( fails > 0 ))

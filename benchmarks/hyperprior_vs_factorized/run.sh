#!/usr/bin/env bash
# One segment of the hyperprior-vs-factorized comparison on the GPU machine: every run
# not yet at STEPS trains (resuming its checkpoint) for at most SEGMENT seconds, all
# at once on the one GPU; runs that reach STEPS are evaluated on the held-out photos
# from real files (gdnflow eval) and compared (compare.py). Run it again until it
# prints "all runs done".
#   PHOTOS=.gpu/photos RUNS=/tmp/hvf STEPS=20000 SEGMENT=540 \
#       bash benchmarks/hyperprior_vs_factorized/run.sh
set -uo pipefail
shopt -s nullglob
PHOTOS=${PHOTOS:-.gpu/photos} RUNS=${RUNS:-/tmp/hvf} STEPS=${STEPS:-20000}
SEGMENT=${SEGMENT:-540} LAMBDAS=${LAMBDAS:-"0.0035 0.0130 0.0483"} OUT=${OUT:-$RUNS}
# The model and batch (smaller ones for a quick try on the CPU).
SHAPE=${SHAPE:-"--N 128 --M 192 --batch-size 16 --crop 256"}
here=$(dirname "$0")
mkdir -p "$RUNS" "$OUT"
step_of() {   # the step of a run's checkpoint, 0 without one
  python3 -c "import sys; from gdnflow.io.checkpoint import read_checkpoint_info as r; \
print(r(sys.argv[1])['extra']['step'])" "$1/checkpoint.h5" 2>/dev/null || echo 0
}
for model in factorized_prior hyperprior; do
  for lmbda in $LAMBDAS; do
    run="$RUNS/${model%_prior}_$lmbda"
    [ "$(step_of "$run")" -ge "$STEPS" ] && continue
    resume=""; [ -f "$run/checkpoint.h5" ] && resume="--resume"
    timeout -s TERM "$SEGMENT" python3 -m gdnflow.cli train --model "$model" --lambda "$lmbda" \
      $SHAPE --steps "$STEPS" --precision tf32 \
      --data "$PHOTOS/train" --eval-data "$PHOTOS/heldout" --eval-images 5 \
      --eval-every 5000 --checkpoint-every 1000 --quiet --out "$run" $resume \
      > "$run.log" 2>&1 &
  done
done
wait
runs=("$RUNS"/factorized_*/ "$RUNS"/hyperprior_*/)
for run in "${runs[@]}"; do echo "$(basename "$run"): step $(step_of "$run")"; done
for run in "${runs[@]}"; do
  [ "$(step_of "$run")" -lt "$STEPS" ] && { echo "runs continue"; exit 0; }
done
mkdir -p "$RUNS/checkpoints"
for run in "${runs[@]}"; do
  name=$(basename "$run"); cp "$run/checkpoint.h5" "$RUNS/checkpoints/$name.h5"
done
python3 -m gdnflow.cli eval --checkpoint "$RUNS"/checkpoints/*.h5 --data "$PHOTOS/heldout" \
  --out "$OUT/eval" --force > "$OUT/eval.log" 2>&1 || { tail -5 "$OUT/eval.log"; exit 1; }
python3 "$here/compare.py" "$OUT/eval/eval.json" --out "$OUT/compare.md"
echo "all runs done"

#!/usr/bin/env bash
# Train the codec checkpoints and evaluate them against JPEG.
#
#   bash checkpoints/train_codec_checkpoints.sh [DEST]     (pip install '.[cuda,data]' first)
#
# Trains the default FactorizedPrior(N=128, M=192) with `gdnflow train` on
# random 256x256 crops of eleven of scikit-image's sample images, one model
# per lambda (CompressAI's qualities 1, 2 and 3), all at once on the one GPU
# (each alone leaves it partly idle), then runs `gdnflow eval` on the two
# held-out photos (coffee, chelsea) and, for reference only, on the training
# images. A demonstration on thirteen images, not a benchmark. About 8
# minutes on an H200 with TRAIN_SECONDS=370: training is capped at TRAIN_SECONDS wall-clock (an
# interrupted run saves the checkpoint of its last step; the log says so).
#
# Writes to DEST (default: checkpoints/), 8 files, at most one folder down:
#   codec_q1.h5 codec_q2.h5 codec_q3.h5   weights only (no optimiser state), ~12 MiB each
#   results/train.log                the trainings, the export, both evaluations
#   results/eval.md results/eval.json results/rd.png    held-out images
#   results/eval_train.md            the training images (seen in training)
#
# Settings (environment): IMAGES (folder holding the photos, default
# scikit-image's data folder), TRAIN_IMAGES, HELDOUT, STEPS, BATCH, CROP, N, M, LR, WARMUP,
# LAMBDAS ("q1:0.0018 q2:0.0035 q3:0.0067"), TRAIN_SECONDS, DEVICE (cuda),
# PYTHON (python3), SCRATCH.
set -uo pipefail

DEST=${1:-checkpoints}
PYTHON=${PYTHON:-python3}
IMAGES=${IMAGES:-$("$PYTHON" -c 'import os, skimage; print(os.path.join(os.path.dirname(skimage.__file__), "data"))')}
# Gray ones (brick, camera, grass, gravel) are read as RGB with equal channels.
TRAIN_IMAGES=${TRAIN_IMAGES:-"astronaut.png rocket.jpg motorcycle_left.png motorcycle_right.png
  hubble_deep_field.jpg retina.jpg ihc.png brick.png camera.png grass.png gravel.png"}
HELDOUT=${HELDOUT:-"coffee.png chelsea.png"}
STEPS=${STEPS:-14000}
BATCH=${BATCH:-8}
CROP=${CROP:-256}
N=${N:-128}
M=${M:-192}
LR=${LR:-3e-4}
WARMUP=${WARMUP:-500}
LAMBDAS=${LAMBDAS:-"q1:0.0018 q2:0.0035 q3:0.0067"}
TRAIN_SECONDS=${TRAIN_SECONDS:-350}
DEVICE=${DEVICE:-cuda}
SCRATCH=${SCRATCH:-/tmp/gdnflow_codec_run}
export PYTHONUNBUFFERED=1

mkdir -p "$DEST/results" || exit 1
LOG="$DEST/results/train.log"
: > "$LOG"
say() { echo "$@" | tee -a "$LOG"; }

rm -rf "$SCRATCH" && mkdir -p "$SCRATCH/train" "$SCRATCH/heldout" || exit 1
for name in $TRAIN_IMAGES; do cp "$IMAGES/$name" "$SCRATCH/train/" || exit 1; done
for name in $HELDOUT; do cp "$IMAGES/$name" "$SCRATCH/heldout/" || exit 1; done
say "gdnflow codec checkpoints: N=$N M=$M, $STEPS steps of $BATCH x ${CROP}x${CROP} crops, lr $LR" \
    "(cosine), lambdas $LAMBDAS; train: $TRAIN_IMAGES; held out: $HELDOUT; device $DEVICE"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$LOG"

# Warm-up: two steps (and the final evaluation) of the same configuration, so
# that every kernel module is compiled once into gdnflow's kernel cache
# before the runs start; side by side each run would compile them all again
# (docs/kernels.md). It also stops the script early if the GPU or the data
# are not usable.
say "== warm-up (compiles the kernels)"
"$PYTHON" -m gdnflow.cli train --data "$SCRATCH/train" --eval-data "$SCRATCH/heldout" \
  --eval-images 1 --N "$N" --M "$M" --steps 2 --batch-size "$BATCH" --crop "$CROP" \
  --eval-every 0 --workers 4 --device "$DEVICE" --quiet --out "$SCRATCH/warmup" >> "$LOG" 2>&1 \
  || { tail -20 "$LOG"; exit 1; }

# `gdnflow train` saves a checkpoint of its last finished step on Ctrl-C. A
# background job of a non-interactive shell ignores SIGINT, so the wrapper
# restores Python's handler: `timeout -s INT` then stops a run cleanly.
TRAIN='import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); from gdnflow.cli import main; sys.exit(main())'
pids=()
for entry in $LAMBDAS; do
  name=${entry%%:*}; lambda=${entry#*:}
  timeout -s INT -k 30 "$TRAIN_SECONDS" "$PYTHON" -c "$TRAIN" train \
    --data "$SCRATCH/train" --eval-data "$SCRATCH/heldout" --eval-images 1 \
    --N "$N" --M "$M" --lambda "$lambda" --steps "$STEPS" --batch-size "$BATCH" --crop "$CROP" \
    --lr "$LR" --lr-schedule cosine --warmup-steps "$WARMUP" --aux-lr 1e-2 \
    --eval-every 0 --checkpoint-every 2000 --workers 4 --device "$DEVICE" --quiet \
    --out "$SCRATCH/run_$name" > "$SCRATCH/train_$name.log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; status=$?
  entry=$(echo $LAMBDAS | cut -d' ' -f$((i + 1))); name=${entry%%:*}
  note=""
  [ $status -eq 124 ] && note=" (stopped at the ${TRAIN_SECONDS} s limit: the checkpoint is its last step)"
  say "== training $name: exit $status$note"
  cat "$SCRATCH/train_$name.log" >> "$LOG"
  tail -3 "$SCRATCH/train_$name.log"
done

# Export: weights only (the run's checkpoint also holds Adam's two moments).
checkpoints=()
for entry in $LAMBDAS; do
  name=${entry%%:*}
  [ -f "$SCRATCH/run_$name/checkpoint.h5" ] || { say "no checkpoint for $name"; continue; }
  "$PYTHON" - "$SCRATCH/run_$name/checkpoint.h5" "$DEST/codec_$name.h5" <<'EOF' 2>&1 | tee -a "$LOG"
import os, sys
from gdnflow.io.checkpoint import load_checkpoint, read_checkpoint_info, save_checkpoint
from gdnflow.models.factorized_prior import FactorizedPrior
source, target = sys.argv[1:3]
info = read_checkpoint_info(source)
model = FactorizedPrior(info["config"]["N"], info["config"]["M"], device="numpy")
load_checkpoint(source, model)
extra = {key: info["extra"][key] for key in ("step", "train_config") if key in info["extra"]}
save_checkpoint(target, model, extra=extra)
print(f"{target}: step {extra.get('step')}, {os.path.getsize(target) / 2**20:.2f} MiB")
EOF
  [ -f "$DEST/codec_$name.h5" ] && checkpoints+=("$DEST/codec_$name.h5")
done
[ ${#checkpoints[@]} -gt 0 ] || { say "no checkpoint to evaluate"; exit 1; }

say "== eval on the held-out image"
"$PYTHON" -m gdnflow.codec.cli eval --checkpoint "${checkpoints[@]}" --data "$SCRATCH/heldout" \
  --out "$SCRATCH/eval" --force --device "$DEVICE" 2>&1 | tee -a "$LOG"
cp "$SCRATCH/eval/eval.md" "$SCRATCH/eval/eval.json" "$SCRATCH/eval/rd.png" "$DEST/results/" \
  || exit 1
say "== eval on the training images (seen in training: not a measure of generalisation)"
"$PYTHON" -m gdnflow.codec.cli eval --checkpoint "${checkpoints[@]}" --data "$SCRATCH/train" \
  --out "$SCRATCH/eval_train" --force --device "$DEVICE" 2>&1 | tee -a "$LOG"
cp "$SCRATCH/eval_train/eval.md" "$DEST/results/eval_train.md" || exit 1
say "written: ${checkpoints[*]}, $DEST/results/ and $LOG"

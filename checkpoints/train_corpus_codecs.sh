#!/usr/bin/env bash
# Train the shipped codecs on the photo corpus, as a chain of segments that resume exactly.
#
#   bash checkpoints/train_corpus_codecs.sh pilot               compile the kernels, time the runs
#   STEPS=K bash checkpoints/train_corpus_codecs.sh segment SECONDS
#   bash checkpoints/train_corpus_codecs.sh export DEST         weights-only checkpoints into DEST
#                                                               (float16: exact decoding, see below)
#   bash checkpoints/train_corpus_codecs.sh split DEST          each run's whole state as parts
#   bash checkpoints/train_corpus_codecs.sh join SOURCE         rebuild the state from the parts
#
# The corpus comes from `python checkpoints/build_corpus.py corpus/ --packages debs/
# --download` (DATA=corpus/train, HELDOUT=corpus/heldout). RUNS lists the runs as
# NAME:MODEL:QUALITY (default: the factorized prior and the scale hyperprior at
# CompressAI's qualities 1-4, each quality's lambda, N=128, M=192); each run is one
# `gdnflow train` in STATE/NAME, on GPU (index mod GPUS), so with 4 GPUs every GPU
# trains one factorized prior and one hyperprior of the same quality side by side.
#
# - `pilot` trains every model kind for a few steps alone (so that each kernel is
#   compiled once into the shared kernel cache), then one factorized prior and one
#   hyperprior side by side on one GPU for PILOT_STEPS steps, as the segments will run
#   them, and prints their steps/s: choose STEPS from it.
# - `segment SECONDS` starts each run (the first time) or resumes it (`--resume`:
#   same step, optimiser state and random streams) and stops it after SECONDS with
#   SIGTERM, on which `gdnflow train` checkpoints its last finished step. Segments
#   chain: each continues where the last one stopped, on this machine's disk.
#   Every run of the chain must be given the same STEPS (the cosine schedule's length).
# - `split DEST` cuts each run's checkpoint (weights, both Adam moments, schedule,
#   random streams: 36 MiB for a factorized prior, 58 MiB for a hyperprior) into
#   parts of at most PART_BYTES (15 MiB), with their SHA-256 sums, so that the state
#   can leave a machine whose files travel at 16 MiB at most; `join SOURCE` checks
#   the sums and puts the checkpoints back into STATE on the next machine, after
#   which `segment` resumes them.
#
# Settings (environment): DATA, HELDOUT, RUNS, STEPS, GPUS (default: every GPU
# nvidia-smi lists), STATE (/tmp/gdnflow_corpus_runs), BATCH (16), CROP (256),
# LR (3e-4, cosine decay to 0 at STEPS after WARMUP=1000 steps), SCALE_RANGE ("0.25 1"),
# FLIP (both), PRECISION (tf32), WORKERS (data threads per run, 6), EVAL_EVERY (5000),
# PILOT_STEPS (300), PART_BYTES (15728640), STORAGE (the exported weights' dtype,
# float16), DEVICE (cuda), PYTHON (python3), EXTRA_ARGS (more `gdnflow train`
# arguments for every run, e.g. "--N 8 --M 8" for a quick try).
set -uo pipefail

DATA=${DATA:-corpus/train}
HELDOUT=${HELDOUT:-corpus/heldout}
RUNS=${RUNS:-"fp1:factorized_prior:1 fp2:factorized_prior:2 fp3:factorized_prior:3 fp4:factorized_prior:4
  hp1:hyperprior:1 hp2:hyperprior:2 hp3:hyperprior:3 hp4:hyperprior:4"}
STATE=${STATE:-/tmp/gdnflow_corpus_runs}
BATCH=${BATCH:-16}
CROP=${CROP:-256}
LR=${LR:-3e-4}
WARMUP=${WARMUP:-1000}
SCALE_RANGE=${SCALE_RANGE:-"0.25 1"}
FLIP=${FLIP:-both}
PRECISION=${PRECISION:-tf32}
WORKERS=${WORKERS:-6}
EVAL_EVERY=${EVAL_EVERY:-5000}
PILOT_STEPS=${PILOT_STEPS:-300}
PART_BYTES=${PART_BYTES:-15728640}
STORAGE=${STORAGE:-float16}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if [ -z "${GPUS:-}" ]; then
  GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
  [ "$GPUS" -ge 1 ] || GPUS=1
fi

# `gdnflow train`'s arguments shared by every run of the chain.
TRAIN=("$PYTHON" -m gdnflow.cli train --data "$DATA" --eval-data "$HELDOUT" --eval-images 4
  --batch-size "$BATCH" --crop "$CROP" --flip "$FLIP" --scale-range $SCALE_RANGE
  --lr "$LR" --lr-schedule cosine --warmup-steps "$WARMUP" --precision "$PRECISION"
  --workers "$WORKERS" --device "$DEVICE" --quiet ${EXTRA_ARGS:-})

# The runs as "index name model quality" lines.
runs() {
  local i=0 entry
  for entry in $RUNS; do
    IFS=: read -r name model quality <<< "$entry"
    echo "$i $name $model $quality"
    i=$((i + 1))
  done
}

pilot() {
  local model pids=() names=() name
  mkdir -p "$STATE/pilot" || return 1
  for model in $(runs | awk '{print $3}' | sort -u); do
    echo "== compiling: $model, 2 steps"
    CUDA_VISIBLE_DEVICES=0 "${TRAIN[@]}" --model "$model" --quality 3 --steps 2 --eval-every 0 \
      --checkpoint-every 0 --force --out "$STATE/pilot/compile_$model" \
      > "$STATE/pilot/compile_$model.log" 2>&1 || { tail -20 "$STATE/pilot/compile_$model.log"; return 1; }
  done
  for model in $(runs | awk '{print $3}' | sort -u); do
    name="side_by_side_$model"
    CUDA_VISIBLE_DEVICES=0 "${TRAIN[@]}" --model "$model" --quality 3 --steps "$PILOT_STEPS" --eval-every 0 \
      --checkpoint-every 0 --force --out "$STATE/pilot/$name" > "$STATE/pilot/$name.log" 2>&1 &
    pids+=($!); names+=("$name")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || echo "${names[$i]}: exit $?"
    echo "${names[$i]}: $(grep -o '[0-9.]* steps/s' "$STATE/pilot/${names[$i]}.log" 2>/dev/null \
      || tail -3 "$STATE/pilot/${names[$i]}.log")"
  done
}

segment() {
  local seconds=$1 index name model quality resume gpu pids=() names=() status
  [ -n "${STEPS:-}" ] || { echo "segment: set STEPS (the same for every segment of the chain)"; return 2; }
  mkdir -p "$STATE" || return 1
  while read -r index name model quality; do
    resume=()
    [ -f "$STATE/$name/checkpoint.h5" ] && resume=(--resume)
    gpu=$((index % GPUS))
    CUDA_VISIBLE_DEVICES=$gpu timeout -k 120 "$seconds" "${TRAIN[@]}" \
      --model "$model" --quality "$quality" --steps "$STEPS" --eval-every "$EVAL_EVERY" \
      --checkpoint-every 5000 --out "$STATE/$name" "${resume[@]}" \
      >> "$STATE/$name.log" 2>&1 &
    pids+=($!); names+=("$name")
    echo "$name: $model quality $quality on GPU $gpu${resume:+ (resumed)}"
  done < <(runs)
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; status=$?
    name=${names[$i]}
    # 124: stopped by timeout's SIGTERM, checkpointed; 143: the same seen from inside.
    echo "== $name: exit $status; $(grep -E 'step [0-9]+|steps/s|checkpoint' "$STATE/$name.log" | tail -1)"
  done
}

export_weights() {
  local dest=$1 index name model quality
  mkdir -p "$dest" || return 1
  while read -r index name model quality; do
    [ -f "$STATE/$name/checkpoint.h5" ] || { echo "$name: no checkpoint"; continue; }
    STORAGE=$STORAGE "$PYTHON" - "$STATE/$name/checkpoint.h5" "$dest/codec_$name.h5" <<'EOF' || return 1
import os, sys
from gdnflow.codec.codec import load_model
from gdnflow.io.checkpoint import read_checkpoint_info, save_checkpoint
source, target = sys.argv[1:3]
extra = read_checkpoint_info(source)["extra"]
extra = {key: extra[key] for key in ("step", "train_config") if key in extra}
save_checkpoint(target, load_model(source, device="numpy"), extra=extra, storage_dtype=os.environ["STORAGE"])
print(f"{target}: step {extra.get('step')}, {os.path.getsize(target) / 2**20:.2f} MiB")
EOF
  done < <(runs)
}

split_state() {
  local dest=$1 index name model quality
  while read -r index name model quality; do
    [ -f "$STATE/$name/checkpoint.h5" ] || { echo "$name: no checkpoint"; continue; }
    mkdir -p "$dest/$name" || return 1
    cp "$STATE/$name/"*.jsonl "$STATE/$name/"*.json "$dest/$name/" 2>/dev/null
    (cd "$dest/$name" && split -b "$PART_BYTES" -d "$STATE/$name/checkpoint.h5" checkpoint.h5.part \
      && sha256sum "$STATE/$name/checkpoint.h5" | sed "s#  .*#  checkpoint.h5#" > SHA256SUMS \
      && sha256sum checkpoint.h5.part* >> SHA256SUMS) || return 1
    echo "$name: $(ls "$dest/$name" | wc -l) files"
  done < <(runs)
}

join_state() {
  local source=$1 name
  for dir in "$source"/*/; do
    name=$(basename "$dir")
    mkdir -p "$STATE/$name" || return 1
    (cd "$dir" && grep part SHA256SUMS | sha256sum -c --quiet) || { echo "$name: a part is damaged"; return 1; }
    cat "$dir"/checkpoint.h5.part* > "$STATE/$name/checkpoint.h5.tmp" || return 1
    (cd "$STATE/$name" && grep -v part "$dir/SHA256SUMS" | sed 's#checkpoint.h5$#checkpoint.h5.tmp#' \
      | sha256sum -c --quiet) || { echo "$name: the joined checkpoint does not match"; return 1; }
    mv "$STATE/$name/checkpoint.h5.tmp" "$STATE/$name/checkpoint.h5"
    cp "$dir"/*.jsonl "$dir"/*.json "$STATE/$name/" 2>/dev/null
    echo "$name: joined"
  done
}

case "${1:-}" in
  pilot) pilot ;;
  segment) segment "${2:?segment SECONDS}" ;;
  export) export_weights "${2:?export DEST}" ;;
  split) split_state "${2:?split DEST}" ;;
  join) join_state "${2:?join SOURCE}" ;;
  *) sed -n '2,9p' "$0"; exit 2 ;;
esac

#!/usr/bin/env bash
# Train the shipped codecs on the photo corpus, as a chain of segments that resume exactly.
#
#   bash checkpoints/train_corpus_codecs.sh pilot               compile the kernels, time a run
#   STEPS=K bash checkpoints/train_corpus_codecs.sh segment SECONDS
#   bash checkpoints/train_corpus_codecs.sh export DEST         float16 weights into DEST
#   bash checkpoints/train_corpus_codecs.sh split DEST          each run's whole state as parts
#   bash checkpoints/train_corpus_codecs.sh join SOURCE         rebuild the state from the parts
#
# The corpus comes from `python checkpoints/build_corpus.py corpus/ --packages debs/
# --download` (DATA=corpus/train, HELDOUT=corpus/heldout). RUNS lists the runs as
# NAME:MODEL:QUALITY (default: the factorized prior and the scale hyperprior at
# CompressAI's qualities 1-4, each quality's lambda, N=128, M=192); each run is one
# `gdnflow train` in STATE/NAME, on GPU (its index in RUNS mod GPUS). Two runs on one
# GPU are slower than one after the other (checkpoints/README.md): on 4 GPUs, give
# RUNS four runs per call.
#
# - `pilot` trains each model kind of RUNS for two steps (so that every kernel is
#   compiled once into the shared kernel cache), then one run alone for PILOT_STEPS
#   steps, and prints its steps/s (start-up included): choose STEPS from it.
# - `segment SECONDS` starts each run (the first time) or resumes it (`--resume`:
#   same step, optimiser state and random streams) and stops it after SECONDS with
#   SIGTERM, on which `gdnflow train` checkpoints its last finished step. Segments
#   chain: each continues where the last one stopped. Every segment of a run must
#   be given the same STEPS (the cosine schedule's length): STATE/NAME.steps keeps it,
#   and another STEPS is refused. Exits 1 if a run failed (not stopped by SIGTERM).
#   With INIT_DIR set, a run's first segment starts from the weights of its shipped
#   file in INIT_DIR (`gdnflow train --init`: fine-tuning with fresh optimisers and a
#   schedule of STEPS more steps).
# - `export DEST` writes each run's weights as DEST/codec_qQ.h5 (factorized prior) or
#   DEST/hyperprior_qQ.h5, the shipped names, stored in float16 (the encoder and the
#   decoder both load the same float32 values from it, so decoding stays exact).
# - `split DEST` cuts each run's checkpoint (weights, both Adam moments, schedule,
#   random streams: 36 MiB for a factorized prior, 58 MiB for a hyperprior) into
#   parts of at most PART_BYTES (15 MiB) in DEST/NAME/, with their SHA-256 sums, so
#   that the state can leave a machine whose files travel at 16 MiB at most;
#   `join SOURCE` checks the sums and puts the checkpoints back into STATE on the
#   next machine, after which `segment` resumes them.
#
# Settings (environment): DATA, HELDOUT, RUNS, STEPS, GPUS (default: every GPU
# nvidia-smi lists), STATE (/tmp/gdnflow_corpus_runs), BATCH (16), CROP (256),
# LR (3e-4, cosine decay to 0 at STEPS after WARMUP=1000 steps), SCALE_RANGE ("0.25 1"),
# FLIP (both), PRECISION (tf32), WORKERS (data threads per run, 12), EVAL_EVERY (5000),
# PILOT_STEPS (300), PART_BYTES (15728640), DEVICE (cuda), PYTHON (python3), INIT_DIR,
# EXTRA_ARGS (more `gdnflow train` arguments for every run, e.g. "--N 8 --M 8").
# Needs bash 4.4 or later.
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
WORKERS=${WORKERS:-12}
EVAL_EVERY=${EVAL_EVERY:-5000}
PILOT_STEPS=${PILOT_STEPS:-300}
PART_BYTES=${PART_BYTES:-15728640}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

mkdir -p "$STATE" && STATE=$(cd "$STATE" && pwd) || exit 1
if [ -z "${GPUS:-}" ]; then
  GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
  [ "$GPUS" -ge 1 ] || GPUS=1
fi

# `gdnflow train`'s arguments shared by every run of the chain.
# shellcheck disable=SC2206  # SCALE_RANGE and EXTRA_ARGS are meant to split into words
TRAIN=("$PYTHON" -m gdnflow.cli train --data "$DATA" --eval-data "$HELDOUT" --eval-images 4
  --batch-size "$BATCH" --crop "$CROP" --flip "$FLIP" --scale-range $SCALE_RANGE
  --lr "$LR" --lr-schedule cosine --warmup-steps "$WARMUP" --precision "$PRECISION"
  --workers "$WORKERS" --device "$DEVICE" --quiet ${EXTRA_ARGS:-})

# The runs as "index name model quality" lines.
runs() {
  local i=0 entry name model quality
  for entry in $RUNS; do
    IFS=: read -r name model quality <<< "$entry"
    echo "$i $name $model $quality"
    i=$((i + 1))
  done
}

# The shipped file name of a model and quality: codec_qQ.h5 or hyperprior_qQ.h5.
shipped_name() { if [ "$1" = hyperprior ]; then echo "hyperprior_q$2.h5"; else echo "codec_q$2.h5"; fi; }

# The last line of a run's log (its result, or its error).
last_line() { tail -n 1 "$1" 2>/dev/null; }

pilot() {
  local model first log
  mkdir -p "$STATE/pilot" || return 1
  for model in $(runs | awk '{print $3}' | sort -u); do
    echo "== compiling: $model, 2 steps"
    log="$STATE/pilot/compile_$model.log"
    CUDA_VISIBLE_DEVICES=0 "${TRAIN[@]}" --model "$model" --quality 3 --steps 2 --warmup-steps 0 \
      --eval-every 0 --checkpoint-every 0 --force --out "$STATE/pilot/compile_$model" \
      > "$log" 2>&1 || { tail -20 "$log"; return 1; }
  done
  first=$(runs | awk 'NR == 1 {print $3}')
  log="$STATE/pilot/alone.log"
  CUDA_VISIBLE_DEVICES=0 "${TRAIN[@]}" --model "$first" --quality 3 --steps "$PILOT_STEPS" \
    --warmup-steps 0 --eval-every 0 --checkpoint-every 0 --force --out "$STATE/pilot/alone" \
    > "$log" 2>&1 || { tail -20 "$log"; return 1; }
  echo "$first alone: $(last_line "$log")"
}

segment() {
  local seconds=$1 index name model quality gpu saved status rc=0 pids=() names=() start note
  [ -n "${STEPS:-}" ] || { echo "segment: set STEPS (the same for every segment of a run)"; return 2; }
  while read -r index name model quality; do
    saved=$(cat "$STATE/$name.steps" 2>/dev/null)
    if [ -n "$saved" ] && [ "$saved" != "$STEPS" ]; then
      echo "$name: its segments ran with STEPS=$saved, not $STEPS (the schedule's length)"
      return 2
    fi
    echo "$STEPS" > "$STATE/$name.steps" || return 1
    start=() note=
    if [ -f "$STATE/$name/checkpoint.h5" ]; then
      start=(--resume) note=" (resumed)"
    elif [ -n "${INIT_DIR:-}" ]; then
      start=(--init "$INIT_DIR/$(shipped_name "$model" "$quality")")
      note=" (from ${start[1]})"
    fi
    gpu=$((index % GPUS))
    CUDA_VISIBLE_DEVICES=$gpu timeout -k 120 "$seconds" "${TRAIN[@]}" \
      --model "$model" --quality "$quality" --steps "$STEPS" --eval-every "$EVAL_EVERY" \
      --checkpoint-every 5000 --out "$STATE/$name" "${start[@]}" \
      >> "$STATE/$name.log" 2>&1 &
    pids+=($!); names+=("$name")
    echo "$name: $model quality $quality on GPU $gpu$note"
  done < <(runs)
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; status=$?
    name=${names[$i]}
    # 124: timeout's SIGTERM stopped the run, which checkpointed its last step.
    case $status in 0 | 124) ;; *) rc=1 ;; esac
    echo "== $name: exit $status; $(last_line "$STATE/$name.log")"
  done
  return $rc
}

export_weights() {
  local dest=$1 index name model quality count=0
  mkdir -p "$dest" || return 1
  while read -r index name model quality; do
    [ -f "$STATE/$name/checkpoint.h5" ] || { echo "$name: no checkpoint in $STATE/$name"; return 1; }
    "$PYTHON" - "$STATE/$name/checkpoint.h5" "$dest/$(shipped_name "$model" "$quality")" <<'EOF' || return 1
import os, sys
from gdnflow.codec.codec import load_model
from gdnflow.io.checkpoint import read_checkpoint_info, save_checkpoint
source, target = sys.argv[1:3]
extra = read_checkpoint_info(source)["extra"]
extra = {key: extra[key] for key in ("step", "train_config") if key in extra}
save_checkpoint(target, load_model(source, device="numpy"), extra=extra, storage_dtype="float16")
print(f"{target}: step {extra.get('step')}, {os.path.getsize(target) / 2**20:.2f} MiB")
EOF
    count=$((count + 1))
  done < <(runs)
  [ "$count" -gt 0 ] || { echo "export: RUNS names no run"; return 1; }
}

split_state() {
  local dest index name model quality
  mkdir -p "$1" && dest=$(cd "$1" && pwd) || return 1
  while read -r index name model quality; do
    [ -f "$STATE/$name/checkpoint.h5" ] || { echo "$name: no checkpoint in $STATE/$name"; return 1; }
    mkdir -p "$dest/$name" && rm -f "$dest/$name"/checkpoint.h5.part* || return 1
    cp "$STATE/$name/"*.jsonl "$dest/$name/" 2>/dev/null
    (cd "$dest/$name" && split -b "$PART_BYTES" -d "$STATE/$name/checkpoint.h5" checkpoint.h5.part \
      && { sha256sum < "$STATE/$name/checkpoint.h5" | sed 's#-$#checkpoint.h5#'
           sha256sum checkpoint.h5.part*; } > SHA256SUMS) || return 1
    echo "$name: $(ls "$dest/$name"/checkpoint.h5.part* | wc -l) parts"
  done < <(runs)
}

join_state() {
  local source dir name parts whole
  source=$(cd "$1" && pwd) || return 1
  ls "$source"/*/SHA256SUMS > /dev/null 2>&1 || { echo "join: no NAME/SHA256SUMS in $source"; return 1; }
  for dir in "$source"/*/; do
    dir=${dir%/}; name=$(basename "$dir")
    parts=$(awk '$2 ~ /\.part[0-9]+$/ {print $2}' "$dir/SHA256SUMS")
    whole=$(awk '$2 == "checkpoint.h5" {print $1}' "$dir/SHA256SUMS")
    (cd "$dir" && grep '\.part[0-9]*$' SHA256SUMS | sha256sum -c --quiet) \
      || { echo "$name: a part is damaged or missing"; return 1; }
    mkdir -p "$STATE/$name" || return 1
    (cd "$dir" && cat $parts) > "$STATE/$name/checkpoint.h5.tmp" || return 1
    if [ "$(sha256sum < "$STATE/$name/checkpoint.h5.tmp" | cut -d' ' -f1)" != "$whole" ]; then
      rm -f "$STATE/$name/checkpoint.h5.tmp"
      echo "$name: the joined checkpoint does not match its SHA-256"; return 1
    fi
    mv "$STATE/$name/checkpoint.h5.tmp" "$STATE/$name/checkpoint.h5" || return 1
    cp "$dir"/*.jsonl "$STATE/$name/" 2>/dev/null
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

#!/usr/bin/env bash
# One GPU-machine session: install PyCUDA from .gpu/, run the GPU tests, then
# the benchmarks named as arguments. Logs and tables go to $OUT.
#   bash benchmarks/gpu_session.sh bench_foundation [bench_gdn ...]
set -uo pipefail
source .gpu/env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -m gpu -q -x -p no:cacheprovider ${GPU_TESTS:-tests} 2>&1 | tee "$OUT/gpu-tests.log" | tail -40
for bench in "$@"; do
  python3 "benchmarks/$bench.py" --out "$OUT/$bench.md" 2>&1 | tee "$OUT/$bench.log" | tail -40
done

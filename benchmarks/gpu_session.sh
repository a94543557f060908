#!/usr/bin/env bash
# One GPU-machine session: install PyCUDA from .gpu/, run the GPU tests, then
# the benchmarks named as arguments. Logs and tables go to $OUT.
#   bash benchmarks/gpu_session.sh bench_foundation ["bench_conv --quick" ...]
# The 16-bit tests need nvmath-python, which ../shared/gpu/prepare.sh does not bring: put
# its Python 3.12 wheels into .gpu/ first (about 24 MB of the 64 MiB a run may carry):
#   pip download --no-deps --only-binary=:all: --python-version 312 --implementation cp \
#     --abi cp312 --platform manylinux_2_28_x86_64 -d .gpu nvmath-python cuda-bindings==13.0.3 \
#     cuda-core cuda-pathfinder
set -uo pipefail
source .gpu/env.sh || exit 1
# The example operator plugins, as the README's test command installs them here.
for plugin in examples/plugins/*/; do
  python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site "$plugin" \
    > /dev/null 2>&1 || echo "could not install $plugin"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -m gpu -q -p no:cacheprovider ${GPU_TESTS:-tests} 2>&1 | tee "$OUT/gpu-tests.log" \
  | grep -E "passed|failed|^FAILED|^ERROR" | tail -60
for bench in "$@"; do
  read -r name options <<< "$bench"
  timeout ${BENCH_TIMEOUT:-300} python3 "benchmarks/$name.py" --out "$OUT/$name.md" $options \
    > "$OUT/$name.log" 2>&1
  echo "== $name exit $?"; grep -v Warning "$OUT/$name.md" 2>/dev/null || tail -20 "$OUT/$name.log"
done

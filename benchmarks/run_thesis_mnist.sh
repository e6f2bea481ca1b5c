#!/usr/bin/env bash
# Full MNIST thesis reproduction, in priority order (each step skips runs already in the
# out file, so this script is resumable). Usage, from the repository root:
#   nohup bash benchmarks/run_thesis_mnist.sh > benchmarks/out/thesis_mnist.log 2>&1 &
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/out/thesis_mnist.jsonl}
COMMON=(--seeds 10 55 2077 --epochs 300 --out "$OUT")
# 1. FAACL on S2 and S1, all seeds
$PY benchmarks/thesis_mnist.py --scenarios S2 S1 --algorithms faacl "${COMMON[@]}"
# 2. FAACL on A1 and A2
$PY benchmarks/thesis_mnist.py --scenarios A1 A2 --algorithms faacl "${COMMON[@]}"
# 3. baselines with thesis figures, cheapest first
$PY benchmarks/thesis_mnist.py --scenarios S2 S1 A1 A2 --algorithms fedavg centralized ifca "${COMMON[@]}"
# 4. Local (no thesis figure)
$PY benchmarks/thesis_mnist.py --scenarios S2 S1 A1 A2 --algorithms local "${COMMON[@]}"
# the whole grid as one command (a no-op once everything above is done)
$PY benchmarks/thesis_mnist.py --scenarios S1 S2 A1 A2 --algorithms faacl fedavg ifca local centralized "${COMMON[@]}"
$PY benchmarks/thesis_mnist.py --summarize --scenarios S1 S2 A1 A2 --algorithms faacl fedavg ifca local centralized "${COMMON[@]}"

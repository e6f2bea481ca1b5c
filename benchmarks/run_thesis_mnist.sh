#!/usr/bin/env bash
# Full MNIST thesis grid (4 scenarios x 5 algorithms x 3 seeds, 300 rounds) as two
# concurrent single-thread workers sharing one resumable out file. Each command skips
# runs already in the file, so re-running this script resumes. From the repository root:
#   nohup bash benchmarks/run_thesis_mnist.sh > benchmarks/out/thesis_mnist.log 2>&1 &
# Why two 1-thread workers: on the 2-core machine torch's 2 threads run ~1.9x faster than
# 1 when the machine is idle, but collapse (3-5x slower) when another process takes a
# core; two 1-thread workers keep the same idle throughput and degrade gracefully.
set -uo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/out/thesis_mnist.jsonl}
LOGDIR=$(dirname "$OUT")
COMMON=(--epochs 300 --out "$OUT" --threads 1)
ALL_SEEDS=(10 55 2077)

faacl_chain() {
  # 1. FAACL on S2 and S1, all seeds; 2. FAACL on A1 and A2
  $PY benchmarks/thesis_mnist.py --scenarios S2 S1 --algorithms faacl --seeds "${ALL_SEEDS[@]}" "${COMMON[@]}"
  $PY benchmarks/thesis_mnist.py --scenarios A1 A2 --algorithms faacl --seeds "${ALL_SEEDS[@]}" "${COMMON[@]}"
}
baseline_chain() {
  # baselines with thesis figures, one seed everywhere first, cheapest first; then more seeds
  for seeds in "10" "55 2077"; do
    for algo in fedavg centralized ifca; do
      $PY benchmarks/thesis_mnist.py --scenarios S2 S1 A1 A2 --algorithms $algo --seeds $seeds "${COMMON[@]}"
    done
  done
  $PY benchmarks/thesis_mnist.py --scenarios S2 S1 A1 A2 --algorithms local --seeds "${ALL_SEEDS[@]}" "${COMMON[@]}"
}
faacl_chain > "$LOGDIR/worker_faacl.log" 2>&1 &
A=$!
baseline_chain > "$LOGDIR/worker_baselines.log" 2>&1 &
B=$!
wait $A $B
# the whole grid as one command (a no-op once both chains are done), then the table
$PY benchmarks/thesis_mnist.py --scenarios S1 S2 A1 A2 --algorithms faacl fedavg ifca local centralized \
    --seeds "${ALL_SEEDS[@]}" "${COMMON[@]}"
$PY benchmarks/thesis_mnist.py --summarize --scenarios S1 S2 A1 A2 \
    --algorithms faacl fedavg ifca local centralized --seeds "${ALL_SEEDS[@]}" --epochs 300 --out "$OUT"

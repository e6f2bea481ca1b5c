#!/usr/bin/env bash
# Issue 14 item 5 on one core: thesis Tables 3.3-3.6 (MNIST) for FeSEM, FedGroup and
# FedSoft (seed 10 in every cell first, then 55 and 2077), then FLACC Table I's IFCA
# k = 3 and 5 rows (seed 10, then 55 and 2077). One process at a time; every run is
# appended (thesis) or written (FLACC) as it ends and skipped when rerun, so rerunning
# this script resumes. From the repository root:
#   OMP_NUM_THREADS=1 nohup nice -n 10 bash benchmarks/run_thesis_baselines.sh \
#       > benchmarks/out/thesis_baselines.log 2>&1 &
set -uo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/out/thesis_mnist_baselines.jsonl}
THESIS=(--scenarios S1 S2 A1 A2 --algorithms fesem fedgroup fedsoft --epochs 300 --threads 1 --out "$OUT")
$PY benchmarks/thesis_mnist.py "${THESIS[@]}" --seeds 10
$PY benchmarks/thesis_mnist.py "${THESIS[@]}" --seeds 55 2077
for seeds in "10" "55 2077"; do
  $PY benchmarks/baselines_mnist.py --threads 1 --experiments flacc_rotated --methods ifca_k3 ifca_k5 --seeds $seeds
done
$PY benchmarks/thesis_mnist.py --summarize "${THESIS[@]}" --seeds 10 55 2077
$PY benchmarks/baselines_mnist.py --summarize --experiments flacc_rotated

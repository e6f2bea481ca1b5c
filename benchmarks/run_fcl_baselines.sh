#!/bin/bash
# Issue 15's continual baselines (FedWeIT, FedProx-APD, FedProx-SSGD) on MNIST beside
# FedAvg, RESULTS.md §12, in the order they were run: sequential S1/S2 first, then the
# multi-task S2/S1 and the A2 cells. One torch thread, nice 10; every run resumes from
# its per-timestep checkpoints. ROUNDS per timestep (the thesis: 100; CPU budget: 20).
#   bash benchmarks/run_fcl_baselines.sh [ROUNDS] [SEED...]
set -e
cd "$(dirname "$0")/.."
ROUNDS=${1:-20}; shift || true
SEEDS=${*:-10}
OUT=benchmarks/out/continual_fcl_r$ROUNDS
run() { OMP_NUM_THREADS=1 nice -n 10 ${PYTHON:-.venv/bin/python} benchmarks/thesis_continual_mnist.py --threads 1 \
          --epochs "$ROUNDS" --out "$OUT" --settings "$1" --scenarios "$2" --algorithms "$3" --seeds $SEEDS \
          --root "${ROOT:-../shared/datasets}"; }
for cell in "sequential S1" "sequential S2" "multitask S2" "multitask S1" "sequential A2" "multitask A2"; do
  for alg in fedavg fedprox_ssgd fedweit fedprox_apd; do run $cell $alg; done
done

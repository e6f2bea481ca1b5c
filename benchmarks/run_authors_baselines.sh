#!/usr/bin/env bash
# Issue 14's open line: FeSEM, FedGroup and FedSoft on thesis Tables 3.3-3.6's S1, A1
# and A2 under the authors' construction and full schedule (300 rounds x 10 local
# epochs; the FAACL-only options --init-epochs/--variant do not apply to them), seeds
# 10, 55, 2077. Two 1-thread lanes share one resumable out file (a finished run is
# skipped), seed 10 of every method first. From the repository root:
#   nohup nice -n 10 bash benchmarks/run_authors_baselines.sh > benchmarks/out/authors_baselines.log 2>&1 &
set -uo pipefail
export OMP_NUM_THREADS=1
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/out/authors_mnist_full.jsonl}
COMMON=(--construction authors --epochs 300 --local-epochs 10 --init-epochs 500 --variant hierarchical
        --threads 1 --progress --out "$OUT")

run() {  # algorithm seed scenario...
  local algo=$1 seed=$2; shift 2
  $PY benchmarks/thesis_mnist.py --algorithms "$algo" --seeds "$seed" --scenarios "$@" "${COMMON[@]}"
}
lane_fedsoft() {
  for seed in 10 55 2077; do run fedsoft $seed A2 A1 S1; done
}
lane_fesem_fedgroup() {
  run fesem 10 A2 A1 S1
  for seed in 55 2077; do run fedgroup $seed A2 A1 S1; run fesem $seed A2 A1 S1; done
}
lane_fedsoft > "${OUT%.jsonl}_fedsoft.log" 2>&1 &
lane_fesem_fedgroup > "${OUT%.jsonl}_fesem_fedgroup.log" 2>&1 &
wait

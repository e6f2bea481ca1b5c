#!/usr/bin/env bash
# Issue 14 item 5, the cells still missing after session 7, cheapest new rows first; every
# run is written as it ends and skipped when rerun, so rerunning resumes. From the
# repository root:
#   OMP_NUM_THREADS=1 nohup nice -n 12 bash benchmarks/run_baselines_s8.sh > benchmarks/out/baselines_s8.log 2>&1 &
set -uo pipefail
PY=${PY:-.venv/bin/python}
B=(benchmarks/baselines_mnist.py --threads 1)
THESIS=(benchmarks/thesis_mnist.py --scenarios S1 S2 A1 A2 --epochs 300 --threads 1 --out benchmarks/out/thesis_mnist_baselines.jsonl)
$PY "${B[@]}" --experiments flacc_rotated --methods ifca_k4 fedavg nofed --seeds 10 55 2077
$PY "${B[@]}" --experiments stocfl_shifted --methods ifca --seeds 10 55 2077
$PY "${B[@]}" --experiments stocfl_rotated --methods ifca_m2 ifca_m4 ifca_m6 --seeds 10
$PY "${B[@]}" --experiments fedclust_label_skew --seeds 10
$PY "${THESIS[@]}" --algorithms fesem --seeds 10 55 2077          # FeSEM's seeding changed in 6ded944
$PY "${THESIS[@]}" --algorithms fedgroup fedsoft --seeds 55 2077
$PY "${B[@]}" --experiments fedclust_label_skew --seeds 55 2077
$PY "${B[@]}" --experiments stocfl_rotated --seeds 55 2077

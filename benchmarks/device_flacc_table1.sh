#!/usr/bin/env bash
# FLACC Table I with FLACC's CNN (`--model paper`) on a lent GPU machine: the rows'
# other seeds (55, 2077) and Per-FedAvg / pFedMe with pFedMe's own eta (seeds 10, 55,
# 2077), one 1-thread process per (method, seed), at most $JOBS at once sharing the
# GPU, most important first; whatever has not finished after $LIMIT seconds is lost
# (baselines_mnist.py writes a run's JSON only when it ends). Results are tarred into
# $OUT (the device tool's return folder). Run from the repository root there, with
# the MNIST files carried in .mnist/ and pydantic's wheels in .whl/ (RESULTS.md §7).
set -uo pipefail
OUT=${OUT:-/tmp/out}; JOBS=${JOBS:-14}; LIMIT=${LIMIT:-500}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:src OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
mkdir -p ../shared/datasets && cp -r .mnist/MNIST ../shared/datasets/ || exit 1
jobs=()
for seed in 55 2077; do for m in cfl ifca_k4 fedavg nofed ifca_k3 ifca_k5 pfedme; do jobs+=("$m $seed"); done; done
for seed in 10 55 2077; do jobs+=("perfedavg $seed" "pfedme_paper $seed"); done
for seed in 55 2077; do for m in flhc_d0.5 flhc_d0.75 flhc_d1.0; do jobs+=("$m $seed"); done; done
if [ -n "${ONLY:-}" ]; then IFS=, read -ra jobs <<< "$ONLY"; fi  # e.g. ONLY="perfedavg 10,perfedavg 55"
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv -l 20 > "$OUT/smi.csv" 2>&1 &
mkdir -p "$OUT/logs"
printf '%s\n' "${jobs[@]}" | timeout "$LIMIT" xargs -P "$JOBS" -L 1 sh -c \
  'python3 benchmarks/baselines_mnist.py --experiments flacc_rotated --methods "$0" --seeds "$1" --device cuda \
     --model paper --threads 1 --out benchmarks/out/baselines_paper > "'"$OUT"'/logs/$0_$1.log" 2>&1'
echo "runner ended rc=$? at $(date +%T)"
tar -czf "$OUT/flacc_paper.tar.gz" benchmarks/out/baselines_paper/flacc_rotated
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
ls benchmarks/out/baselines_paper/flacc_rotated/*/

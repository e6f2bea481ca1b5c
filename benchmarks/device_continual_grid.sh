#!/usr/bin/env bash
# The continual grid of thesis Tables 4.1-4.4 under the authors' construction for the
# methods it had not run (FedDrift, FedProx-EWC), 20 rounds a timestep, on a lent
# machine's 16 CPU cores: one 1-thread CPU process per (setting, scenario, method,
# seed), all at once. The 784-128-10 MLP at batch 10 is bound by kernel launches on a
# GPU (RESULTS.md §8 "Session 16"), so the machine is used for its cores.
# Whatever has not finished after $LIMIT seconds keeps its last per-timestep
# checkpoint and resumes on any machine with the same command (same code: the
# checkpoint fingerprint holds the code digest). Older checkpoints are pruned so the
# tarball fits the tool's return limits; it is split into 15 MB parts in $OUT.
# Run from the repository root there, with the MNIST files carried in .mnist/ and
# pydantic's wheels in .whl/ (RESULTS.md §7, "Session 19"). SKIP_PIP=1 uses the Python
# on PATH as it is (to try the script here, with python3 resolving to the project venv).
set -uo pipefail
OUT=${OUT:-/tmp/out}; JOBS=${JOBS:-16}; LIMIT=${LIMIT:-540}; SEEDS=${SEEDS:-10}
RUNS=${RUNS:-benchmarks/out/authors_continual_s32_r20}
[ -n "${SKIP_PIP:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:src OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
jobs=()
for seed in $SEEDS; do for alg in feddrift fedprox_ewc; do for scen in A1 S1 S2 A2; do
  for setting in sequential multitask; do jobs+=("$setting $scen $alg $seed"); done
done; done; done
if [ -n "${ONLY:-}" ]; then IFS=, read -ra jobs <<< "$ONLY"; fi  # e.g. ONLY="sequential A1 feddrift 10"
mkdir -p "$OUT/logs"
echo "start $(date +%T), ${#jobs[@]} jobs, $(nproc) cores"
printf '%s\n' "${jobs[@]}" | timeout "$LIMIT" xargs -P "$JOBS" -L 1 sh -c '
  sparse="--set training.sparse_inputs=true"; [ "$1" = A1 ] && sparse=""   # A1 noise leaves no pixel constant
  python3 benchmarks/thesis_continual_mnist.py --construction authors --epochs 20 --threads 1 --device cpu \
    --root .mnist --out "'"$RUNS"'" --settings "$0" --scenarios "$1" --algorithms "$2" --seeds "$3" $sparse \
    > "'"$OUT"'/logs/$0_$1_$2_$3.log" 2>&1'
echo "runner ended rc=$? at $(date +%T)"
for ck in "$RUNS"/*/data/continual/*/seed_*/checkpoints; do   # keep each run's newest checkpoint
  ls -d "$ck"/t_* | sort | head -n -1 | xargs -r rm -rf
done
cp -r "$OUT/logs" "$RUNS/device_logs" && rm -rf "$OUT/logs"
tar -czf - "$RUNS" | split -b 15m - "$OUT/grid.tgz.part-"
ls -la "$OUT"; du -sh "$RUNS"

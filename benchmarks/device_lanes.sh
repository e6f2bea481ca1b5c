#!/usr/bin/env bash
# Continual cells of `thesis_continual_mnist.py` (authors' construction) on a lent GPU
# machine: one 1-thread process per line of $LANES, a CPU pool and a GPU pool running
# side by side (the 784-128-10 MLP at batch 10 is launch-bound on a GPU, RESULTS.md §8
# "Session 16", so plain methods use the machine's cores; the decomposed methods try
# the GPU). A lane line is `<cpu|cuda> <rounds a timestep> <runs dir> <setting>
# <scenario> <algorithm> <seed>`, most important first within each pool.
# After $LIMIT seconds whatever is unfinished keeps its newest per-timestep checkpoint,
# which resumes on any machine with the same lane (same code: the checkpoint
# fingerprint holds the code digest). Checkpoints over 16 MB (FedWeIT's, APD's) are
# dropped: they cannot come back. Results are tarred and split into 15 MB parts in $OUT.
# Run from the repository root there, with the MNIST files carried in .mnist/ and
# pydantic's wheels in .whl/ (RESULTS.md §7, "Session 19"); SKIP_PIP=1 uses the Python
# on PATH as it is (to try the script here); EXTRA adds arguments to every lane.
set -uo pipefail
OUT=${OUT:-/tmp/out}; LIMIT=${LIMIT:-480}; CPU_JOBS=${CPU_JOBS:-10}; GPU_JOBS=${GPU_JOBS:-4}
LANES=${LANES:?a file of lane lines}
[ -n "${SKIP_PIP:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:src OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs"
echo "start $(date +%T), $(grep -c . "$LANES") lanes, $(nproc) cores"
lane() {  # device rounds runs setting scenario algorithm seed
  local sparse="--set training.sparse_inputs=true"; [ "$5" = A1 ] && sparse=""  # A1 noise leaves no pixel constant
  python3 benchmarks/thesis_continual_mnist.py --construction authors --epochs "$2" --threads 1 --device "$1" \
    --root .mnist --out "$3" --settings "$4" --scenarios "$5" --algorithms "$6" --seeds "$7" $sparse ${EXTRA:-} \
    > "$OUT/logs/$1_r$2_$4_$5_$6_$7.log" 2>&1
  echo "lane ended rc=$? at $(date +%T): $*"
}
export -f lane; export OUT EXTRA
pool() { grep "^$1 " "$LANES" | timeout "$LIMIT" xargs -r -P "$2" -L 1 bash -c 'lane "$@"' _; }
pool cpu "$CPU_JOBS" & p1=$!; pool cuda "$GPU_JOBS" & p2=$!
( while sleep 60; do
    echo "--- $(date +%T) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)"
    for w in $(awk '{print $3}' "$LANES" | sort -u); do
      for f in "$w"/*/logs/wall_times.jsonl; do [ -f "$f" ] && echo "$f $(tail -n 1 "$f")"; done
    done
  done ) & mon=$!
wait $p1 $p2; kill $mon
echo "pools ended at $(date +%T)"
for w in $(awk '{print $3}' "$LANES" | sort -u); do
  for ck in "$w"/*/data/continual/*/seed_*/checkpoints; do   # keep each run's newest checkpoint
    ls -d "$ck"/t_* 2>/dev/null | sort | head -n -1 | xargs -r rm -rf
    [ "$(du -sm "$ck" | cut -f1)" -gt 16 ] && rm -rf "$ck"
  done
  find "$w" -name models.safetensors -size +16M -delete
done
tar -czf - $(awk '{print $3}' "$LANES" | sort -u) -C "$OUT" logs | split -b 15m - "$OUT/lanes.tgz.part-"
rm -rf "$OUT/logs"; ls -la "$OUT"

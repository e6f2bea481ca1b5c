#!/usr/bin/env bash
# FedCRef's paper-scale rows on MNIST (RESULTS.md §6.3), one process at a time, cheapest
# missing row first: every row gets a first run, then the perfect-association runs, then
# runs 1-4 of the other rows. Each call runs a snapshot of HEAD taken when it starts
# (src/ and benchmarks/), so editing the checkout meanwhile changes nothing under way;
# every run appends to benchmarks/out/fedcref/runs.jsonl and finished runs are skipped,
# so the script resumes where it stopped.
#   nohup bash benchmarks/run_fedcref_paper.sh > benchmarks/out/fedcref/log_paper.txt 2>&1 &
#   (or parts a and b in two processes: log_paper_a.txt / log_paper_b.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
run() {
  local commit snap
  commit=$(git rev-parse --short HEAD)
  snap=$(mktemp -d "/tmp/fedcref-$commit-XXXX")
  git archive HEAD src benchmarks | tar -x -C "$snap"
  nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH="$snap/src" .venv/bin/python "$snap/benchmarks/fedcref_mnist.py" \
    --out benchmarks/out/fedcref --commit "$commit" "$@"
  rm -rf "$snap"
}
rows() {  # the rows of run $1, in order of cost
  run --mode fedcref --dirtiness 0.0 0.3 0.5 --runs "$1"          # Tables 3/4
  run --mode dec_init --dirtiness 0.0 --runs "$1"                 # Table 1 (DEC replaces the dirty init)
  run --mode fedcref --dirtiness 0.3 --n-clients 20 --runs "$1"   # Tables 7-8
  run --mode global_dec --dirtiness 0.0 --runs "$1"               # Table 2
  run --mode fedcref --dirtiness 0.3 --n-clients 30 40 50 --runs "$1"
}
perfect_scaling() {  # Tables 7-8's last column: perfect associations at dirtiness 0.3
  run --mode perfect --dirtiness 0.3 --n-clients 20 30 40 50 --runs 0 1 2 3 4
}
# Two runners can share the machine on disjoint parts: `... run_fedcref_paper.sh a` and
# `... run_fedcref_paper.sh b` (each about half of what is left after session 7).
case "${1:-all}" in
  all)
    rows 0
    run --mode perfect --dirtiness 0.0 0.3 0.5 --runs 0 1 2 3 4   # Table 4, perfect associations
    for r in 1 2 3 4; do rows "$r"; done
    perfect_scaling ;;
  a) for r in 1 2 3; do rows "$r"; done ;;
  b) perfect_scaling; rows 4 ;;
  *) echo "usage: $0 [all|a|b]" >&2; exit 2 ;;
esac

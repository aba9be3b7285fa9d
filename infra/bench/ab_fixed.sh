#!/usr/bin/env bash
# The fixed cost of the job's code at a base revision against the head, alternating, in one
# sitting: `adattr bench --fixed-only` once per label, A = pipelines/ as at BASE, B = the head.
#
#   bash infra/bench/ab_fixed.sh BASE B A B A
#
# Run it alone (nothing else on the machine), from a clean working tree: it checks out BASE's
# pipelines/ for each A run and puts the head's back after it (and on any exit).
set -euo pipefail
cd "$(dirname "$0")/../.."
base="$1"; shift
if [ -n "$(git status --porcelain -- pipelines)" ]; then
  echo "ab_fixed: pipelines/ has changes; commit or stash them first" >&2; exit 2
fi
restore() { git reset -q -- pipelines/; git checkout -q HEAD -- pipelines/; git clean -qfd -- pipelines/; }
trap restore EXIT
for label in "$@"; do
  restore
  if [ "$label" = A ]; then git checkout -q "$base" -- pipelines/; fi
  echo "== $label ($( [ "$label" = A ] && echo "$base" || git rev-parse --short HEAD ))"
  .venv/bin/adattr bench --fixed-only 2>&1 | grep -E "results under|fixed cost, batch|sink phases"
done

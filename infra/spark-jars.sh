#!/usr/bin/env bash
# Prints the comma-separated list of fetched Spark jars, for `spark-submit --jars`.
set -euo pipefail
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/.jars/spark"
ls "$dir"/*.jar >/dev/null 2>&1 || { echo "no jars in $dir: run bash infra/setup.sh" >&2; exit 1; }
ls "$dir"/*.jar | paste -sd, -

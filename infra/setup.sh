#!/usr/bin/env bash
# One-time (and cheap to repeat) set-up: a virtual environment at .venv/ with the pinned Python
# packages, then the JVM jars from Maven Central. A repeat with nothing changed takes seconds.
# --no-archive leaves out the driver's class-data archive (`make test` makes it beside lint).
set -euo pipefail
archive=true
case "${1:-}" in
  "") ;;
  --no-archive) archive=false ;;
  *) echo "setup: unknown option ${1} (the only one is --no-archive)" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${ADATTR_PYTHON:-python3.11}"
command -v "$py" >/dev/null || py=python3
command -v java >/dev/null || { echo "setup: java (17+) is not on PATH; install a JDK (apt-get install openjdk-17-jdk-headless)" >&2; exit 1; }
command -v mvn >/dev/null || { echo "setup: mvn is not on PATH; install Maven (apt-get install maven)" >&2; exit 1; }

want="$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.adattr-stamp 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into .venv (first run only)..."
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]"
  echo "$want" > .venv/.adattr-stamp
else
  echo "setup: .venv up to date"
fi
bash infra/fetch-jars.sh .venv/bin/python
# adattr's own JVM classes (Hadoop's local file system through java.nio), into the Spark jars.
bash infra/jvm/build.sh .venv/bin/python
# The driver JVM's class-data archive (made once per JDK and jar set; see app/runtime/jvm_archive.py).
if $archive; then .venv/bin/python -m app.runtime.jvm_archive; fi

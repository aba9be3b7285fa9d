#!/usr/bin/env bash
# Zips app/, pipelines/ and schemas/ for `spark-submit --py-files` on a cluster, where executors
# do not have this checkout. Output: .adattr/dist/adattr.zip
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mkdir -p .adattr/dist
"${PYTHON:-.venv/bin/python}" - <<'PY'
import pathlib, zipfile
with zipfile.ZipFile(".adattr/dist/adattr.zip", "w", zipfile.ZIP_DEFLATED) as z:
    for package in ("app", "pipelines", "schemas"):
        for path in sorted(pathlib.Path(package).rglob("*")):
            if path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
                z.write(path, path.as_posix())
PY
echo ".adattr/dist/adattr.zip"

#!/usr/bin/env bash
# Builds adattr's own JVM classes (infra/jvm/src: Hadoop's local file system through java.nio,
# app/runtime/spark.py) into infra/.jars/spark/adattr-hadoop-local.jar, against the Hadoop API
# pyspark ships. A stamp (hash of the sources and that jar's name) makes a repeat a no-op.
# Usage: infra/jvm/build.sh [path/to/python]   (the venv's python by default)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:-$here/../../.venv/bin/python}"
out="$here/../.jars/spark"
jar="$out/adattr-hadoop-local.jar"
command -v javac >/dev/null || { echo "jvm: javac (JDK 17+) is not on PATH; install a JDK (apt-get install openjdk-17-jdk-headless)" >&2; exit 1; }
[ -d "$out" ] || { echo "jvm: $out is missing: run infra/fetch-jars.sh first" >&2; exit 1; }

pyspark_jars="$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
hadoop_api="$(ls "$pyspark_jars"/hadoop-client-api-*.jar)"
sources="$(find "$here/src" -name '*.java' | sort)"
# shellcheck disable=SC2086
stamp_want="$(cat $sources | sha256sum | cut -c1-16)-$(basename "$hadoop_api")"
if [ -f "$jar" ] && [ "$(cat "$jar.stamp" 2>/dev/null)" = "$stamp_want" ]; then
  echo "jvm: $(basename "$jar") up to date"
  exit 0
fi
classes="$(mktemp -d)"
trap 'rm -rf "$classes"' EXIT
# shellcheck disable=SC2086
javac -nowarn --release 17 -d "$classes" -cp "$hadoop_api" $sources
jar cf "$jar.tmp" -C "$classes" .
mv "$jar.tmp" "$jar"
echo "$stamp_want" > "$jar.stamp"
echo "jvm: built $(basename "$jar")"

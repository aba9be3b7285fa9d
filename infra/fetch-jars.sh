#!/usr/bin/env bash
# Resolves the JVM pieces from Maven Central into ignored folders:
#   infra/.jars/spark  - the Spark Kafka connector and Delta, minus what pyspark already ships
#   infra/.jars/kafka  - a complete Apache Kafka broker (KRaft) with its Log4j2 binding
# A stamp (hash of the POMs and the pyspark version) makes a repeat run a no-op that needs no
# network. Usage: infra/fetch-jars.sh [path/to/python]   (the venv's python by default)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:-$here/../.venv/bin/python}"
out="$here/.jars"
mvn_settings="$here/maven/settings.xml"

pyspark_jars="$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
stamp_want="$(cat "$here/maven/spark/pom.xml" "$here/maven/kafka/pom.xml" "$mvn_settings" | sha256sum | cut -c1-16)-$(basename "$(ls "$pyspark_jars"/spark-core_*.jar)")"

resolve() {  # $1 = pom folder, $2 = output folder
  local tmp="$2.tmp"
  rm -rf "$tmp"
  mvn -q -B -s "$mvn_settings" -f "$here/maven/$1/pom.xml" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp"
  rm -rf "$2" && mv "$tmp" "$2"
}

if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp_want" ]; then
  echo "jars: up to date ($(ls "$out/spark" | wc -l) spark, $(ls "$out/kafka" | wc -l) kafka)"
  exit 0
fi
mkdir -p "$out"
echo "jars: resolving from Maven Central (first run only)..."
resolve spark "$out/spark"
resolve kafka "$out/kafka"

# Two copies of one library on Spark's classpath make class-loading a lottery: keep pyspark's
# own copy (Spark was built and tested against it) and drop ours.
shipped="$(ls "$pyspark_jars" | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9.]+)*\.jar$//' | sort -u)"
for jar in "$out/spark"/*.jar; do
  name="$(basename "$jar" | sed -E 's/-[0-9][^-]*(-[A-Za-z0-9.]+)*\.jar$//')"
  if grep -qxF "$name" <<<"$shipped"; then rm -f "$jar"; fi
done
echo "$stamp_want" > "$out/.stamp"
echo "jars: $(ls "$out/spark" | wc -l) for spark in $out/spark, $(ls "$out/kafka" | wc -l) for the broker in $out/kafka"

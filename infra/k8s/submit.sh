#!/usr/bin/env bash
# Submits the attribution job to Spark on Kubernetes (README "Running on a real cluster"):
# cluster deploy mode (the driver is a pod), the image infra/k8s/Dockerfile builds, every
# ADATTR_* setting of an env file passed to the driver pod, the Kafka password and CA mounted
# from a Kubernetes secret (never on a command line), checkpoints on a shared volume; the
# secret and the volume are mounted in the executor pods too, at the same paths.
#
#   infra/k8s/submit.sh --master k8s://https://API:6443 --image REGISTRY/adattr:TAG \
#     --env-file my.env [--namespace adattr] [--executors 3] [--dry-run] [-- run]
#
# --dry-run prints the spark-submit command instead of running it.
set -euo pipefail

master="" image="" env_file="" namespace="adattr" executors=3 dry_run=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --master) master="$2"; shift 2 ;;
    --image) image="$2"; shift 2 ;;
    --env-file) env_file="$2"; shift 2 ;;
    --namespace) namespace="$2"; shift 2 ;;
    --executors) executors="$2"; shift 2 ;;
    --dry-run) dry_run=true; shift ;;
    --) shift; break ;;
    *) echo "submit.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[[ "$master" == k8s://* ]] || { echo "submit.sh: --master k8s://https://HOST:PORT is required" >&2; exit 2; }
[[ -n "$image" ]] || { echo "submit.sh: --image is required (infra/k8s/Dockerfile builds it)" >&2; exit 2; }
[[ -f "$env_file" ]] || { echo "submit.sh: --env-file names no file: '$env_file'" >&2; exit 2; }
command_args=("$@")
[[ ${#command_args[@]} -gt 0 ]] || command_args=(run)

args=(
  --master "$master" --deploy-mode cluster --name adattr-attribution
  --conf "spark.kubernetes.namespace=$namespace"
  --conf "spark.kubernetes.container.image=$image"
  --conf spark.kubernetes.authenticate.driver.serviceAccountName=adattr
  --conf "spark.executor.instances=$executors"
  --conf spark.executor.cores=2 --conf spark.executor.memory=4g --conf spark.driver.memory=4g
  # The driver's JVM in UTC: in another zone Delta reconstructs every new table version inside
  # its commit to verify the .crc (app/runtime/spark.py, UTC_JVM).
  --conf spark.driver.extraJavaOptions=-Duser.timezone=UTC
  # Only Python's own interpreter has adattr's dependencies (the image installs them there).
  --conf spark.pyspark.python=python3 --conf spark.pyspark.driver.python=python3
  # The Kafka password and CA: a secret mounted as files; the settings name the files. The
  # executors' Kafka readers open the CA file at the path the settings give.
  --conf spark.kubernetes.driver.secrets.adattr-kafka=/etc/adattr/kafka
  --conf spark.kubernetes.executor.secrets.adattr-kafka=/etc/adattr/kafka
  # Checkpoints, the run lock and the lease: a ReadWriteMany volume (NFS/EFS) every pod mounts
  # at the same path (executors write the state store's files and the carried state there).
  --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.shared.mount.path=/mnt/adattr-shared
  --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.shared.options.claimName=adattr-shared
  --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.shared.mount.path=/mnt/adattr-shared
  --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.shared.options.claimName=adattr-shared
  # Delta tables on S3 through s3a, credentials from the pods' web identity (IRSA).
  --conf spark.hadoop.fs.s3a.aws.credentials.provider=com.amazonaws.auth.WebIdentityTokenCredentialsProvider
)
while IFS= read -r line; do
  [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
  name="${line%%=*}"
  [[ "$name" == ADATTR_* ]] || { echo "submit.sh: $env_file: not an ADATTR_ setting: $name" >&2; exit 2; }
  [[ "$name" == ADATTR_KAFKA_SASL_PASSWORD ]] && {
    echo "submit.sh: $env_file sets the password itself; mount it and set ADATTR_KAFKA_SASL_PASSWORD_FILE" >&2
    exit 2
  }
  args+=(--conf "spark.kubernetes.driverEnv.$line")
done < "$env_file"
args+=(local:///opt/adattr/app/submit.py "${command_args[@]}")

if $dry_run; then
  printf '%q ' spark-submit "${args[@]}"
  echo
else
  exec spark-submit "${args[@]}"
fi

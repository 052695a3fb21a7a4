#!/bin/sh
# One-shot service `objectstore-init` of docker-compose.yml: creates the S3 bucket that the
# trainer publishes weights to, unless it exists. Runs in the SeaweedFS image (busybox sh and
# `weed`). Env: BUCKET (required), SEAWEED_MASTER (host:port, or
# host:port.grpc_port when gRPC is not on port + 10000; default objectstore:9333).
set -eu
# `weed shell` waits forever for an absent master: every call gets a deadline.
shell() { echo "$1" | timeout 10 weed shell -master="$master"; }
master="${SEAWEED_MASTER:-objectstore:9333}"
bucket="${BUCKET:?BUCKET must name the bucket to create}"

# The master can report healthy a moment before the filer behind `weed shell` accepts calls.
attempt=0
until buckets=$(shell "s3.bucket.list" 2>/dev/null); do
  attempt=$((attempt + 1))
  if [ "$attempt" -ge 15 ]; then
    echo "create-bucket: no SeaweedFS master at $master" >&2
    exit 1
  fi
  sleep 2
done
if echo "$buckets" | awk '{print $1}' | grep -qx "$bucket"; then
  echo "create-bucket: bucket $bucket exists"
  exit 0
fi
shell "s3.bucket.create -name $bucket"
shell "s3.bucket.list" | awk '{print $1}' | grep -qx "$bucket"
echo "create-bucket: created bucket $bucket"

#!/usr/bin/env bash
# Container entrypoint of the diloco image: picks the role from the first argument and execs the binary, so it runs
# as PID 1 and receives SIGTERM itself (the coordinator keeps its last checkpoint; a worker Leaves and exits 0).
#   coordinator [ARGS]   diloco-coordinator --config $DILOCO_CONFIG ARGS
#   worker [ARGS]        diloco-worker --config $DILOCO_CONFIG --coordinator $DILOCO_COORDINATOR --id ID ARGS
#                        ID = $DILOCO_WORKER_ID, else worker-$JOB_COMPLETION_INDEX (a Kubernetes Indexed Job)
#   launch|ctl|tokenize [ARGS]   diloco-launch / diloco-ctl / diloco-tokenize ARGS
#   anything else        exec'd as given (e.g. bash)
# Environment: DILOCO_CONFIG (default /etc/diloco/config.yaml), DILOCO_BIN (default /opt/diloco/bin).
set -euo pipefail
bin=${DILOCO_BIN:-/opt/diloco/bin}
config=${DILOCO_CONFIG:-/etc/diloco/config.yaml}
role=${1:-}
[ $# -gt 0 ] && shift

case "$role" in
  coordinator)
    exec "$bin/diloco-coordinator" --config "$config" "$@"
    ;;
  worker)
    : "${DILOCO_COORDINATOR:?set DILOCO_COORDINATOR=HOST:PORT (the coordinator service and its port)}"
    id=${DILOCO_WORKER_ID:-}
    if [ -z "$id" ] && [ -n "${JOB_COMPLETION_INDEX:-}" ]; then id="worker-$JOB_COMPLETION_INDEX"; fi
    if [ -z "$id" ]; then
      echo "entrypoint: set DILOCO_WORKER_ID (or run as a Kubernetes Indexed Job, which sets JOB_COMPLETION_INDEX)" >&2
      exit 2
    fi
    exec "$bin/diloco-worker" --config "$config" --coordinator "$DILOCO_COORDINATOR" --id "$id" "$@"
    ;;
  launch | ctl | tokenize)
    exec "$bin/diloco-$role" "$@"
    ;;
  "" | -h | --help)
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    exec "$role" "$@"
    ;;
esac

#!/usr/bin/env bash
# Runs a bertjax job on this machine: one process, or N processes joined by jax.distributed over
# 127.0.0.1 (the multi-host code path, tried on one machine).
#
#   launch/local.sh [--dry-run] [--processes=N] [--cpu-devices=K] [--port=P] [--python=PY] \
#       -- --config=configs/tiny.py --workdir=DIR [--config.KEY=VALUE ...]
#
# Everything after `--` goes to `python -m bertjax.main`.
#   --processes=N    N processes with JAX_COORDINATOR_ADDRESS=127.0.0.1:P, JAX_NUM_PROCESSES=N and
#                    JAX_PROCESS_ID=0..N-1; SIGTERM or Ctrl-C reaches all of them (they agree on a
#                    step, checkpoint it and exit 0). Exit status: the first failing process's.
#   --cpu-devices=K  K fake CPU devices per process (appended to XLA_FLAGS), to try meshes without
#                    an accelerator.
#   --dry-run        print the exact commands instead of running them.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/common.sh
source "$repo/launch/common.sh"

processes=1
cpu_devices=0
port=8476
python=$repo/.venv/bin/python
[[ -x $python ]] || python=python3

while (($#)); do
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --processes=*) processes=${1#*=} ;;
    --cpu-devices=*) cpu_devices=${1#*=} ;;
    --port=*) port=${1#*=} ;;
    --python=*) python=${1#*=} ;;
    --) shift; break ;;
    *) die "unknown option $1 (arguments for bertjax.main go after --)" ;;
  esac
  shift
done
[[ $processes =~ ^[1-9][0-9]*$ ]] || die "--processes must be a positive integer, got $processes"
[[ $cpu_devices =~ ^[0-9]+$ ]] || die "--cpu-devices must be an integer, got $cpu_devices"
[[ $port =~ ^[1-9][0-9]*$ ]] || die "--port must be a port number, got $port"
(($#)) || die "no job: pass --config=... --workdir=... after --"

job=("$python" -m bertjax.main "$@")
environment=()
if ((cpu_devices > 0)); then
  device_flag=--xla_force_host_platform_device_count=$cpu_devices
  environment+=("XLA_FLAGS=${XLA_FLAGS:+$XLA_FLAGS }$device_flag")
fi

if ((processes == 1)); then
  if ((${#environment[@]})); then
    run env "${environment[@]}" "${job[@]}"
  else
    run "${job[@]}"
  fi
  exit
fi

environment+=("JAX_COORDINATOR_ADDRESS=127.0.0.1:$port" "JAX_NUM_PROCESSES=$processes")
if [[ $DRY_RUN == 1 ]]; then
  for ((i = 0; i < processes; i++)); do
    printf '%s &\n' "$(quote_line env "${environment[@]}" "JAX_PROCESS_ID=$i" "${job[@]}")"
  done
  echo wait
  exit
fi

pids=()
for ((i = 0; i < processes; i++)); do
  env "${environment[@]}" "JAX_PROCESS_ID=$i" "${job[@]}" &
  pids+=("$!")
done
# The processes stop together at an agreed step, so forwarding the signal to each is enough.
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM INT
status=0
for pid in "${pids[@]}"; do
  while true; do
    code=0
    wait "$pid" || code=$?
    # A trapped signal interrupts `wait` (status > 128) while the process still runs.
    if ((code > 128)) && kill -0 "$pid" 2>/dev/null; then
      continue
    fi
    break
  done
  if ((status == 0 && code != 0)); then
    status=$code
  fi
done
exit "$status"

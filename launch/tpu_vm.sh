#!/usr/bin/env bash
# Runs a bertjax job on a Cloud TPU VM or pod slice with gcloud: create the TPU, copy this working
# tree to every worker, install it, run the job on all workers at once, delete the TPU.
#
#   launch/tpu_vm.sh [--dry-run] --name=NAME --zone=ZONE [--project=ID] [--type=v4-8]
#       [--version=tpu-ubuntu2204-base] [--steps=create,copy,setup,run,delete] \
#       [--skip-compile] [--python=PY] \
#       -- --config=configs/platform.py:tpu_v4_8 --workdir=DIR [--config.KEY=VALUE ...]
#
# Everything after `--` goes to `python3 -m bertjax.main` on every worker; each worker's JAX
# process joins the others through the TPU metadata (bertjax calls jax.distributed.initialize).
# On a pod slice (several workers, e.g. v4-32) DIR must be one every worker sees: a bucket
# (--workdir=gs://BUCKET/DIR, docs/cloud-storage.md) or a file system every worker mounts at the
# same path (NFS, Filestore): the job refuses a local workdir that is not shared.
#   --steps    a comma-separated subset, run in this order: create, copy (tar of this tree, scp to
#              every worker), setup (unpack, pip install), run, delete. With delete among them the
#              TPU is deleted even when an earlier step fails.
#   --dry-run  print the exact commands instead of running them.
#   --skip-compile  before create, the job's train step is compiled here for the TPU type
#              (`python -m bertjax.compile`, needs libtpu: pip install 'bertjax[tpu]'), so a config
#              that does not fit the chips is refused before a TPU bills; this skips that.
#   --python   the local interpreter for that compile (default: the repo's .venv, else python3).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/common.sh
source "$repo/launch/common.sh"

name=""
zone=""
project=""
accelerator="v4-8"
version="tpu-ubuntu2204-base"
steps=create,copy,setup,run,delete
compile=1
python=$repo/.venv/bin/python
[[ -x $python ]] || python=python3

while (($#)); do
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --name=*) name=${1#*=} ;;
    --zone=*) zone=${1#*=} ;;
    --project=*) project=${1#*=} ;;
    --type=*) accelerator=${1#*=} ;;
    --version=*) version=${1#*=} ;;
    --steps=*) steps=${1#*=} ;;
    --skip-compile) compile=0 ;;
    --python=*) python=${1#*=} ;;
    --) shift; break ;;
    *) die "unknown option $1 (arguments for bertjax.main go after --)" ;;
  esac
  shift
done
[[ -n $name ]] || die "--name is required (the TPU VM's name)"
[[ -n $zone ]] || die "--zone is required, e.g. --zone=us-central2-b"
for step in ${steps//,/ }; do
  case $step in
    create | copy | setup | run | delete) ;;
    *) die "unknown step $step in --steps (create, copy, setup, run, delete)" ;;
  esac
done
wants() { [[ ",$steps," == *",$1,"* ]]; }
if wants run && ((!$#)); then
  die "no job: pass --config=... --workdir=... after --"
fi

tpu=(gcloud compute tpus tpu-vm)
where=("--zone=$zone")
[[ -z $project ]] || where+=("--project=$project")
archive=/tmp/bertjax-$name.tar.gz
remote_dir=bertjax

# Remote command lines are single strings: quote each word for the worker's shell.
remote_setup="rm -rf $remote_dir && mkdir -p $remote_dir && tar -xzf bertjax.tar.gz -C $remote_dir"
remote_setup+=" && python3 -m pip install -q -e ./$remote_dir 'jax[tpu]>=0.10,<0.11'"
remote_run="cd $remote_dir && $(quote_line python3 -m bertjax.main "$@")"

if wants delete; then
  # Delete even when a step fails: an idle TPU still bills.
  trap 'run "${tpu[@]}" delete "$name" "${where[@]}" --quiet' EXIT
fi
# The pre-flight: the job's config (its --config flags only) compiled for this TPU type.
config_args=()
for arg in "$@"; do
  [[ $arg != --config=* && $arg != --config.* ]] || config_args+=("$arg")
done
if wants create && ((compile)) && ((${#config_args[@]})); then
  run "$python" -m bertjax.compile "--topology=$accelerator" "${config_args[@]}" ||
    die "the job does not compile for $accelerator (above); fix it or pass --skip-compile"
fi
if wants create; then
  run "${tpu[@]}" create "$name" "${where[@]}" "--accelerator-type=$accelerator" \
    "--version=$version"
fi
if wants copy; then
  run tar -czf "$archive" --exclude=./.venv --exclude=./.cache --exclude=./.git \
    --exclude=./workdir -C "$repo" .
  run "${tpu[@]}" scp "$archive" "$name:bertjax.tar.gz" "${where[@]}" --worker=all
fi
if wants setup; then
  run "${tpu[@]}" ssh "$name" "${where[@]}" --worker=all "--command=$remote_setup"
fi
if wants run; then
  run "${tpu[@]}" ssh "$name" "${where[@]}" --worker=all "--command=$remote_run"
fi

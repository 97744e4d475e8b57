#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py) on an offline H200 host lent through the device tool, in two steps:
#
#   bash bench/gpu_device_run.sh prepare        # here, once: builds .whl/ and prints the device call to make
#   bash bench/gpu_device_run.sh run [ARG...]   # there: the device call's whole command
#
# The host has Python 3.12 and torch 2.11 with CUDA, but no package registry, and takes at most 64 MiB along (the
# checkout and the carried .whl/). What the engine needs beyond the host's packages is pydantic and its parts (the
# run config), hjson (DeepSpeed's config reader) and DeepSpeed itself (pure Python: its fused Adam is compiled
# there); no Ray, no vLLM. Their versions are the lock's (requirements/lock-cpu.txt).
#
# `run` installs .whl/ into /tmp/site where the interpreter cannot import pydantic and deepspeed (the host), runs
# the check under a timeout with its JSON and its whole log under $OUT (what comes back from the host), the log
# through tee with pipefail so that the check's exit status is the command's, and says what it left there.
# ARGs go to gpu_check.py: `run --device cpu --tiny` is the CPU dry run tests/unit/test_benches.py makes of
# exactly this command. PYTHON picks the interpreter (python3).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=.whl
CARRY_LIMIT_MIB=64
# The check's own budget is 300 s (gpu_check.py --budget-s); this ends an interpreter that hangs past it.
CHECK_TIMEOUT_S="${GPU_CHECK_TIMEOUT_S:-330}"
# The device call's limit: a start (1-2 min) and a run of at most 6 min, twice over, fit the 15 minutes a task
# is lent, so a first run that fails can be run again at once.
DEVICE_TIMEOUT_S=360
WHEEL_PACKAGES=(pydantic pydantic_core annotated-types typing-inspection typing_extensions hjson)
HOST_PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)

pinned() {  # the lock's NAME==VERSION line for a package
  grep -iE "^$1==" requirements/lock-cpu.txt || { echo "error: $1 is not pinned in requirements/lock-cpu.txt" >&2; exit 1; }
}

prepare() {
  git check-ignore -q "$WHEELS/" || { echo "error: $WHEELS/ must be git-ignored to be carried" >&2; exit 1; }
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  local pins=() platforms=()
  for name in "${WHEEL_PACKAGES[@]}"; do pins+=("$(pinned "$name")"); done
  for platform in "${HOST_PLATFORMS[@]}"; do platforms+=(--platform "$platform"); done
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$WHEELS" "${pins[@]}"
  .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation "$(pinned deepspeed)" -w "$WHEELS"
  local size_kib
  size_kib="$(du -sk "$WHEELS" | cut -f1)"
  if ((size_kib > CARRY_LIMIT_MIB * 1024)); then
    echo "error: $WHEELS/ holds ${size_kib} KiB, over the ${CARRY_LIMIT_MIB} MiB a device call carries" >&2
    exit 1
  fi
  ls -1 "$WHEELS"
  echo "$WHEELS/: ${size_kib} KiB. The device call (its tool's run), from this checkout's root:"
  echo "  command: bash bench/gpu_device_run.sh run"
  echo "  carry: [\"$WHEELS\"]"
  echo "  timeout_s: $DEVICE_TIMEOUT_S"
}

run() {
  local python="${PYTHON:-python3}" out="${OUT:-$PWD/gpu-check-out}"
  mkdir -p "$out"
  if ! "$python" -c "import pydantic, deepspeed" 2>/dev/null; then
    [ -d "$WHEELS" ] || { echo "error: $python lacks pydantic or deepspeed and there is no $WHEELS/ (run 'prepare' first)" >&2; exit 1; }
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
  local status=0
  timeout --signal=TERM --kill-after=15 "$CHECK_TIMEOUT_S" "$python" bench/gpu_check.py --out "$out/gpu_check.json" "$@" \
    2>&1 | tee "$out/gpu_check.log" || status=$?
  echo "gpu_device_run: exit status $status; in $out: $(ls "$out" | tr '\n' ' ')"
  return "$status"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: bash bench/gpu_device_run.sh prepare | run [gpu_check.py ARG...]" >&2; exit 2 ;;
esac

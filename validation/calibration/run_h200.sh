#!/usr/bin/env bash
# The prepared GPU run of `simulate calibrate` (issue 8), sized for one H200 and ~5 minutes.
#
# Run from the repository root on the GPU machine (see README.md beside this file):
#   bash validation/calibration/run_h200.sh
# Writes into $OUT (./out/calibration when OUT is unset):
#   h200.yaml                 the measured overlay (load with --gpu PATH)
#   h200.measurements.json    raw timings of every case (the overlay and check derive from it)
#   check.txt / check.json    predicted (shipped and measured efficiencies) vs measured step times
#   run.log                   progress and the check table; env.txt: nvidia-smi and torch versions
# CALIBRATE_DEVICE=cpu runs the same script on a CPU at tiny sizes (a dry run of the script).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/calibration}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DEVICE=${CALIBRATE_DEVICE:-cuda}
BUDGET=${CALIBRATE_BUDGET_SECONDS:-200}

# PyTorch: the project pins torch==2.13.0 (the [calibrate] extra). The device image carries its
# own CUDA build of torch and no package registry can be reached there, so an importable torch
# is used as it is; its version is recorded in the overlay and the timings.
if ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install -q torch==2.13.0 || { echo "run_h200.sh: torch is missing and torch==2.13.0 cannot be installed" >&2; exit 3; }
fi
# The simulator's own dependencies: the device image lacks pydantic and simpy; fetch_wheels.sh
# (run beforehand, elsewhere) puts them in .whl/, which the device call carries.
if ! $PY -c "import pydantic, simpy, yaml, click, numpy" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 4
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    $PY -m pip install -q 'pydantic>=2.5' 'simpy>=4.0' 'click>=8.1' 'PyYAML>=6.0' 'numpy>=1.24' \
      || { echo "run_h200.sh: missing pydantic/simpy; run validation/calibration/fetch_wheels.sh and carry .whl" >&2; exit 4; }
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# The `simulate` console script is not installed there; this runs the same click entry point.
ENTRY='import sys; from simulator.cli import main; sys.exit(main(prog_name="simulate"))'
simulate() { $PY -c "$ENTRY" "$@"; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1
  $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"; } > "$OUT/env.txt"
cat "$OUT/env.txt"

args=(--out "$OUT/h200.yaml" --save-measurements "$OUT/h200.measurements.json" --budget-seconds "$BUDGET" --check)
if [ "$DEVICE" = cpu ]; then args+=(--device cpu --base h200); fi
timeout $((BUDGET + 120)) $PY -c "$ENTRY" calibrate "${args[@]}" 2>&1 | tee "$OUT/run.log"
status=${PIPESTATUS[0]}
if [ -f "$OUT/h200.measurements.json" ]; then
  simulate calibrate --check --measurements "$OUT/h200.measurements.json" --overlay "$OUT/h200.yaml" > "$OUT/check.txt"
  simulate calibrate --check --measurements "$OUT/h200.measurements.json" --overlay "$OUT/h200.yaml" --json > "$OUT/check.json"
  cat "$OUT/check.txt"
fi
exit "$status"

#!/usr/bin/env bash
# Run HERE (not on the device) before the device call: downloads, into .whl/ at the repo root,
# the wheels of the simulator's dependencies that the device image lacks (pydantic, simpy and
# their needs), for that machine's Python 3.12 on x86-64. run_h200.sh installs them there.
# .whl/ must be ignored by git and named in the device call's `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 \
  typing-extensions==4.15.0 simpy==4.1.2
ls -l .whl

#!/usr/bin/env bash
# CI: torchwatch as a user installs it as a tool. Builds the wheel and the sdist, installs the wheel
# with `uv tool install` and `pipx install` (both from PyPI, into a temporary tools venv) into fresh
# tool environments of their own (no torch there), and from each runs
#   torchwatch run --headless --duration 15 --json R -- $TRAINING_PYTHON demo/cpu_bound.py
# whose Python is another environment's (the CI venv, which has torch): the label must be cpu-bound
# and the hook, loaded into that other environment by path, must have counted steps.
#
#   TRAINING_PYTHON=python   the training's interpreter (default: the python on PATH, the CI venv's)
#   WHEEL_CHECK_DURATION=15  seconds each run watches the demo
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
training_python="$(command -v "${TRAINING_PYTHON:-python}")"
duration="${WHEEL_CHECK_DURATION:-15}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$training_python" -c 'import torch' || { echo "wheel_check: $training_python has no torch"; exit 1; }
python3 -m venv "$tmp/tools"
"$tmp/tools/bin/pip" install -q uv pipx build
"$tmp/tools/bin/python" -m build -q --wheel --sdist --outdir "$tmp/dist" . >/dev/null
wheel="$(ls "$tmp"/dist/torchwatch_live-*.whl)"
ls "$tmp"/dist/torchwatch_live-*.tar.gz >/dev/null
echo "wheel_check: built $(basename "$wheel") and its sdist"

# each tool in its own fresh environment, nothing of it outside $tmp; the tools' Python is the
# machine's python3 (uv would otherwise download one)
export UV_TOOL_DIR="$tmp/uv/tools" UV_TOOL_BIN_DIR="$tmp/uv/bin" UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR="$tmp/uv/cache"
"$tmp/tools/bin/uv" tool install -q --python "$(command -v python3)" "$wheel"
export PIPX_HOME="$tmp/pipx/home" PIPX_BIN_DIR="$tmp/pipx/bin"
"$tmp/tools/bin/pipx" install --quiet --python "$(command -v python3)" "$wheel" >/dev/null

check() {  # check NAME TORCHWATCH: run the demo under TORCHWATCH, the training in $training_python
    local name=$1 tw=$2 report="$tmp/$1.json"
    "$tw" run --headless --duration "$duration" --json "$report" -- \
        "$training_python" demo/cpu_bound.py --device cpu --seconds 120 >/dev/null 2>"$tmp/$name.err" || true
    python3 - "$name" "$report" "$tmp/$name.err" <<'EOF'
import json, sys
name, path, err = sys.argv[1:]
try:
    report = json.load(open(path))
except (OSError, ValueError) as exc:
    sys.exit(f"wheel_check: {name}: no report ({exc}); stderr: {open(err).read()[-1500:]}")
label, steps = report["verdict"]["label"], report["hook"].get("steps", 0)
print(f"wheel_check: {name}: torchwatch {report['torchwatch_version']}: {label}, hook steps {steps}, "
      f"hook {report['sources']['hook']['status']}")
if label != "cpu-bound" or not steps:
    sys.exit(f"wheel_check: {name}: expected cpu-bound with hook steps > 0; hook: {report['hook']}")
EOF
}
# the tool environments have no torch: the hook goes to the training by path
for tool in "$UV_TOOL_BIN_DIR/torchwatch" "$PIPX_BIN_DIR/torchwatch"; do
    "$(dirname "$(readlink -f "$tool")")/python" -c 'import torch' 2>/dev/null && { echo "wheel_check: torch in $tool's environment"; exit 1; }
done
check uv "$UV_TOOL_BIN_DIR/torchwatch"
check pipx "$PIPX_BIN_DIR/torchwatch"
echo "wheel_check: ok in $(($(date +%s) - started)) s"

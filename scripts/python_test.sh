#!/usr/bin/env bash
# Builds and tests the Python package: installs what it needs from PyPI (only what is missing,
# so it also runs offline where they are there, as on the GPU machine), builds the extension
# with `pip install --no-build-isolation .` (the build requirements were just installed; the
# kept build dir makes a rebuild incremental), runs the example, then pytest on python/tests
# (last, so its summary closes the output).
#
# CUDA: built when a GPU is visible (nvidia-smi) and nvcc is found; else CPU-only, which keeps
# the build light on a 2-core CI machine. Force with SMLA_PYTHON_CUDA=ON|OFF.
# Extra pytest arguments pass through: scripts/python_test.sh -k engine
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# A distribution's Python that refuses pip installs (PEP 668: Debian 12's) gets a virtual
# environment in build-python/venv that still sees the system's packages (torch on a GPU machine).
if "$PY" -c 'import sys, sysconfig, os
sys.exit(not (sys.prefix == sys.base_prefix and
              os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'; then
  [ -x build-python/venv/bin/python ] || "$PY" -m venv --system-site-packages build-python/venv
  PY=build-python/venv/bin/python
fi
# Which interpreter holds the package, for scripts run after this one (gpu_check.sh's host time).
# (its own path, not a shim on PATH that picks one at each call)
mkdir -p build-python && "$PY" -c 'import sys; print(sys.executable)' >build-python/interpreter
pip_install() { "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@"; }
# Offline machines (the GPU machine) install missing modules from wheels carried in .whl/.
wheels=(); [ -d .whl ] && wheels=(--no-index --find-links .whl)

need=()
for mod in numpy:numpy ml_dtypes:ml_dtypes pytest:pytest; do
  "$PY" -c "import ${mod%%:*}" 2>/dev/null || need+=("${mod#*:}")
done
# scikit-build-core 0.10 or later (pyproject.toml): --no-build-isolation below does not check it.
"$PY" -c 'import scikit_build_core, sys
sys.exit(tuple(map(int, scikit_build_core.__version__.split(".")[:2])) < (0, 10))' 2>/dev/null ||
  need+=("scikit-build-core>=0.10")
# nanobind: 2.10 or later, the first with the float8_e4m3fn DLPack code the bindings use.
"$PY" -c 'import nanobind, sys
sys.exit(tuple(map(int, nanobind.__version__.split(".")[:2])) < (2, 10))' 2>/dev/null ||
  need+=("nanobind>=2.10")
[ ${#need[@]} -eq 0 ] || pip_install "${wheels[@]}" "${need[@]}"

cuda=${SMLA_PYTHON_CUDA:-}
if [ -z "$cuda" ]; then
  cuda=OFF
  nvidia-smi -L >/dev/null 2>&1 && cuda=ON
fi
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
export CMAKE_ARGS="${CMAKE_ARGS:-} -DSMLA_CUDA=$cuda"
echo "== building the smla package (CUDA $cuda)"
start=$SECONDS
pip_install --no-build-isolation .
echo "   built in $((SECONDS - start)) s"

echo "== examples/engine_decode_loop.py"
"$PY" examples/engine_decode_loop.py --steps 2

echo "== pytest python/tests"
# From the repo root: `import smla` must find the installed package (python/smla has no _smla).
set +e
"$PY" -m pytest python/tests -q -rs -p no:cacheprovider "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "python_test.sh: pytest collected no tests" >&2
  exit 1
fi
[ $rc -eq 0 ] || exit $rc


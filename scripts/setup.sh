#!/usr/bin/env bash
# Installs what building and testing need, from Debian packages; does nothing when all is there.
# nvcc (the CUDA toolkit) is optional: with it the sm_90a kernels are built too.
set -euo pipefail
need=()
# CMake 3.25 or later (CMakeLists.txt); an older one is replaced by Debian's.
cmake_ok() {
  local v
  v=$(cmake --version 2>/dev/null | sed -n '1s/[^0-9]*\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [ -n "$v" ] && set -- $v && { [ "$1" -gt 3 ] || { [ "$1" -eq 3 ] && [ "$2" -ge 25 ]; }; }
}
cmake_ok || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
case ${CXX:-} in clang++*) command -v "$CXX" >/dev/null || need+=("${CXX/#clang++/clang}") ;; esac
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
# The Python package's tests: python3, pip, and the headers its extension builds against.
command -v python3 >/dev/null || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)  # python_test.sh's venv
python3 -c 'import os, sysconfig; assert os.path.isfile(sysconfig.get_paths()["include"] + "/Python.h")' \
  2>/dev/null || need+=(python3-dev)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null ||
      { echo "$0: needs root or sudo to install: ${need[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
  cmake_ok || { echo "$0: CMake 3.25 or later is needed; found: $(cmake --version | head -1)" >&2
    exit 1; }
fi

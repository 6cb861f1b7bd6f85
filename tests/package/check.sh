#!/bin/sh
# Installs the build BUILD into a scratch prefix (its dev component: library, headers, CMake
# package), then builds and runs this folder's consumer against it with the same compiler and
# flags (a sanitizer's too).
#   check.sh BUILD GENERATOR CXX CXX_FLAGS LINKER_FLAGS
set -eu
here=$(cd "$(dirname "$0")" && pwd)
scratch=$1/package-test
rm -rf "$scratch"
cmake --install "$1" --prefix "$scratch/prefix" --component dev >/dev/null
cmake -S "$here" -B "$scratch/build" -G "$2" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_CXX_COMPILER="$3" -DCMAKE_CXX_FLAGS="$4" \
  -DCMAKE_EXE_LINKER_FLAGS="$5" >/dev/null
cmake --build "$scratch/build" >/dev/null
"$scratch/build/consumer"

#!/bin/sh
# Installs the build BUILD into a scratch prefix (its dev component: library, headers, CMake
# package), then builds and runs this folder's consumer against it with the same compiler and
# flags (a sanitizer's too).
#   check.sh CMAKE BUILD GENERATOR MAKE_PROGRAM CXX CXX_FLAGS LINKER_FLAGS
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cmake=$1
scratch=$2/package-test
rm -rf "$scratch"
"$cmake" --install "$2" --prefix "$scratch/prefix" --component dev >/dev/null
"$cmake" -S "$here" -B "$scratch/build" -G "$3" -DCMAKE_MAKE_PROGRAM="$4" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_CXX_COMPILER="$5" \
  -DCMAKE_CXX_FLAGS="$6" -DCMAKE_EXE_LINKER_FLAGS="$7" >/dev/null
"$cmake" --build "$scratch/build" >/dev/null
"$scratch/build/consumer"

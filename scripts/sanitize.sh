#!/usr/bin/env bash
# The C++ tests of the CPU backend, the shared core and the tools under a host sanitizer:
# address (with undefined behaviour and libstdc++'s assertions, the default) or thread (the CPU
# backend's threads). No CUDA here: the GPU side runs under compute-sanitizer
# (scripts/gpu_check.sh sanitize).
#   scripts/sanitize.sh [address|thread]     (builds in build-san-address / build-san-thread)
# CXX picks the compiler as for CMake (CI runs the thread pass with clang++, so that both GCC and
# Clang build the library and its tests); each compiler has its own build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-address}
case $kind in
  address)
    # libstdc++'s assertions abort on what the sanitizers let pass: an operator[] one past a
    # vector, a uniform_int_distribution whose range is empty.
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    flags+=" -D_GLIBCXX_ASSERTIONS"
    ;;
  thread) flags="-fsanitize=thread" ;;
  *) echo "usage: $0 [address|thread]"; exit 2 ;;
esac
build=build-san-$kind${CXX:+-$(basename "$CXX")}
scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSMLA_CUDA=OFF \
  -DSMLA_PYTHON=OFF -DSMLA_TESTS=ON "-DCMAKE_CXX_FLAGS=$flags" \
  "-DCMAKE_EXE_LINKER_FLAGS=$flags" >/dev/null
cmake --build "$build" -j "$(nproc)"
# Tests that ask for more than an allocator can give expect an exception, not a sanitizer's abort.
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1
export TSAN_OPTIONS=allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1
# Cli.OutOfHostMemoryExits1 limits the address space (ulimit -v), which a sanitizer's shadow
# memory cannot fit in.
ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$(nproc)" \
  -E '^Cli\.OutOfHostMemoryExits1$'

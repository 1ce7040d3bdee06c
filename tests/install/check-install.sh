#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# check-install.sh: installs the build into a fresh prefix as `make install` does, checks what is
# there, and builds and runs consumer.c against that tree both ways: pkg-config (shared and
# static) and CMake's find_package(bie) (bie::bie and bie::bie_static).
# Usage: check-install.sh BUILD_DIR WORK_DIR
set -eu
build=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
prefix=$work/prefix
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$prefix" >"$work/install.txt"
libdir=$(dirname "$(find "$prefix" -name bie.pc)")/..
for f in include/bie.h include/bie-cuda.h bin/bie share/man/man1/bie.1; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f is not installed"; exit 1; }
done
for f in libbie.so libbie.so.0 libbie.a cmake/bie/bieConfig.cmake pkgconfig/bie.pc; do
  [ -e "$libdir/$f" ] || { echo "FAIL: $f is not installed in $libdir"; exit 1; }
done
[ -e "$build/libbie-cuda.so" ] && { [ -e "$libdir/libbie-cuda.so" ] || { echo "FAIL: the CUDA plugin is not installed"; exit 1; }; }
grep -q '^\.TH BIE 1' "$prefix/share/man/man1/bie.1"
"$prefix/bin/bie" version
"$prefix/bin/bie" bench --help >/dev/null

export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc=${CC:-cc}
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Wextra -Werror -o "$work/consumer_pc" "$here/consumer.c" $(pkg-config --cflags --libs bie) \
  -Wl,-rpath,"$(pkg-config --variable=libdir bie)"
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Wextra -Werror -fopenmp -o "$work/consumer_pc_static" "$here/consumer.c" \
  $(pkg-config --cflags bie) "$(pkg-config --variable=libdir bie)/libbie.a" $(pkg-config --libs-only-l --static bie | sed 's/-lbie //')
"$work/consumer_pc"
"$work/consumer_pc_static"

cmake -S "$here" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$work/cmake.txt"
cmake --build "$work/cmake-build" >>"$work/cmake.txt"
"$work/cmake-build/consumer_cmake"
"$work/cmake-build/consumer_cmake_static"
echo "ok: the installed tree in $prefix builds and runs consumer.c through pkg-config and CMake"

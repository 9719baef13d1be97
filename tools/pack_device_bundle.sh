#!/usr/bin/env bash
# Copies the built binaries and the shared libraries they need (other than glibc's and the
# CUDA driver's) into .devbin/, for a GPU machine that has the CUDA toolkit but not Debian's
# -dev packages. .devbin/ is ignored by git (.git/info/exclude) and travels as a carried path.
#   tools/pack_device_bundle.sh [build-dir]      (default build/release)
# KERNEL_BENCHES=0 leaves out bench_cuda_linear / bench_cuda_kernels / bench_cuda_persistent
# (30 MB of the 64 MiB that may travel) when the run does not need them;
# KERNEL_BENCHES="bench_cuda_kernels" takes only the ones named; TEST_BINARIES=0 leaves out
# test_cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >> .git/info/exclude
rm -rf .devbin && mkdir -p .devbin/lib
bins=("$build/kestrel")
extra=()
[[ ${TEST_BINARIES:-1} == 0 ]] || extra+=("$build"/tests/test_cuda)
case ${KERNEL_BENCHES:-1} in
  0) ;;
  1) extra+=("$build"/bench_cuda_linear "$build"/bench_cuda_kernels "$build"/bench_cuda_persistent) ;;
  *) for b in $KERNEL_BENCHES; do extra+=("$build/$b"); done ;;
esac
for t in "${extra[@]}"; do [[ -x $t ]] && bins+=("$t"); done
for b in "${bins[@]}"; do
  strip --strip-debug -o ".devbin/$(basename "$b")" "$b"
  ldd "$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|libgcc_s*|libstdc++*|libcuda.so*|libcublas*|libcudart*) ;;
      *) cp -nL "$lib" .devbin/lib/ ;;
    esac
  done
done
du -sh .devbin
# The travelling copy: compressed (the working tree that travels is capped), unpacked there with
# `tar -xJf .devpack/devbin.tar.xz`. xz -9's 64 MiB window spans the binaries, which share most of
# their code (the same static libraries): 16 MB for kestrel + test_cuda + bench_cuda_kernels,
# against 40 MB at -3, whose 4 MiB window sees each binary alone.
grep -qx '/.devpack/' .git/info/exclude || echo '/.devpack/' >> .git/info/exclude
mkdir -p .devpack && tar -cf - .devbin | xz -T0 -9 > .devpack/devbin.tar.xz
du -sh .devpack

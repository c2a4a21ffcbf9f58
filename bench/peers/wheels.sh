#!/usr/bin/env bash
# The peer libraries gpumem-bench measures that come as wheels from PyPI (published
# binaries; nothing of them is committed): RMM's C++ library and headers for the
# RMM peers, RMM's Python package for the Python harness, and nanobind to build
# gpumem's Python package where there is no network. Pinned here, kept in the
# git-ignored .whl/ folder of the repository, which travels to the GPU machine.
#
#   bench/peers/wheels.sh download        # here (needs PyPI): pip download into .whl/
#   bench/peers/wheels.sh unpack [DEST]   # anywhere: unpack .whl/'s wheels into DEST
#                                         # (default build/peer-wheels), a folder that
#                                         # is both GPUMEM_RMM_ROOT and a PYTHONPATH entry
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
wheels="$root/.whl"
# name==version as pip knows them; the file name patterns below follow them.
pins=("librmm-cu13==26.10.0" "rapids-logger==0.3.0" "rmm-cu13==26.10.0" "nanobind==2.9.2")
files=("librmm_cu13-26.10.0-*.whl" "rapids_logger-0.3.0-*.whl" "rmm_cu13-26.10.0-*.whl" "nanobind-2.9.2-*.whl")

case "${1:-}" in
  download)
    mkdir -p "$wheels"
    # The GPU machine's Python (3.12, x86-64 Linux), whatever this one is.
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_28_x86_64 --implementation cp -d "$wheels" "${pins[@]}"
    du -ch "$wheels"/*.whl | tail -n 1
    ;;
  unpack)
    dest="${2:-$root/build/peer-wheels}"
    mkdir -p "$dest"
    status=0
    for pattern in "${files[@]}"; do
      # shellcheck disable=SC2206
      found=("$wheels"/$pattern)
      if [ ! -f "${found[0]}" ]; then
        echo "wheels.sh: no $pattern in .whl/ (run: bench/peers/wheels.sh download)" >&2
        status=1
        continue
      fi
      python3 -m zipfile -e "${found[0]}" "$dest"
      echo "unpacked $(basename "${found[0]}")"
    done
    # zipfile keeps no permissions: the libraries must be loadable.
    find "$dest" -name "*.so*" -type f -exec chmod 755 {} +
    exit $status
    ;;
  *)
    echo "usage: bench/peers/wheels.sh download | unpack [DEST]" >&2
    exit 2
    ;;
esac

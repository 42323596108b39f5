#!/bin/sh
# Fetches Debian's amd64 kernels (bookworm's 6.1 and trixie's 6.12) into a cache, for the tests
# that read kallsyms and BTF out of a real kernel image (tests/unit/kernel/guest_kernel_test.cpp,
# docs/guest-symbols.md). For each kernel it keeps:
#   <cache>/<release>/vmlinux     the ELF inside vmlinuz (tools/vmlinuz-payload.sh): what the
#                                 boot loader puts in memory, kallsyms and .BTF included
#   <cache>/<release>/System.map  the real one, from the -dbg package (the image package ships
#                                 a one-line placeholder): the reference the test compares with
#   <cache>/<release>/config
# and deletes the packages (the -dbg one is ~1 GB; extracting System.map from it takes ~2 min).
# A release already in the cache is not fetched again. Needs Debian's mirror; trixie's package
# lists go to a private apt state under the cache, the machine's apt sources are not touched.
#
#   sh tools/fetch-debian-kernels.sh [cache]     (default /var/cache/xenprobes-kernels)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:-${XENPROBES_KERNEL_CACHE:-/var/cache/xenprobes-kernels}}
mkdir -p "$cache"

fetch() {  # suite
  suite=$1
  apt_dir="$cache/apt-$suite"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb http://deb.debian.org/debian $suite main" >"$apt_dir/sources.list"
  set -- -o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null \
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root
  apt-get "$@" -qq update
  # linux-image-amd64 depends on the current linux-image-<release>-amd64.
  image=$(apt-cache "$@" depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[^ ]*-amd64\)$/\1/p' | head -n1)
  if [ -z "$image" ]; then
    echo "fetch-debian-kernels: $suite's linux-image-amd64 depends on no linux-image-*-amd64" >&2
    return 1
  fi
  release=${image#linux-image-}
  out="$cache/$release"
  if [ -s "$out/vmlinux" ] && [ -s "$out/System.map" ]; then
    echo "fetch-debian-kernels: $release already in $out"
    return 0
  fi
  work="$cache/work-$release"
  rm -rf "$work"
  mkdir -p "$work/x"
  (cd "$work" && apt-get "$@" -qq download "$image-unsigned" "$image-dbg")
  dpkg-deb --fsys-tarfile "$work/$image-unsigned"_*.deb | tar -x -C "$work/x" ./boot
  dpkg-deb --fsys-tarfile "$work/$image-dbg"_*.deb | tar -x -C "$work/x" "./usr/lib/debug/boot/System.map-$release"
  mkdir -p "$out"
  sh "$here/vmlinuz-payload.sh" "$work/x/boot/vmlinuz-$release" "$out/vmlinux.tmp"
  cp "$work/x/boot/config-$release" "$out/config"
  mv "$work/x/usr/lib/debug/boot/System.map-$release" "$out/System.map"
  mv "$out/vmlinux.tmp" "$out/vmlinux"
  rm -rf "$work"
  echo "fetch-debian-kernels: $release in $out"
}

fetch bookworm
fetch trixie

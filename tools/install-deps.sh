#!/bin/sh
# Installs what libxenprobes needs to build and test on Debian 12 (run as root).
set -eu
export DEBIAN_FRONTEND=noninteractive
pkgs="build-essential ccache cmake pkg-config binutils libxen-dev libcapstone-dev libunicorn-dev
      googletest libgtest-dev libgmock-dev libbenchmark-dev linux-headers-amd64
      clang-14 libclang-rt-14-dev clang-format-14 clang-tidy-19
      libbpf-dev libelf-dev libssl-dev libcli11-dev nlohmann-json3-dev
      libtomlplusplus-dev libcpp-httplib-dev libsystemd-dev prometheus systemd
      xz-utils zstd"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "install-deps: installing$missing"
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
echo "install-deps: all build dependencies present"

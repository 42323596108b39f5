# shellcheck shell=bash
# Cached images: the Dom0 root file system (debootstrap), its tiny boot initrd, and the
# stock Debian hypervisor. Sourced by run.sh after lib.sh. Each artefact lives in a
# directory named after a hash of its inputs and is complete only when its `ok` file exists.

# Bump when the recipe of e2e_rootfs changes in a way the package list does not show.
E2E_ROOTFS_RECIPE=1

# Sets ROOTFS_DIR (holding rootfs.ext4, vmlinuz, kver, packages.txt) and DOM0_INITRD, for
# the platform e2e_platform chose (lib.sh).
e2e_rootfs() {
  e2e_stage "rootfs (debootstrap $E2E_SUITE)"
  local key out tree
  key=$(e2e_hash -s "recipe $E2E_ROOTFS_RECIPE $E2E_MIRROR $E2E_SUITE $E2E_ROOTFS_PKGS $E2E_XEN_VERSION $E2E_KERNEL_VERSION")
  out=$E2E_CACHE/rootfs/$key
  ROOTFS_DIR=$out
  if [ -e "$out/ok" ]; then
    e2e_stage_done "cached: $out"
    e2e_dom0_initrd
    return 0
  fi
  tree=$out/tree
  e2e_debootstrap "$out" "$E2E_ROOTFS_PKGS"
  # The pins hold: the tools and the kernel come from the suite's main.
  local xv kv
  xv=$(chroot "$tree" dpkg-query -W -f='${Version}' "xen-utils-$E2E_XEN_SERIES")
  kv=$(chroot "$tree" dpkg-query -W -f='${Version}' "linux-image-$E2E_KERNEL_ABI")
  [ "$xv" = "$E2E_XEN_VERSION" ] || e2e_die "rootfs has xen-utils-$E2E_XEN_SERIES $xv, expected $E2E_XEN_VERSION"
  [ "$kv" = "$E2E_KERNEL_VERSION" ] || e2e_die "rootfs has linux-image-$E2E_KERNEL_ABI $kv, expected $E2E_KERNEL_VERSION"
  chroot "$tree" dpkg-query -W -f='${Package} ${Version}\n' >"$out/packages.txt"
  rm -f "$tree"/var/cache/apt/archives/*.deb
  echo xpe2e-dom0 >"$tree/etc/hostname"
  printf '/dev/vda / ext4 rw 0 1\n' >"$tree/etc/fstab"
  cp "$tree/boot/vmlinuz-$E2E_KERNEL_ABI" "$out/vmlinuz"
  echo "$E2E_KERNEL_ABI" >"$out/kver"

  e2e_log "ext4 image (mkfs.ext4 -d, no mount)"
  mkfs.ext4 -q -F -L xpe2e-root -d "$tree" "$out/rootfs.ext4" 3G || e2e_die "mkfs.ext4 failed"

  touch "$out/ok"
  e2e_stage_done "built: $out"
  e2e_dom0_initrd
}

# e2e_debootstrap <dir> <packages,...>: debootstrap --variant=minbase of E2E_SUITE into
# <dir>/tree, unless an earlier, complete one is there (<dir>/debootstrap.ok: a run stopped
# after it resumes from there).
e2e_debootstrap() {
  local out=$1 tree=$1/tree
  [ -e "$out/debootstrap.ok" ] && [ -d "$tree" ] && return 0
  rm -rf "$out"
  mkdir -p "$out"
  e2e_log "debootstrap --variant=minbase $E2E_SUITE into $tree (log: $out/debootstrap.log; 5-15 min)"
  if ! timeout 2400 nice debootstrap --variant=minbase --include="$2" "$E2E_SUITE" "$tree" "$E2E_MIRROR" \
    >"$out/debootstrap.log" 2>&1; then
    tail -n 20 "$out/debootstrap.log" >&2
    e2e_die "debootstrap failed (log: $out/debootstrap.log)"
  fi
  touch "$out/debootstrap.ok"
}

# The trixie build root: what builds the library, its tools, the e2e program and the guest
# module for Debian 13 (its libxen-dev 4.20, Capstone 5, GoogleTest and gcc 14, and the
# headers of the kernel its Dom0 and DomUs run). Sets BUILDROOT (the tree).
E2E_BUILDROOT_RECIPE=1
e2e_buildroot() {
  e2e_stage "build root (debootstrap $E2E_SUITE + build dependencies)"
  # tools/install-deps.sh's build packages that trixie has (no clang-14 or Google Benchmark:
  # the sanitizer stage and the benchmarks stay on Debian 12), and the DomU kernel's headers.
  # xenprobesd's (libtomlplusplus-dev, libcpp-httplib-dev, libsystemd-dev): the whole tree
  # configures only with them. ccache: a clean clone's build hits the cache (build-cache.sh).
  local pkgs="build-essential,ccache,cmake,pkg-config,binutils,kmod,libxen-dev,libcapstone-dev,libunicorn-dev,libbpf-dev,libssl-dev,libcli11-dev,nlohmann-json3-dev,googletest,libgtest-dev,libgmock-dev,libtomlplusplus-dev,libcpp-httplib-dev,libsystemd-dev,linux-headers-$E2E_KERNEL_ABI"
  local out
  out=$E2E_CACHE/buildroot/$(e2e_hash -s "recipe $E2E_BUILDROOT_RECIPE $E2E_MIRROR $E2E_SUITE $pkgs $E2E_XEN_VERSION $E2E_KERNEL_VERSION")
  BUILDROOT=$out/tree
  if [ -e "$out/ok" ]; then
    e2e_stage_done "cached: $out"
    return 0
  fi
  e2e_debootstrap "$out" "$pkgs"
  local xv
  xv=$(chroot "$BUILDROOT" dpkg-query -W -f='${Version}' libxen-dev)
  [ "$xv" = "$E2E_XEN_VERSION" ] || e2e_die "build root has libxen-dev $xv, expected $E2E_XEN_VERSION"
  [ -d "$BUILDROOT/usr/src/linux-headers-$E2E_KERNEL_ABI" ] || e2e_die "build root has no linux-headers-$E2E_KERNEL_ABI"
  chroot "$BUILDROOT" dpkg-query -W -f='${Package} ${Version}\n' >"$out/packages.txt"
  rm -f "$BUILDROOT"/var/cache/apt/archives/*.deb
  mkdir -p "$BUILDROOT/src" "$BUILDROOT/build"
  touch "$out/ok"
  e2e_stage_done "built: $out"
}

# e2e_in_buildroot <source dir> <build dir> <command...>: runs the command in the build root
# with the source read-only at /src, the build dir at /build and the build root's compiler
# cache (kept across runs and clones: tools/build-cache.sh) at /ccache, in a mount namespace of
# its own (the bind mounts end with it: nothing to clean up, even when killed).
e2e_in_buildroot() {
  local src=$1 bld=$2 cc=$E2E_CACHE/ccache/$E2E_SUITE
  shift 2
  mkdir -p "$bld" "$cc" "$BUILDROOT/ccache"
  unshare --mount --propagation private sh -c 'r=$3 && mount --bind "$1" "$r/src" && mount -o remount,bind,ro "$r/src" &&
    mount --bind "$2" "$r/build" && mount --bind "$4" "$r/ccache" && mount -t proc proc "$r/proc" &&
    shift 4 && exec chroot "$r" "$@"' \
    sh "$src" "$bld" "$BUILDROOT" "$cc" "$@"
}

# The tiny Dom0 boot initrd (busybox + virtio_blk + ext4 and their dependencies), from the
# rootfs's modules. Sets DOM0_INITRD.
e2e_dom0_initrd() {
  local bbver key out tree=$ROOTFS_DIR/tree
  bbver=$(dpkg-query -W -f='${Version}' busybox-static)
  key=$(e2e_hash -s "$ROOTFS_DIR busybox-static=$bbver" "$E2E_TOOLS/dom0/initrd-init")
  out=$E2E_CACHE/dom0-initrd/$key
  DOM0_INITRD=$out/dom0-initrd.cpio.gz
  [ -e "$out/ok" ] && return 0
  e2e_log "Dom0 boot initrd (busybox + virtio_blk + ext4)"
  rm -rf "$out"
  mkdir -p "$out"
  local ird=$out/initrd-tree m line
  mkdir -p "$ird"/{bin,dev,proc,sys,newroot,lib/modules}
  cp /bin/busybox "$ird/bin/busybox"
  ln -s busybox "$ird/bin/sh"
  cp "$E2E_TOOLS/dom0/initrd-init" "$ird/init"
  chmod 755 "$ird/init"
  : >"$ird/lib/modules/load-order"
  for m in virtio_pci virtio_blk ext4; do
    modprobe -d "$tree" -S "$E2E_KERNEL_ABI" --show-depends "$m" | while read -r line; do
      set -- $line
      [ "$1" = insmod ] || continue
      local f=$2 b
      b=$(basename "$f")
      b=${b%.xz}
      grep -qx "$b" "$ird/lib/modules/load-order" && continue
      [ -e "$f" ] || f=$tree/${f#/}
      case "$f" in
        # Debian 13 ships its modules xz-compressed (CONFIG_MODULE_COMPRESS_XZ); the initrd's
        # busybox insmod passes a file's bytes to init_module as they are: unpack them here.
        *.ko.xz) busybox unxz -c <"$f" >"$ird/lib/modules/$b" || e2e_die "cannot unpack $f" ;;
        *) cp "$f" "$ird/lib/modules/$b" ;;
      esac
      echo "$b" >>"$ird/lib/modules/load-order"
    done
  done
  [ -s "$ird/lib/modules/load-order" ] || e2e_die "no modules found for the Dom0 initrd"
  (cd "$ird" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$DOM0_INITRD"
  rm -rf "$ird"
  touch "$out/ok"
}

# Sets XEN_STOCK (the uncompressed ELF of Debian's hypervisor: QEMU's multiboot loader cannot
# read xen.gz).
e2e_xen_stock() {
  local pkg=xen-hypervisor-$E2E_XEN_SERIES-amd64
  e2e_stage "stock hypervisor ($pkg=$E2E_XEN_VERSION)"
  local out=$E2E_CACHE/xen/stock-$E2E_XEN_VERSION
  XEN_STOCK=$out/xen
  if [ -e "$out/ok" ]; then
    e2e_stage_done "cached"
    return 0
  fi
  rm -rf "$out"
  mkdir -p "$out/x"
  if [ "$E2E_SUITE" = bookworm ]; then
    (cd "$out" && timeout 600 apt-get download -q "$pkg=$E2E_XEN_VERSION" >download.log 2>&1)
  else
    # Another suite than the host's: through a private apt configuration (e2e_apt).
    (cd "$out" && e2e_apt "$E2E_CACHE/apt-$E2E_SUITE" "deb $E2E_MIRROR $E2E_SUITE main" \
      download -q "$pkg=$E2E_XEN_VERSION" >download.log 2>&1)
  fi || e2e_die "apt-get download failed (log: $out/download.log)"
  dpkg -x "$out"/"$pkg"_*.deb "$out/x"
  local gz
  gz=$(ls "$out"/x/boot/xen-*.gz | head -n 1)
  [ -n "$gz" ] || e2e_die "no xen-*.gz in the package"
  zcat "$gz" >"$XEN_STOCK"
  rm -rf "$out/x"
  touch "$out/ok"
  e2e_stage_done "$(basename "$gz")"
}

# A private apt configuration for one extra source (deb-src of bookworm main, or
# bookworm-backports binaries), so the system's sources stay untouched.
# e2e_apt <dir> <sources.list line> <apt-get args...>
e2e_apt() {
  local dir=$1 line=$2
  shift 2
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
  echo "$line" >"$dir/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" -o APT::Get::List-Cleanup=0)
  if [ ! -e "$dir/updated" ]; then
    timeout 600 apt-get "${opts[@]}" update -qq >"$dir/update.log" 2>&1 || return 1
    touch "$dir/updated"
  fi
  timeout 1200 apt-get "${opts[@]}" "$@"
}

# Bump when the recipe below changes.
E2E_GDBSX_RECIPE=1

# Debian's xen source package rebuilt with CONFIG_EXPERT + CONFIG_GDBSX (docs/e2e.md). Sets
# XEN_GDBSX (uncompressed ELF).
e2e_xen_gdbsx() {
  e2e_stage "GDBSX hypervisor (xen $E2E_XEN_VERSION source + CONFIG_GDBSX)"
  local key out
  key=$(e2e_hash -s "recipe $E2E_GDBSX_RECIPE $E2E_XEN_VERSION $(gcc -dumpfullversion)")
  out=$E2E_CACHE/xen/gdbsx-$key
  XEN_GDBSX=$out/xen
  if [ -e "$out/ok" ]; then
    e2e_stage_done "cached: $out"
    return 0
  fi
  local p missing=""
  for p in flex bison bc python3 dpkg-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null ||
      e2e_die "apt-get install$missing failed"
  fi
  rm -rf "$out"
  mkdir -p "$out/src"
  # The bookworm-security source answers 404 on this mirror; bookworm main works.
  (cd "$out/src" && e2e_apt "$E2E_CACHE/apt-src" "deb-src $E2E_MIRROR $E2E_SUITE main" \
    source --download-only -q "xen=$E2E_XEN_VERSION") >"$out/source.log" 2>&1 ||
    e2e_die "apt-get source xen=$E2E_XEN_VERSION failed (log: $out/source.log)"
  (cd "$out/src" && dpkg-source -x xen_*.dsc tree) >>"$out/source.log" 2>&1 || e2e_die "dpkg-source -x failed (log: $out/source.log)"
  local t=$out/src/tree
  [ -f "$t/debian/xen-kconfig" ] || e2e_die "no debian/xen-kconfig in the source package"
  cp "$t/debian/xen-kconfig" "$t/xen/.config"
  printf 'CONFIG_EXPERT=y\nCONFIG_GDBSX=y\n' >>"$t/xen/.config"
  e2e_log "make -C xen (~1-2 min; log: $out/build.log)"
  {
    make -C "$t/xen" XEN_TARGET_ARCH=x86_64 olddefconfig &&
      nice make -C "$t/xen" -j2 XEN_TARGET_ARCH=x86_64
  } >"$out/build.log" 2>&1 || {
    tail -n 30 "$out/build.log" >&2
    e2e_die "hypervisor build failed (log: $out/build.log)"
  }
  grep -qx 'CONFIG_GDBSX=y' "$t/xen/.config" || e2e_die "CONFIG_GDBSX did not stick (olddefconfig dropped it)"
  cp "$t/xen/.config" "$out/config"
  zcat "$t/xen/xen.gz" >"$XEN_GDBSX" || e2e_die "no xen/xen.gz"
  rm -rf "$out/src"
  touch "$out/ok"
  e2e_stage_done "built: $XEN_GDBSX"
}

# QEMU >= 9.1 for ICEBP under TCG (Debian 12's 7.2 decodes 0xF1 as #UD), from
# bookworm-backports, unpacked with dpkg -x (the host's QEMU stays as it is). Sets QEMU_NEW
# (the binary) and QEMU_NEW_SHARE (its -L directory).
E2E_QEMU_BPO_PKGS="qemu-system-x86 qemu-system-common qemu-system-data seabios"
e2e_qemu_backports() {
  e2e_stage "QEMU from bookworm-backports (for ICEBP under TCG)"
  local out
  out=$E2E_CACHE/qemu-bpo-$(e2e_hash -s "bookworm-backports $E2E_QEMU_BPO_PKGS recipe 2")
  QEMU_NEW=$out/root/usr/bin/qemu-system-x86_64
  QEMU_NEW_SHARE=$out/root/usr/share/qemu
  if [ -e "$out/ok" ]; then
    e2e_stage_done "cached: $($QEMU_NEW --version | head -n 1)"
    return 0
  fi
  rm -rf "$out"
  mkdir -p "$out/debs" "$out/root"
  local p
  for p in $E2E_QEMU_BPO_PKGS; do
    # The private sources list holds bookworm-backports only, so apt picks its version.
    if ! (cd "$out/debs" && e2e_apt "$E2E_CACHE/apt-bpo" "deb $E2E_MIRROR bookworm-backports main" \
      download -q "$p") >>"$out/download.log" 2>&1; then
      # A companion without a backport (seabios): bookworm's.
      (cd "$out/debs" && apt-get download -q "$p") >>"$out/download.log" 2>&1 || e2e_die "apt-get download $p failed"
    fi
  done
  for p in "$out"/debs/*.deb; do dpkg -x "$p" "$out/root"; done
  local missing
  missing=$(ldd "$QEMU_NEW" | awk '/not found/ {print $1}' | tr '\n' ' ')
  [ -z "$missing" ] || e2e_die "the backported QEMU needs libraries this host lacks: $missing"
  "$QEMU_NEW" --version >"$out/version" || e2e_die "the backported QEMU does not run"
  grep -q "version \(9\.[1-9]\|[1-9][0-9]\)" "$out/version" || e2e_die "QEMU from backports is $(head -n 1 "$out/version"), not >= 9.1"
  touch "$out/ok"
  e2e_stage_done "$(head -n 1 "$out/version")"
}

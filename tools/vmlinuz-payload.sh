#!/bin/sh
# Writes the kernel ELF (vmlinux, stripped) carried inside an x86 bzImage (vmlinuz) to OUT.
#
#   sh tools/vmlinuz-payload.sh VMLINUZ OUT
#
# The boot protocol's setup header says where the compressed kernel is: setup_sects (byte
# 0x1f1; 0 means 4) gives the size of the real-mode part, (setup_sects + 1) * 512 bytes, and
# payload_offset / payload_length (0x248 / 0x24c, protocol 2.08+) locate the payload from the
# end of that part (Documentation/arch/x86/boot.rst). Linux's build appends the uncompressed
# size as 4 more bytes, which the decompressors below would take for a second stream, so they
# are cut off. Which compressor: the payload's own magic bytes.
set -eu
in=$1
out=$2

u8() { od -An -tu1 -j "$1" -N1 "$in" | tr -d ' '; }
u32() { od -An -tu4 -j "$1" -N4 "$in" | tr -d ' '; }

if [ "$(od -An -c -j 0x202 -N4 "$in" | tr -d ' ')" != HdrS ]; then
  echo "vmlinuz-payload: $in has no x86 boot header (no 'HdrS' at 0x202): not a bzImage" >&2
  exit 1
fi
sects=$(u8 $((0x1f1)))
[ "$sects" = 0 ] && sects=4
off=$(( (sects + 1) * 512 + $(u32 $((0x248))) ))
len=$(u32 $((0x24c)))
if [ "$len" -le 4 ]; then
  echo "vmlinuz-payload: $in says its payload is $len bytes long" >&2
  exit 1
fi
magic=$(od -An -tx1 -j "$off" -N4 "$in" | tr -d ' ')
payload() { tail -c +$((off + 1)) "$in" | head -c $((len - 4)); }
case $magic in
  fd377a58) payload | xz -dc --single-stream >"$out.tmp" ;;
  28b52ffd) payload | zstd -dcq >"$out.tmp" ;;
  1f8b*) payload | gzip -dc >"$out.tmp" ;;
  *) echo "vmlinuz-payload: $in: unknown compressed payload (magic $magic at $off); xz, zstd and gzip are known" >&2
     exit 1 ;;
esac
if [ "$(od -An -c -N4 "$out.tmp" | tr -d ' ')" != 177ELF ]; then
  echo "vmlinuz-payload: $in: the decompressed payload is not an ELF file" >&2
  rm -f "$out.tmp"
  exit 1
fi
mv "$out.tmp" "$out"

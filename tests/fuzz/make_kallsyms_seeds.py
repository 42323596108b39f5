#!/usr/bin/env python3
"""Seeds for the kallsyms fuzz target (tests/fuzz/kallsyms_fuzz.cpp): small kallsyms tables in
Linux's two layouts, written from the format (docs/guest-symbols.md), and a minimal BTF blob.
The real-kernel test (tests/unit/kernel/guest_kernel_test.cpp) checks the decoder on Debian's
own tables; these only give the fuzzer a valid starting point.

    python3 tests/fuzz/make_kallsyms_seeds.py tests/fuzz/corpus/kallsyms
"""
import os
import struct
import sys

BASE = 0xffffffff82000000
TEXT = 0xffffffff81000000


def align8(b):
    return b + b"\0" * (-len(b) % 8)


def tables(symbols, after, percpu_absolute):
    """symbols: [(type, name, address)] sorted by address. Returns the memory image."""
    # One token per byte value: byte c expands to chr(c), so names are stored uncompressed.
    tokens = [b""] + [bytes([c]) for c in range(1, 256)]
    token_table = b"".join(t + b"\0" for t in tokens)
    index, off = [], 0
    for t in tokens:
        index.append(off)
        off += len(t) + 1
    token_index = struct.pack("<256H", *index)
    names, markers = b"", []
    for i, (typ, name, _) in enumerate(symbols):
        if i % 256 == 0:
            markers.append(len(names))
        body = (typ + name).encode()
        names += bytes([len(body)]) + body
    base = min(a for _, _, a in symbols if a >= TEXT)
    offs = []
    for _, _, a in symbols:
        if percpu_absolute:
            offs.append(a if a < TEXT else base - 1 - a)
        else:
            offs.append(a - base)
    offsets = struct.pack("<%di" % len(offs), *offs)
    num = struct.pack("<I", len(symbols))
    mk = struct.pack("<%dI" % len(markers), *markers)
    rb = struct.pack("<Q", base)
    if after:  # Linux 6.2+: num_syms names markers token_table token_index offsets relative_base
        parts = [num, names, mk, token_table, token_index, offsets, rb]
    else:      # Linux 6.1: offsets relative_base num_syms names markers token_table token_index
        parts = [offsets, rb, num, names, mk, token_table, token_index]
    return b"".join(align8(p) for p in parts)


def btf():
    # Header (magic, version, flags, hdr_len, type_off, type_len, str_off, str_len), one
    # 4-byte signed int named "int".
    strs = b"\0int\0"
    int_type = struct.pack("<III", 1, 1 << 24, 4) + struct.pack("<I", (1 << 24) | 32)
    hdr = struct.pack("<HBBIIIII", 0xeB9F, 1, 0, 24, 0, len(int_type), len(int_type), len(strs))
    return hdr + int_type + strs


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    syms = [("T", "_text", TEXT), ("T", "_stext", TEXT), ("T", "startup_64", TEXT),
            ("t", "do_one_initcall", TEXT + 0x1000), ("T", "vfs_read", TEXT + 0x2340),
            ("T", "_etext", TEXT + 0x10000), ("R", "__start_BTF", BASE + 0x100000),
            ("R", "__stop_BTF", BASE + 0x100040), ("D", "jiffies", BASE + 0x200000)]
    percpu = [("A", "__per_cpu_start", 0), ("A", "irq_stack_backing_store", 0x2000)]
    b = btf()
    for name, data in [("after-6.2", tables(syms, True, False)),
                       ("before-6.1-percpu", tables(percpu + syms, False, True))]:
        with open(os.path.join(out, name), "wb") as f:
            f.write(struct.pack("<I", len(b)) + b + data)
    big = [("t", "f%05d" % i, TEXT + 16 * i) for i in range(700)]
    with open(os.path.join(out, "after-700-symbols"), "wb") as f:
        f.write(struct.pack("<I", 0) + tables(big, True, False))


main()

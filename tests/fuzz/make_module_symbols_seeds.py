#!/usr/bin/env python3
"""Writes the module seeds of tests/fuzz/corpus/kallsyms/ (module_*: the kallsyms target's
input with the first u32's top bit set, then the format module_symbols_fuzz.hpp describes): a module's core_kallsyms as Linux lays it out (ELF64
symbols with running addresses, a strtab, one type letter each) and a base + split BTF pair
built by hand after libbpf's format (linux/btf.h: the header, struct btf_type, members).
    python3 tests/fuzz/make_module_symbols_seeds.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = 0xFFFFFFFFC0000000
u8 = lambda v: struct.pack("<B", v & 0xFF)
u16 = lambda v: struct.pack("<H", v & 0xFFFF)
u32 = lambda v: struct.pack("<I", v & 0xFFFFFFFF)
u64 = lambda v: struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def put(name, data):
    d = os.path.join(HERE, "corpus", "kallsyms")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "module_" + name), "wb") as f:
        f.write(u32(0x80000000) + data)


def btf(types, strings):
    hdr = u16(0xEB9F) + u8(1) + u8(0) + u32(24) + u32(0) + u32(len(types)) + u32(len(types)) + u32(len(strings))
    return hdr + types + strings


INT, PTR, STRUCT = 1, 2, 4
# Base: [1] int "int" (32 bits, signed), [2] struct "list_head" {next, prev: ptr to 2}, [3] ptr -> 2.
base_str = b"\0int\0list_head\0next\0prev\0"
base_types = (u32(1) + u32(INT << 24) + u32(4) + u32((1 << 24) | 32)
              + u32(5) + u32((STRUCT << 24) | 2) + u32(16) + u32(15) + u32(3) + u32(0) + u32(20) + u32(3) + u32(64)
              + u32(0) + u32(PTR << 24) + u32(2))
BASE = btf(base_types, base_str)
# Split: [4] struct "xfs_inode" { int i_ino; struct list_head i_lru; } (24 bytes); string
# offsets continue the base's.
off = len(base_str)
split_str = b"xfs_inode\0i_ino\0i_lru\0"
split_types = (u32(off) + u32((STRUCT << 24) | 2) + u32(24)
               + u32(off + 10) + u32(1) + u32(0) + u32(off + 16) + u32(2) + u32(64))
SPLIT = btf(split_types, split_str)


def sym(name_off, value, size=0, shndx=1):
    return u32(name_off) + u8(0x12) + u8(0) + u16(shndx) + u64(value) + u64(size)


def seed(flags, text_size, num, symtab, strtab, typetab, base=BASE, split=SPLIT, wild=b""):
    return (u8(flags) + u16(text_size - 1) + u32(num) + wild + u16(len(symtab)) + symtab + u16(len(strtab)) + strtab
            + u16(len(typetab)) + typetab + u16(len(base)) + base + split)


def honest():
    strtab = b"\0xfs_file_read_iter\0xfs_init\0xfs_stats\0printk\0xfs_last\0"
    offs = [1, 20, 29, 39, 46]
    symtab = (sym(0, 0, 0, 0) + sym(offs[0], TEXT + 0x100, 0x80) + sym(offs[1], TEXT + 0x200)
              + sym(offs[2], TEXT + 0x10) + sym(offs[3], 0, 0, 0) + sym(offs[4], TEXT + 0x2F00, 0x1000))
    return seed(0, 0x3000, 6, symtab, strtab, b"UtTdUt")


def hostile():
    strtab = b"\0good\0bad\x01name\0with:colon\0" + b"x" * 600 + b"\0"
    symtab = (sym(0, 0, 0, 0) + sym(1, TEXT + 0x10) + sym(6, TEXT + 0x20) + sym(15, TEXT + 0x30)
              + sym(26, TEXT + 0x40) + sym(0xFFFFFF, TEXT + 0x50) + sym(1, TEXT + 0x1000) + sym(1, 0xFFFFFFFF81000000)
              + sym(1, TEXT + 0x10, 0xFFFFFFFFFFFFFFFF))
    return seed(1, 0x1000, 9, symtab, strtab, b"Uttttttt" + b"T")


def aliases_and_faults():
    strtab = b"\0a\0b\0" + b"c" * (4096 - 5)  # the last name runs into the unmapped next page
    symtab = sym(0, 0, 0, 0) + sym(1, TEXT + 0x8) + sym(3, TEXT + 0x8, 4) + sym(5, TEXT + 0x4)
    return seed(1, 0x20, 4, symtab, strtab, b"UtWt")


if __name__ == "__main__":
    put("honest_module", honest())
    put("hostile_symbols", hostile())
    put("aliases_and_faults", aliases_and_faults())
    put("wild_pointers", seed(6, 0x100, 3, b"", b"", b"", wild=u64(0x400000) + u64(0xFFFFFFFFFFFFFFF0)))
    put("huge_count", seed(0, 0x100, 99999, b"", b"", b""))
    put("btf_junk", seed(0, 0x100, 0, b"", b"", b"", split=b"\x9f\xeb\x01\x00" + b"\x5a" * 60))

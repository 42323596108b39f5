// struct module's layout as BTF, hand-made with libbpf's writer in Debian's 6.1 and 6.12
// shapes: for the kernel-layer tests (modules_test.cpp) and for xenprobe's, whose simulated
// guest gets a module list read through it.
#pragma once

#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace xenprobes::testing {

// struct module's members as pahole prints them for Debian's 6.1.0-50 and 6.12.117 kernels
// (offsets in bytes). The hand-made BTF below has exactly these, so the layout the library
// finds must be these.
struct Offsets {
  std::uint32_t size, state, list, name, num_exentries, extable, text, init_text, noinstr, noinstr_size, jump, num_jump,
      kprobes, kprobes_size, num_sc, sc;
  bool mem;
  // core_kallsyms (struct mod_kallsyms: symtab +0, num_symtab +8, strtab +16, typetab +24),
  // btf_data_size, btf_data.
  std::uint32_t core_kallsyms, btf_size, btf_data;
  // arch (struct mod_arch_specific: num_orcs +0, orc_unwind_ip +8, orc_unwind +16); 0: none.
  std::uint32_t arch = 0;
  // struct btf's size (kernel/bpf/btf.c; data +0 and data_size +80 in both, kBtfData*).
  std::uint32_t btf_struct = 0;
};
// struct btf_module (kernel/bpf/btf.c, 48 bytes in both: list +0, module +16, btf +24,
// sysfs_attr +32, flags +40) and struct btf's data and data_size, as pahole prints them.
inline constexpr std::uint32_t kBtfModuleSize = 48, kBtfModuleModule = 16, kBtfModuleBtf = 24, kBtfData = 0,
                               kBtfDataSize = 80;
inline constexpr Offsets k61{896, 0,   8,   24,  300, 304,   320, 400, 624, 632, 696,
                             704, 760, 768, 788, 792, false, 552, 680, 688, 480, 208};
// 6.12: mem[7] of struct module_memory (72 bytes) at 320: MOD_TEXT = 0, MOD_INIT_TEXT = 4.
inline constexpr Offsets k612{1280, 0,    8,    24,   300,  304,  320, 320 + 4 * 72, 968,  976, 1048,
                              1056, 1112, 1120, 1140, 1144, true, 896, 1024,         1032, 824, 232};

// A BTF holding struct module (and what it needs) with the offsets above, and struct btf_module
// and struct btf (what the kernel's btf_modules list holds); `drop` leaves one member of struct
// module out, or one of the two structs ("struct btf_module", "struct btf").
inline std::vector<std::byte> module_btf(const Offsets& o, const std::string& drop = "") {
  btf* b = btf__new_empty();
  const int u32 = btf__add_int(b, "unsigned int", 4, 0);
  const int s32 = btf__add_int(b, "int", 4, BTF_INT_SIGNED);
  const int chr = btf__add_int(b, "char", 1, BTF_INT_CHAR);
  const int vp = btf__add_ptr(b, 0);  // void *
  const int state = btf__add_enum(b, "module_state", 4);
  btf__add_enum_value(b, "MODULE_STATE_LIVE", 0);
  btf__add_enum_value(b, "MODULE_STATE_COMING", 1);
  btf__add_enum_value(b, "MODULE_STATE_GOING", 2);
  btf__add_enum_value(b, "MODULE_STATE_UNFORMED", 3);
  const int lh = btf__add_struct(b, "list_head", 16);
  const int lhp = btf__add_ptr(b, lh);
  btf__add_field(b, "next", lhp, 0, 0);
  btf__add_field(b, "prev", lhp, 64, 0);
  const int name = btf__add_array(b, u32, chr, 56);
  int area = 0, areas = 0;
  if (o.mem) {
    btf__add_enum(b, "mod_mem_type", 4);
    const char* types[] = {"MOD_TEXT",      "MOD_DATA",      "MOD_RODATA",     "MOD_RO_AFTER_INIT",
                           "MOD_INIT_TEXT", "MOD_INIT_DATA", "MOD_INIT_RODATA"};
    for (int i = 0; i < 7; ++i) btf__add_enum_value(b, types[i], i);
    area = btf__add_struct(b, "module_memory", 72);
    btf__add_field(b, "base", vp, 0, 0);
    btf__add_field(b, "size", u32, 64, 0);
    areas = btf__add_array(b, u32, area, 7);
  } else {
    area = btf__add_struct(b, "module_layout", 80);
    btf__add_field(b, "base", vp, 0, 0);
    btf__add_field(b, "size", u32, 64, 0);
    btf__add_field(b, "text_size", u32, 96, 0);
    btf__add_field(b, "ro_size", u32, 128, 0);
  }
  // struct elf64_sym (24 bytes) and struct mod_kallsyms, as in include/linux/module.h.
  const int u16 = btf__add_int(b, "short unsigned int", 2, 0);
  const int u64 = btf__add_int(b, "long long unsigned int", 8, 0);
  const int u8 = btf__add_int(b, "unsigned char", 1, 0);
  const int esym = btf__add_struct(b, "elf64_sym", 24);
  btf__add_field(b, "st_name", u32, 0, 0);
  btf__add_field(b, "st_info", u8, 32, 0);
  btf__add_field(b, "st_other", u8, 40, 0);
  btf__add_field(b, "st_shndx", u16, 48, 0);
  btf__add_field(b, "st_value", u64, 64, 0);
  btf__add_field(b, "st_size", u64, 128, 0);
  const int esym_t = btf__add_typedef(b, "Elf64_Sym", esym);
  const int esym_p = btf__add_ptr(b, esym_t);
  const int cp = btf__add_ptr(b, chr);
  const int mk = btf__add_struct(b, "mod_kallsyms", 32);
  btf__add_field(b, "symtab", esym_p, 0, 0);
  btf__add_field(b, "num_symtab", u32, 64, 0);
  btf__add_field(b, "strtab", cp, 128, 0);
  btf__add_field(b, "typetab", cp, 192, 0);
  const int ip_p = btf__add_ptr(b, s32);
  const int orc_e = btf__add_struct(b, "orc_entry", 6);
  const int orc_p = btf__add_ptr(b, orc_e);
  const int arch = btf__add_struct(b, "mod_arch_specific", 24);
  btf__add_field(b, "num_orcs", u32, 0, 0);
  btf__add_field(b, "orc_unwind_ip", ip_p, 64, 0);
  btf__add_field(b, "orc_unwind", orc_p, 128, 0);
  btf__add_struct(b, "module", o.size);
  auto field = [&](const char* n, int type, std::uint32_t off) {
    if (drop != n) btf__add_field(b, n, type, off * 8, 0);
  };
  field("state", state, o.state);
  field("list", lh, o.list);
  field("name", name, o.name);
  field("num_exentries", u32, o.num_exentries);
  field("extable", vp, o.extable);
  if (o.mem) {
    field("mem", areas, o.text);
  } else {
    field("core_layout", area, o.text);
    field("init_layout", area, o.init_text);
  }
  field("noinstr_text_start", vp, o.noinstr);
  field("noinstr_text_size", u32, o.noinstr_size);
  field("jump_entries", vp, o.jump);
  field("num_jump_entries", u32, o.num_jump);
  field("kprobes_text_start", vp, o.kprobes);
  field("kprobes_text_size", u32, o.kprobes_size);
  field("num_static_call_sites", s32, o.num_sc);
  field("static_call_sites", vp, o.sc);
  field("core_kallsyms", mk, o.core_kallsyms);
  field("btf_data_size", u32, o.btf_size);
  field("btf_data", vp, o.btf_data);
  if (o.arch) field("arch", arch, o.arch);
  // struct btf { void *data; ...; u32 data_size; ... } and struct btf_module (libbpf adds fields
  // to the type added last: the types they use come first).
  if (drop != "struct btf") {
    const int u32_t = btf__add_typedef(b, "u32", u32);
    const int mod_p = btf__add_ptr(b, btf__find_by_name_kind(b, "module", BTF_KIND_STRUCT));
    const int bt = btf__add_struct(b, "btf", o.btf_struct ? o.btf_struct : 208);
    btf__add_field(b, "data", vp, kBtfData * 8, 0);
    btf__add_field(b, "data_size", u32_t, kBtfDataSize * 8, 0);
    const int bt_p = btf__add_ptr(b, bt);
    if (drop != "struct btf_module") {
      btf__add_struct(b, "btf_module", kBtfModuleSize);
      btf__add_field(b, "list", lh, 0, 0);
      btf__add_field(b, "module", mod_p, kBtfModuleModule * 8, 0);
      btf__add_field(b, "btf", bt_p, kBtfModuleBtf * 8, 0);
      btf__add_field(b, "sysfs_attr", vp, 32 * 8, 0);
      btf__add_field(b, "flags", s32, 40 * 8, 0);
    }
  }
  std::uint32_t n = 0;
  auto* raw = static_cast<const std::byte*>(btf__raw_data(b, &n));
  std::vector<std::byte> out(raw, raw + n);
  btf__free(b);
  return out;
}

}  // namespace xenprobes::testing

// struct module's layout from the guest's BTF, through libbpf (modules.hpp says why nothing
// of it is compiled in).
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "kernel/btf.hpp"
#include "kernel/modules_internal.hpp"

namespace xenprobes::kernel {
namespace {

// ---- struct module's layout from BTF

constexpr int kMaxAnonDepth = 8;                       // nesting of anonymous structs/unions searched
constexpr std::size_t kMaxMembersSearched = 1u << 16;  // members looked at by one search

struct BtfDeleter {
  void operator()(btf* b) const { btf__free(b); }
};
using BtfPtr = std::unique_ptr<btf, BtfDeleter>;

// The type behind typedefs and qualifiers (bounded: a hostile BTF could loop, though libbpf's
// parse rejects most such).
const btf_type* resolve(const btf* b, std::uint32_t id, std::uint32_t* out_id = nullptr) {
  for (int i = 0; i < 32; ++i) {
    const btf_type* t = btf__type_by_id(b, id);
    if (!t) return nullptr;
    if (!(btf_is_typedef(t) || btf_is_const(t) || btf_is_volatile(t) || btf_is_restrict(t) || btf_is_type_tag(t))) {
      if (out_id) *out_id = id;
      return t;
    }
    id = t->type;
  }
  return nullptr;
}

struct Member {
  std::uint64_t bit_offset = 0;
  std::uint32_t type_id = 0;
  std::uint32_t bitfield = 0;
};

// One search for a member: the anonymous types already searched (a name absent from a type
// at one offset is absent at every other) and the members left to look at. Without them a
// hostile BTF nesting N anonymous members of one type in another, 8 deep, costs N^8.
struct MemberSearch {
  std::set<std::uint32_t> searched;
  std::size_t budget = kMaxMembersSearched;
};

std::optional<Member> find_member_in(const btf* b, std::uint32_t composite_id, std::string_view name,
                                     std::uint64_t bit_base, int depth, MemberSearch& search) {
  std::uint32_t id = 0;
  const btf_type* t = resolve(b, composite_id, &id);
  if (!t || !btf_is_composite(t) || !search.searched.insert(id).second) return std::nullopt;
  const btf_member* m = btf_members(t);
  for (std::uint16_t i = 0; i < btf_vlen(t); ++i) {
    if (search.budget == 0) return std::nullopt;
    --search.budget;
    const char* n = btf__name_by_offset(b, m[i].name_off);
    const std::uint64_t off = bit_base + btf_member_bit_offset(t, i);
    if (n && *n && name == n) return Member{off, m[i].type, btf_member_bitfield_size(t, i)};
    if ((!n || !*n) && depth < kMaxAnonDepth)
      if (auto r = find_member_in(b, m[i].type, name, off, depth + 1, search)) return r;
  }
  return std::nullopt;
}

// A member by name, searching anonymous struct/union members too.
std::optional<Member> find_member(const btf* b, std::uint32_t composite_id, std::string_view name) {
  MemberSearch search;
  return find_member_in(b, composite_id, name, 0, 0, search);
}

Result<std::uint32_t> byte_offset(const Member& m, std::string_view name) {
  if (m.bitfield != 0 || m.bit_offset % 8 != 0 || m.bit_offset / 8 > kMaxStructBytes)
    return fail(Errc::InvalidArgument, "struct module's " + std::string(name) + " is a bitfield or misplaced");
  return static_cast<std::uint32_t>(m.bit_offset / 8);
}

// An integer, enum or pointer member of `composite_id` at `base` bytes into struct module.
Result<std::optional<Field>> scalar(const btf* b, std::uint32_t composite_id, std::string_view name, std::uint32_t base,
                                    bool required) {
  auto m = find_member(b, composite_id, name);
  if (!m) {
    if (required)
      return fail(Errc::NotFound, "the guest's BTF has no member " + std::string(name) + " in struct module");
    return std::optional<Field>{};
  }
  const std::uint32_t off = base + XP_TRY(byte_offset(*m, name));
  const btf_type* t = resolve(b, m->type_id);
  if (!t || !(btf_is_int(t) || btf_is_any_enum(t) || btf_is_ptr(t)))
    return fail(Errc::InvalidArgument, "struct module's " + std::string(name) + " is not an integer or a pointer");
  const std::uint32_t size = btf_is_ptr(t) ? 8 : t->size;
  if (size != 1 && size != 2 && size != 4 && size != 8)
    return fail(Errc::InvalidArgument,
                "struct module's " + std::string(name) + " is " + std::to_string(size) + " bytes");
  return std::optional<Field>{Field{off, size}};
}

// The value of enumerator `name` in enum `enum_name`.
Result<std::int64_t> enum_value(const btf* b, const char* enum_name, std::string_view name) {
  for (int kind : {int{BTF_KIND_ENUM}, int{BTF_KIND_ENUM64}}) {
    const int id = btf__find_by_name_kind(b, enum_name, kind);
    if (id <= 0) continue;
    const btf_type* t = btf__type_by_id(b, static_cast<std::uint32_t>(id));
    for (std::uint16_t i = 0; t && i < btf_vlen(t); ++i) {
      if (btf_is_enum(t)) {
        const struct btf_enum* e = btf_enum(t) + i;
        if (const char* n = btf__name_by_offset(b, e->name_off); n && name == n) return std::int64_t{e->val};
      } else {
        const struct btf_enum64* e = btf_enum64(t) + i;
        if (const char* n = btf__name_by_offset(b, e->name_off); n && name == n)
          return static_cast<std::int64_t>(btf_enum64_value(e));
      }
    }
  }
  return fail(Errc::NotFound, "the guest's BTF has no " + std::string(name) + " in enum " + enum_name);
}

// base and text size of one text area: a module_layout (base, text_size) or a module_memory
// (base, size) at `at` bytes into struct module.
Result<std::pair<Field, Field>> text_area(const btf* b, std::uint32_t type_id, std::uint32_t at,
                                          const char* size_name) {
  auto base = XP_TRY(scalar(b, type_id, "base", at, true));
  auto size = XP_TRY(scalar(b, type_id, size_name, at, true));
  return std::pair{*base, *size};
}

}  // namespace

std::string ModuleLayout::describe() const {
  std::string s = "struct module " + std::to_string(struct_size) + " bytes, " +
                  (mem_array ? "mem[MOD_TEXT]" : "core_layout") + " text at +" + std::to_string(core_base.offset) +
                  ", list at +" + std::to_string(list.offset) + ", extable at +" + std::to_string(extable.offset);
  if (!jump_entries.size) s += ", no jump labels";
  if (!static_call_sites.size) s += ", no static calls";
  if (!kprobes_text_start) s += ", no .kprobes.text";
  if (!noinstr_text_start) s += ", no .noinstr.text";
  if (ksym_symtab) s += ", core_kallsyms at +" + std::to_string(ksym_symtab->offset);
  else s += ", no core_kallsyms";
  if (btf_data) s += ", btf_data at +" + std::to_string(btf_data->offset);
  else s += ", no module BTF";
  if (orc_ip) s += ", arch.orc_unwind_ip at +" + std::to_string(orc_ip->offset);
  else s += ", no module ORC tables";
  return s;
}

Result<ModuleLayout> module_layout_from_btf(std::span<const std::byte> blob) {
  if (blob.size() < sizeof(btf_header) || blob.size() > kMaxKernelBtfBytes)
    return fail(Errc::Io, "the BTF is " + std::to_string(blob.size()) + " bytes: no header, or beyond the limit");
  errno = 0;
  btf* raw = btf__new(blob.data(), static_cast<__u32>(blob.size()));
  // NULL, or (libbpf's old mode) an error pointer: not an object to free either way.
  if (int err = static_cast<int>(libbpf_get_error(raw)); err != 0 || !raw)
    return fail(Errc::Io, std::string("libbpf rejects the guest kernel's BTF: ") + std::strerror(err ? -err : errno));
  BtfPtr b(raw);
  const btf* bt = b.get();
  const int mid = btf__find_by_name_kind(bt, "module", BTF_KIND_STRUCT);
  if (mid <= 0) return fail(Errc::NotFound, "the guest's BTF has no struct module (a kernel without modules?)");
  const auto id = static_cast<std::uint32_t>(mid);
  ModuleLayout l;
  l.struct_size = btf__type_by_id(bt, id)->size;
  if (l.struct_size == 0 || l.struct_size > kMaxStructBytes)
    return fail(Errc::InvalidArgument, "struct module is " + std::to_string(l.struct_size) + " bytes");

  l.state = *XP_TRY(scalar(bt, id, "state", 0, true));
  auto list = find_member(bt, id, "list");
  auto name = find_member(bt, id, "name");
  if (!list || !name) return fail(Errc::NotFound, "the guest's BTF has no list or name in struct module");
  l.list = {XP_TRY(byte_offset(*list, "list")), 16};
  if (btf__resolve_size(bt, list->type_id) != 16)
    return fail(Errc::InvalidArgument, "struct module's list is no struct list_head");
  const btf_type* nt = resolve(bt, name->type_id);
  const __s64 name_len = btf__resolve_size(bt, name->type_id);
  if (!nt || !btf_is_array(nt) || name_len < 2 || name_len > 256)
    return fail(Errc::InvalidArgument, "struct module's name is no char array of a sane size");
  l.name = {XP_TRY(byte_offset(*name, "name")), static_cast<std::uint32_t>(name_len)};

  if (auto mem = find_member(bt, id, "mem")) {
    // 6.4+: struct module_memory mem[MOD_MEM_NUM_TYPES], indexed by enum mod_mem_type.
    l.mem_array = true;
    const std::uint32_t at = XP_TRY(byte_offset(*mem, "mem"));
    const btf_type* at_t = resolve(bt, mem->type_id);
    if (!at_t || !btf_is_array(at_t)) return fail(Errc::InvalidArgument, "struct module's mem is no array");
    const struct btf_array* arr = btf_array(at_t);
    const __s64 esize = btf__resolve_size(bt, arr->type);
    if (esize <= 0 || esize > kMaxStructBytes)
      return fail(Errc::InvalidArgument, "struct module_memory has no sane size");
    const std::int64_t text = XP_TRY(enum_value(bt, "mod_mem_type", "MOD_TEXT"));
    const std::int64_t init = XP_TRY(enum_value(bt, "mod_mem_type", "MOD_INIT_TEXT"));
    if (text < 0 || init < 0 || text >= arr->nelems || init >= arr->nelems)
      return fail(Errc::InvalidArgument, "MOD_TEXT or MOD_INIT_TEXT is outside struct module's mem[]");
    std::tie(l.core_base, l.core_text_size) =
        XP_TRY(text_area(bt, arr->type, at + static_cast<std::uint32_t>(text * esize), "size"));
    std::tie(l.init_base, l.init_text_size) =
        XP_TRY(text_area(bt, arr->type, at + static_cast<std::uint32_t>(init * esize), "size"));
  } else {
    // Up to 6.3: struct module_layout core_layout, init_layout.
    auto core = find_member(bt, id, "core_layout");
    auto init = find_member(bt, id, "init_layout");
    if (!core || !init)
      return fail(Errc::NotFound, "the guest's BTF has neither mem[] nor core_layout/init_layout in struct module");
    std::tie(l.core_base, l.core_text_size) =
        XP_TRY(text_area(bt, core->type_id, XP_TRY(byte_offset(*core, "core_layout")), "text_size"));
    std::tie(l.init_base, l.init_text_size) =
        XP_TRY(text_area(bt, init->type_id, XP_TRY(byte_offset(*init, "init_layout")), "text_size"));
  }
  if (l.core_base.size != 8 || l.init_base.size != 8)
    return fail(Errc::InvalidArgument, "a module text base is no pointer");

  // Tables: a member the kernel was built without (no CONFIG_JUMP_LABEL, …) means no such
  // sites at all; a pointer without its count (or the reverse) is a layout we do not know.
  auto pair = [&](const char* ptr, const char* count, Field& p, Field& n, bool required) -> Result<void> {
    auto a = XP_TRY(scalar(bt, id, ptr, 0, required));
    auto c = XP_TRY(scalar(bt, id, count, 0, required));
    if (a.has_value() != c.has_value())
      return fail(Errc::InvalidArgument,
                  std::string("struct module has ") + (a ? ptr : count) + " without " + (a ? count : ptr));
    if (a) {
      if (a->size != 8) return fail(Errc::InvalidArgument, std::string("struct module's ") + ptr + " is no pointer");
      p = *a;
      n = *c;
    }
    return {};
  };
  XP_TRY(pair("extable", "num_exentries", l.extable, l.num_exentries, true));
  XP_TRY(pair("jump_entries", "num_jump_entries", l.jump_entries, l.num_jump_entries, false));
  XP_TRY(pair("static_call_sites", "num_static_call_sites", l.static_call_sites, l.num_static_call_sites, false));
  Field p, n;
  if (auto a = XP_TRY(scalar(bt, id, "kprobes_text_start", 0, false))) {
    XP_TRY(pair("kprobes_text_start", "kprobes_text_size", p, n, true));
    l.kprobes_text_start = p;
    l.kprobes_text_size = n;
  }
  if (auto a = XP_TRY(scalar(bt, id, "noinstr_text_start", 0, false))) {
    XP_TRY(pair("noinstr_text_start", "noinstr_text_size", p, n, true));
    l.noinstr_text_start = p;
    l.noinstr_text_size = n;
  }
  // core_kallsyms: struct mod_kallsyms { Elf_Sym *symtab; unsigned int num_symtab; char *strtab;
  // char *typetab; } (include/linux/module.h, 6.1 and 6.12), found by name, never assumed.
  if (auto ck = find_member(bt, id, "core_kallsyms")) {
    const std::uint32_t at = XP_TRY(byte_offset(*ck, "core_kallsyms"));
    auto sym = XP_TRY(scalar(bt, ck->type_id, "symtab", at, false));
    auto num = XP_TRY(scalar(bt, ck->type_id, "num_symtab", at, false));
    auto str = XP_TRY(scalar(bt, ck->type_id, "strtab", at, false));
    auto typ = XP_TRY(scalar(bt, ck->type_id, "typetab", at, false));
    // The symtab must point at ELF64 symbols (24 bytes, the ELF ABI's Elf64_Sym).
    auto sm = find_member(bt, ck->type_id, "symtab");
    const btf_type* pt = sm ? resolve(bt, sm->type_id) : nullptr;
    const bool elf64 = pt && btf_is_ptr(pt) && btf__resolve_size(bt, pt->type) == 24;
    if (sym && num && str && typ && elf64 && sym->size == 8 && str->size == 8 && typ->size == 8) {
      l.ksym_symtab = sym;
      l.ksym_num_symtab = num;
      l.ksym_strtab = str;
      l.ksym_typetab = typ;
    }
  }
  {
    auto data = XP_TRY(scalar(bt, id, "btf_data", 0, false));
    auto size = XP_TRY(scalar(bt, id, "btf_data_size", 0, false));
    if (data && size && data->size == 8) {
      l.btf_data = data;
      l.btf_data_size = size;
    }
  }
  // arch: struct mod_arch_specific { unsigned int num_orcs; int *orc_unwind_ip; struct orc_entry
  // *orc_unwind; ... } with CONFIG_UNWINDER_ORC (arch/x86/include/asm/module.h, 6.1 and 6.12).
  if (auto arch = find_member(bt, id, "arch")) {
    const std::uint32_t at = XP_TRY(byte_offset(*arch, "arch"));
    auto num = XP_TRY(scalar(bt, arch->type_id, "num_orcs", at, false));
    auto ip = XP_TRY(scalar(bt, arch->type_id, "orc_unwind_ip", at, false));
    auto orc = XP_TRY(scalar(bt, arch->type_id, "orc_unwind", at, false));
    if (num && ip && orc && ip->size == 8 && orc->size == 8) {
      l.orc_num = num;
      l.orc_ip = ip;
      l.orc_unwind = orc;
    }
  }
  l.state_live = static_cast<std::uint64_t>(XP_TRY(enum_value(bt, "module_state", "MODULE_STATE_LIVE")));
  l.state_coming = static_cast<std::uint64_t>(XP_TRY(enum_value(bt, "module_state", "MODULE_STATE_COMING")));
  l.state_going = static_cast<std::uint64_t>(XP_TRY(enum_value(bt, "module_state", "MODULE_STATE_GOING")));
  l.state_unformed = static_cast<std::uint64_t>(XP_TRY(enum_value(bt, "module_state", "MODULE_STATE_UNFORMED")));

  if (auto why = layout_error(l)) return fail(Errc::InvalidArgument, *why);
  return l;
}

}  // namespace xenprobes::kernel

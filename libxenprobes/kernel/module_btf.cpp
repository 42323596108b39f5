// Loaded modules' BTF, read from the guest: the kernel's btf_modules list, struct module's
// btf_data, libbpf's check (module_btf.hpp).
#include "kernel/module_btf.hpp"

#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include <cerrno>
#include <cstring>
#include <linux/btf.h>
#include <memory>
#include <set>
#include <string>

#include "common/bytes.hpp"
#include "common/hex.hpp"
#include "common/log.hpp"
#include "kernel/btf.hpp"
#include "kernel/module_symbols.hpp"
#include "kernel/modules_internal.hpp"
#include "shared/btf_split.hpp"

namespace xenprobes::kernel {
namespace {

constexpr std::uint32_t kMaxListStructBytes = 4096;  // struct btf_module is 48 bytes, struct btf ~232
constexpr std::uint64_t kBtfHeaderBytes = sizeof(btf_header);

struct BtfFree {
  void operator()(btf* b) const { btf__free(b); }
};
using BtfPtr = std::unique_ptr<btf, BtfFree>;

// A top-level member of struct `sid` by name: its byte offset and the type behind typedefs and
// qualifiers. Bitfields and members off a byte boundary are no member here.
struct MemberAt {
  std::uint32_t offset = 0;
  const btf_type* type = nullptr;
};
std::optional<MemberAt> member(const btf* b, std::uint32_t sid, const char* name) {
  const btf_type* t = btf__type_by_id(b, sid);
  const btf_member* m = btf_members(t);
  for (std::uint16_t i = 0; i < btf_vlen(t); ++i) {
    const char* n = btf__name_by_offset(b, m[i].name_off);
    if (!n || std::strcmp(n, name) != 0) continue;
    const std::uint32_t bits = btf_member_bit_offset(t, i);
    if (btf_member_bitfield_size(t, i) != 0 || bits % 8 != 0) return std::nullopt;
    const int rid = btf__resolve_type(b, m[i].type);
    return MemberAt{bits / 8, rid < 0 ? nullptr : btf__type_by_id(b, static_cast<std::uint32_t>(rid))};
  }
  return std::nullopt;
}

// A pointer member of struct `what` (id `sid`) at its offset; `list_head`: a 16-byte struct.
Result<std::uint32_t> pointer_member(const btf* b, std::uint32_t sid, const char* what, const char* name) {
  auto m = member(b, sid, name);
  if (!m) return fail(Errc::NotFound, std::string("the guest's BTF has no member ") + name + " in struct " + what);
  if (!m->type || !btf_is_ptr(m->type))
    return fail(Errc::InvalidArgument, std::string("struct ") + what + "'s " + name + " is no pointer");
  return m->offset;
}

std::uint64_t u64_at(const std::vector<std::byte>& s, std::uint32_t off) { return load<std::uint64_t>(&s[off]); }

std::uint64_t field_at(const std::vector<std::byte>& s, Field f) {
  switch (f.size) {
    case 1: return load<std::uint8_t>(&s[f.offset]);
    case 2: return load<std::uint16_t>(&s[f.offset]);
    case 4: return load<std::uint32_t>(&s[f.offset]);
    default: return load<std::uint64_t>(&s[f.offset]);
  }
}

}  // namespace

std::string BtfListLayout::describe() const {
  std::string s = "struct btf_module " + std::to_string(entry_size) + " bytes (list +" + std::to_string(list) +
                  ", module +" + std::to_string(module) + ", btf +" + std::to_string(btf) + ")";
  if (assumed) s += " not in the kernel's BTF: Linux's shape taken";
  s += ", struct btf's data at +" + std::to_string(data.offset) + " and data_size at +" +
       std::to_string(data_size.offset);
  return s;
}

Result<BtfListLayout> btf_list_layout_from_btf(std::span<const std::byte> blob) {
  if (blob.size() < kBtfHeaderBytes || blob.size() > kMaxKernelBtfBytes)
    return fail(Errc::Io, "the BTF is " + std::to_string(blob.size()) + " bytes: no header, or beyond the limit");
  errno = 0;
  btf* raw = btf__new(blob.data(), static_cast<__u32>(blob.size()));
  // NULL, or (libbpf's old mode) an error pointer: not an object to free either way.
  if (int err = static_cast<int>(libbpf_get_error(raw)); err != 0 || !raw)
    return fail(Errc::Io, std::string("libbpf rejects the guest kernel's BTF: ") + std::strerror(err ? -err : errno));
  BtfPtr owner(raw);
  const btf* b = owner.get();
  BtfListLayout l;

  const int bid = btf__find_by_name_kind(b, "btf", BTF_KIND_STRUCT);
  if (bid <= 0)
    return fail(Errc::NotFound,
                "the guest's BTF has no struct btf (where the kernel keeps a module's BTF): the btf_modules list "
                "cannot be read");
  const auto b_id = static_cast<std::uint32_t>(bid);
  l.btf_struct_size = btf__type_by_id(b, b_id)->size;
  l.data = {XP_TRY(pointer_member(b, b_id, "btf", "data")), 8};
  auto ds = member(b, b_id, "data_size");
  if (!ds) return fail(Errc::NotFound, "the guest's BTF has no member data_size in struct btf");
  if (!ds->type || !btf_is_int(ds->type) || (ds->type->size != 4 && ds->type->size != 8))
    return fail(Errc::InvalidArgument, "struct btf's data_size is no 4- or 8-byte integer");
  l.data_size = {ds->offset, ds->type->size};

  const int mid = btf__find_by_name_kind(b, "btf_module", BTF_KIND_STRUCT);
  if (mid > 0) {
    const auto m_id = static_cast<std::uint32_t>(mid);
    l.entry_size = btf__type_by_id(b, m_id)->size;
    auto list = member(b, m_id, "list");
    if (!list) return fail(Errc::NotFound, "the guest's BTF has no member list in struct btf_module");
    if (!list->type || !btf_is_struct(list->type) || list->type->size != 16)
      return fail(Errc::InvalidArgument, "struct btf_module's list is no struct list_head");
    l.list = list->offset;
    l.module = XP_TRY(pointer_member(b, m_id, "btf_module", "module"));
    l.btf = XP_TRY(pointer_member(b, m_id, "btf_module", "btf"));
  } else {
    // kernel/bpf/btf.c since 5.11: list_head, struct module *, struct btf *, ...
    l.assumed = true;
    l.list = 0;
    l.module = 16;
    l.btf = 24;
    l.entry_size = 32;
  }
  for (auto [at, n, size, what] :
       {std::tuple{l.list, 16u, l.entry_size, "struct btf_module's list"},
        std::tuple{l.module, 8u, l.entry_size, "struct btf_module's module"},
        std::tuple{l.btf, 8u, l.entry_size, "struct btf_module's btf"},
        std::tuple{l.data.offset, 8u, l.btf_struct_size, "struct btf's data"},
        std::tuple{l.data_size.offset, l.data_size.size, l.btf_struct_size, "struct btf's data_size"}}) {
    if (size == 0 || size > kMaxListStructBytes || std::uint64_t{at} + n > size)
      return fail(Errc::InvalidArgument, std::string(what) + " at +" + std::to_string(at) +
                                             " lies outside its struct of " + std::to_string(size) + " bytes");
  }
  return l;
}

const BtfListEntry* BtfModuleList::entry_for(std::uint64_t module) const {
  for (const BtfListEntry& e : entries)
    if (e.module == module) return &e;
  return nullptr;
}

BtfModuleList read_btf_module_list(const symbols::SymbolTable& syms, const ReadFn& read, const BtfListLayout& l,
                                   std::span<const Module> modules, const BtfListLimits& limits) {
  BtfModuleList out;
  auto head = syms.lookup("btf_modules");
  if (!head || head->empty()) {
    out.why = "no btf_modules in " + syms.source() +
              " (a kernel without CONFIG_DEBUG_INFO_BTF_MODULES, or symbols without static data: KALLSYMS_ALL)";
    return out;
  }
  if (head->size() != 1) {
    out.why = "btf_modules is at several addresses in " + syms.source();
    return out;
  }
  const std::uint64_t h = head->front().address.value;
  std::byte hb[16];
  if (auto r = read(Gva{h}, hb); !r) {
    out.why = "cannot read its head at " + hex(h) + ": " + r.error().what;
    return out;
  }
  out.read = true;
  std::map<std::uint64_t, std::string> names;  // struct module -> its name
  for (const Module& m : modules) names.emplace(m.address, m.name);
  std::set<std::uint64_t> seen, named;
  std::vector<std::byte> s(l.entry_size), b(l.btf_struct_size);
  std::uint64_t node = load<std::uint64_t>(hb), prev = h;
  while (node != h) {
    if (node < symbols::kKernelHalfStart || node % 8 != 0 || node < l.list) {
      out.why = "a node outside the kernel's half or not 8-byte aligned (" + hex(node) + ")";
      break;
    }
    if (!seen.insert(node).second) {
      out.why = "the list loops without returning to its head";
      break;
    }
    if (seen.size() > limits.max_entries) {
      out.why = "more than " + std::to_string(limits.max_entries) + " entries";
      break;
    }
    const std::uint64_t at = node - l.list;
    if (auto r = read(Gva{at}, s); !r) {
      out.why = "cannot read the struct btf_module at " + hex(at) + ": " + r.error().what;
      break;
    }
    if (u64_at(s, l.list + 8) != prev) {
      out.why = "the node at " + hex(node) + " does not point back at its predecessor";
      break;
    }
    ++out.nodes;
    prev = node;
    node = u64_at(s, l.list);

    BtfListEntry e{at, u64_at(s, l.module), u64_at(s, l.btf), 0, 0};
    const auto name = names.find(e.module);
    const std::string entry = "the entry at " + hex(at);
    if (name == names.end()) {
      out.stray.push_back(entry + ": its module pointer " + hex(e.module) + " is no module on the module list");
      continue;
    }
    if (!named.insert(e.module).second) {
      out.stray.push_back(entry + ": a second entry for module " + name->second + " (the first one counts)");
      continue;
    }
    auto refuse = [&](std::string why) { out.refused.emplace(e.module, entry + ": " + std::move(why)); };
    if (!in_kernel_half(e.btf, b.size())) {
      refuse("its struct btf pointer " + hex(e.btf) + " is outside the kernel's half");
      continue;
    }
    if (auto r = read(Gva{e.btf}, b); !r) {
      refuse("cannot read its struct btf at " + hex(e.btf) + ": " + r.error().what);
      continue;
    }
    e.data = u64_at(b, l.data.offset);
    e.size = field_at(b, l.data_size);
    if (e.size < kBtfHeaderBytes || e.size > limits.max_bytes) {
      refuse("its BTF's data_size " + std::to_string(e.size) + " is not between a BTF header's " +
             std::to_string(kBtfHeaderBytes) + " bytes and the limit of " + std::to_string(limits.max_bytes));
      continue;
    }
    if (!in_kernel_half(e.data, e.size)) {
      refuse("its BTF's data " + hex(e.data) + " is outside the kernel's half");
      continue;
    }
    std::byte hdr[4];
    if (auto r = read(Gva{e.data}, hdr); !r) {
      refuse("cannot read its BTF at " + hex(e.data) + ": " + r.error().what);
      continue;
    }
    const auto magic = load<std::uint16_t>(hdr);
    const auto version = static_cast<std::uint8_t>(hdr[2]);
    if (magic != BTF_MAGIC || version != BTF_VERSION) {
      refuse("its BTF at " + hex(e.data) + " starts with magic " + hex(magic) + " version " + std::to_string(version) +
             ", not BTF's " + hex(BTF_MAGIC) + " version " + std::to_string(BTF_VERSION));
      continue;
    }
    out.entries.push_back(e);
  }
  return out;
}

Result<std::uint32_t> validate_split_btf(std::span<const std::byte> blob, std::span<const std::byte> base) {
  if (blob.size() < kBtfHeaderBytes || base.size() < kBtfHeaderBytes)
    return fail(Errc::Io, "the module's BTF is " + std::to_string(blob.size()) + " bytes, shorter than its header");
  errno = 0;
  btf* raw = btf__new(base.data(), static_cast<__u32>(base.size()));
  // NULL, or (libbpf's old mode) an error pointer: not an object to free either way.
  if (!raw || libbpf_get_error(raw)) return fail(Errc::Io, "libbpf rejects the kernel's BTF the module's builds on");
  BtfPtr b(raw);
  BtfPtr s(xp_shared::btf_new_split(blob, b.get()));
  if (!s)
    return fail(Errc::Io, std::string("libbpf rejects the module's BTF as split BTF over the kernel's: ") +
                              std::strerror(errno ? errno : EINVAL));
  return btf__type_cnt(s.get()) - btf__type_cnt(b.get());
}

Result<std::vector<std::byte>> read_listed_btf(const ReadFn& read, const BtfListEntry& e,
                                               std::span<const std::byte> base) {
  auto blob = XP_TRY(read_all(read, e.data, e.size, 1u << 20, "BTF"));
  XP_TRY(validate_split_btf(blob, base));
  return blob;
}

Result<std::vector<std::byte>> read_module_btf(const ReadFn& read, const Module& m, std::span<const std::byte> base,
                                               std::uint64_t max_bytes) {
  if (!m.usable) return fail(Errc::InvalidArgument, "it is kept out: " + m.why);
  if (m.btf_data == 0 || m.btf_size == 0)
    return fail(Errc::NotFound,
                "its struct module's btf_data is NULL (Linux 5.11 and later clear it once the "
                "module's init ran)");
  if (m.btf_size > max_bytes)
    return fail(Errc::InvalidArgument, "its btf_data_size " + std::to_string(m.btf_size) +
                                           " is more than the limit of " + std::to_string(max_bytes) + " bytes");
  if (!in_kernel_half(m.btf_data, m.btf_size))
    return fail(Errc::InvalidArgument, "its btf_data " + hex(m.btf_data) + " is outside the kernel's half");
  auto blob = XP_TRY(read_all(read, m.btf_data, m.btf_size, 1u << 20, "BTF"));
  XP_TRY(validate_split_btf(blob, base));
  return blob;
}

Result<std::vector<std::byte>> module_btf_of(const ReadFn& read, const Module& m, const BtfModuleList& list,
                                             std::span<const std::byte> base) {
  if (!m.usable) return fail(Errc::InvalidArgument, "it is kept out: " + m.why);
  // Why the list gave nothing, for the message when btf_data gives nothing either.
  std::string from_list;
  if (const BtfListEntry* e = list.entry_for(m.address)) {
    auto blob = read_listed_btf(read, *e, base);
    if (blob) {
      XP_LOG(Debug, "guest module %s: its BTF (%zu bytes) from the kernel's btf_modules list", m.name.c_str(),
             blob->size());
      return blob;
    }
    from_list = "its BTF in the kernel's btf_modules list (" + hex(e->data) + ", " + std::to_string(e->size) +
                " bytes) is refused: " + blob.error().what;
    if (m.btf_data == 0) return fail(blob.error().code, from_list);
  } else if (auto r = list.refused.find(m.address); r != list.refused.end()) {
    from_list = "its entry in the kernel's btf_modules list is refused: " + r->second;
    if (m.btf_data == 0) return fail(Errc::InvalidArgument, from_list);
  } else if (!list.read) {
    from_list = "the kernel's btf_modules list is not read: " + list.why;
  } else {
    from_list = "the kernel's btf_modules list has no entry for it";
    if (!list.why.empty())
      from_list += " among the " + std::to_string(list.nodes) + " read (its walk stopped: " + list.why + ")";
    else from_list += " (the module was built without BTF, or the kernel refused its BTF when it loaded it)";
    if (!list.stray.empty())
      from_list +=
          "; " + std::to_string(list.stray.size()) + " of its entries are left out, the first: " + list.stray[0];
  }
  if (m.btf_data == 0)
    return fail(Errc::NotFound, "it has no BTF: " + from_list +
                                    ", and its struct module's btf_data is NULL (Linux 5.11 and later clear it once "
                                    "the module's init ran)");
  auto blob = read_module_btf(read, m, base);
  if (blob) {
    XP_LOG(Debug, "guest module %s: its BTF (%zu bytes) from its struct module's btf_data", m.name.c_str(),
           blob->size());
    return blob;
  }
  return fail(blob.error().code, blob.error().what + "; " + from_list);
}

Result<std::vector<ModuleBtfBlob>> read_guest_module_btf(const symbols::SymbolTable& syms, const ReadFn& read) {
  const auto btf = XP_TRY(read_kernel_btf(syms, read));
  const auto mods = XP_TRY(walk_modules(syms, read, btf));
  BtfModuleList list;
  if (auto layout = btf_list_layout_from_btf(btf)) {
    XP_LOG(Debug, "guest btf_modules: %s", layout->describe().c_str());
    list = read_btf_module_list(syms, read, *layout, mods.modules());
  } else {
    list.why = layout.error().what;
  }
  if (!list.read) XP_LOG(Info, "guest btf_modules list not read: %s", list.why.c_str());
  else if (!list.why.empty()) XP_LOG(Warn, "guest btf_modules list read in part: %s", list.why.c_str());
  for (const std::string& s : list.stray) XP_LOG(Warn, "guest btf_modules list: %s (left out)", s.c_str());
  // A kernel built without CONFIG_DEBUG_INFO_BTF_MODULES has neither.
  const bool none = !list.read && !mods.layout().btf_data;
  std::vector<ModuleBtfBlob> out;
  for (const Module& m : mods.modules()) {
    if (!m.usable) continue;
    ModuleBtfBlob b{m.name, {}, {}};
    if (none)
      b.why =
          "the guest kernel keeps no module BTF: its struct module has no btf_data and the btf_modules list is "
          "not read (" +
          list.why + "): built without CONFIG_DEBUG_INFO_BTF_MODULES";
    else if (auto blob = module_btf_of(read, m, list, btf)) b.btf = std::move(*blob);
    else b.why = blob.error().what;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace xenprobes::kernel

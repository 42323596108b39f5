// Loaded modules' function symbols, read from the guest (module_symbols.hpp); their BTF is
// module_btf.cpp's.
#include "kernel/module_symbols.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/bytes.hpp"
#include "common/hex.hpp"
#include "common/log.hpp"
#include "kernel/btf.hpp"
#include "kernel/modules_internal.hpp"

namespace xenprobes::kernel {
namespace {

// Elf64_Sym (the ELF ABI; the layout's BTF check made sure symtab points at 24-byte entries).
constexpr std::size_t kSymSize = 24;
constexpr std::size_t kStName = 0, kStShndx = 6, kStValue = 8, kStSize = 16;
constexpr std::uint64_t kPage = 4096;

bool is_function_type(char c) { return c == 't' || c == 'T' || c == 'w' || c == 'W'; }

bool valid_symbol_char(char c) { return c > ' ' && c < 0x7f && c != ':'; }

// The strtab bytes [0, want) as far as they can be read: page by page, stopping at the first
// page that cannot be read (the strtab's end is not recorded, so a read past it may fail).
std::vector<std::byte> read_strtab(const ReadFn& read, std::uint64_t addr, std::uint64_t want) {
  std::vector<std::byte> out;
  std::uint64_t off = 0;
  while (off < want) {
    const std::uint64_t page_end = ((addr + off) | (kPage - 1)) + 1;
    const std::uint64_t n = std::min(want - off, page_end - (addr + off));
    out.resize(off + n);
    if (!read(Gva{addr + off}, std::span(out.data() + off, n))) {
      out.resize(off);
      break;
    }
    off += n;
  }
  return out;
}

}  // namespace

std::string ModuleSymbolStats::describe() const {
  std::string s = std::to_string(kept) + " functions kept";
  if (outside_text) s += ", " + std::to_string(outside_text) + " dropped outside their module's text";
  if (bad_name) s += ", " + std::to_string(bad_name) + " dropped with a bad name";
  if (strtab_out_of_bounds) s += ", " + std::to_string(strtab_out_of_bounds) + " dropped with a name out of strtab";
  return s;
}

Result<std::vector<symbols::ModuleFunction>> read_module_symbols(const ReadFn& read, const Module& m,
                                                                 ModuleSymbolStats& stats, std::size_t& budget,
                                                                 const ModuleSymbolLimits& limits) {
  if (!m.usable) return fail(Errc::InvalidArgument, "it is kept out: " + m.why);
  if (m.ksym_num == 0) return std::vector<symbols::ModuleFunction>{};
  if (m.ksym_num > limits.max_symbols)
    return fail(Errc::InvalidArgument, "its num_symtab " + std::to_string(m.ksym_num) + " is more than the limit of " +
                                           std::to_string(limits.max_symbols));
  if (m.ksym_num > budget)
    return fail(Errc::InvalidArgument, "its " + std::to_string(m.ksym_num) +
                                           " symbols pass the loaded modules' limit of " +
                                           std::to_string(limits.max_total) + " symbols in all");
  budget -= m.ksym_num;
  const std::uint64_t n = m.ksym_num;
  if (!in_kernel_half(m.ksym_symtab, n * kSymSize) || !in_kernel_half(m.ksym_typetab, n) ||
      !in_kernel_half(m.ksym_strtab, 1))
    return fail(Errc::InvalidArgument, "its symtab (" + hex(m.ksym_symtab) + "), strtab (" + hex(m.ksym_strtab) +
                                           ") or typetab (" + hex(m.ksym_typetab) + ") is outside the kernel's half");
  auto symtab = XP_TRY(read_all(read, m.ksym_symtab, n * kSymSize, limits.chunk_bytes, "symtab"));
  auto typetab = XP_TRY(read_all(read, m.ksym_typetab, n, limits.chunk_bytes, "typetab"));

  // Which symbols are functions, and how much strtab their names need.
  std::vector<std::size_t> candidates;
  std::uint64_t want = 0;
  for (std::size_t i = 1; i < n; ++i) {  // 0: ELF's null symbol
    const std::byte* e = symtab.data() + i * kSymSize;
    const char type = static_cast<char>(typetab[i]);
    if (load<std::uint16_t>(e + kStShndx) == 0 || !is_function_type(type)) {  // SHN_UNDEF, or not text
      ++stats.not_function;
      continue;
    }
    const std::uint64_t value = load<std::uint64_t>(e + kStValue);
    if (!m.text.contains(value)) {
      ++stats.outside_text;
      continue;
    }
    const std::uint64_t name = load<std::uint32_t>(e + kStName);
    if (name >= limits.max_strtab) {
      ++stats.strtab_out_of_bounds;
      continue;
    }
    want = std::max(want, std::min<std::uint64_t>(name + symbols::kMaxNameLen + 1, limits.max_strtab));
    candidates.push_back(i);
  }
  const std::vector<std::byte> strtab =
      candidates.empty() ? std::vector<std::byte>{} : read_strtab(read, m.ksym_strtab, want);

  std::vector<symbols::ModuleFunction> out;
  for (std::size_t i : candidates) {
    const std::byte* e = symtab.data() + i * kSymSize;
    const std::uint64_t name = load<std::uint32_t>(e + kStName);
    if (name >= strtab.size()) {
      ++stats.strtab_out_of_bounds;
      continue;
    }
    const char* p = reinterpret_cast<const char*>(strtab.data() + name);
    const std::size_t room = std::min<std::size_t>(strtab.size() - name, symbols::kMaxNameLen + 1);
    const std::size_t len = strnlen(p, room);
    const std::string_view nm(p, len);
    if (len == 0 || len == room || !std::all_of(nm.begin(), nm.end(), valid_symbol_char)) {
      ++stats.bad_name;
      continue;
    }
    const std::uint64_t value = load<std::uint64_t>(e + kStValue);
    std::uint64_t size = load<std::uint64_t>(e + kStSize);
    if (size == 0 || size > m.text.end - value) size = 0;  // unknown or past the text: from the neighbours
    out.push_back({m.name, std::string(nm), value, size, static_cast<char>(typetab[i])});
  }
  // A size the symtab did not give: up to the next function, or the text's end; one it gave is
  // cut there too (a hostile st_size must not make functions overlap).
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
  std::uint64_t next = m.text.end;  // the first start above the current group, walking down
  for (std::size_t i = out.size(); i-- > 0;) {
    if (i + 1 < out.size() && out[i + 1].start > out[i].start) next = out[i + 1].start;
    out[i].size = out[i].size ? std::min(out[i].size, next - out[i].start) : next - out[i].start;
  }
  stats.kept += out.size();
  return out;
}

ModuleSymbolsResult read_all_module_symbols(const ReadFn& read, const ModuleTables& mods,
                                            const ModuleSymbolLimits& limits) {
  ModuleSymbolsResult r;
  std::size_t budget = limits.max_total;
  for (const Module& m : mods.modules()) {
    if (!m.usable) continue;
    ModuleSymbolStats st;
    auto fs = read_module_symbols(read, m, st, budget, limits);
    if (!fs) {
      r.refused.push_back(m.name + ": " + fs.error().what);
      XP_LOG(Warn, "guest module %s: its symbols are not read: %s", m.name.c_str(), fs.error().what.c_str());
      continue;
    }
    if (st.bad()) XP_LOG(Warn, "guest module %s: %s", m.name.c_str(), st.describe().c_str());
    ++r.modules_read;
    r.stats.kept += st.kept;
    r.stats.not_function += st.not_function;
    r.stats.outside_text += st.outside_text;
    r.stats.bad_name += st.bad_name;
    r.stats.strtab_out_of_bounds += st.strtab_out_of_bounds;
    r.functions.insert(r.functions.end(), std::make_move_iterator(fs->begin()), std::make_move_iterator(fs->end()));
  }
  return r;
}

Result<ModuleTables> walk_modules(const symbols::SymbolTable& syms, const ReadFn& read,
                                  std::span<const std::byte> kernel_btf) {
  auto layout = XP_TRY(module_layout_from_btf(kernel_btf));
  Range core;
  auto a = syms.lookup("_stext");
  auto b = syms.lookup("_etext");
  if (a && b && a->size() == 1 && b->size() == 1 && a->front().address.value < b->front().address.value)
    core = {a->front().address.value, b->front().address.value};
  auto t = ModuleTables::read(syms, read, layout, core);
  if (!t.status().found) return fail(Errc::NotFound, "the guest's module list: " + t.status().why);
  return t;
}

Result<ModuleSymbolsResult> read_guest_module_symbols(const symbols::SymbolTable& syms, const ReadFn& read,
                                                      const ModuleSymbolLimits& limits) {
  const auto btf = XP_TRY(read_kernel_btf(syms, read));
  const auto mods = XP_TRY(walk_modules(syms, read, btf));
  return read_all_module_symbols(read, mods, limits);
}

}  // namespace xenprobes::kernel

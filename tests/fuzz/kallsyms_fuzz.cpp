// Fuzz target: the guest kernel's kallsyms tables (symbols/kallsyms.cpp) searched for and
// decoded in fuzzed guest memory, and a fuzzed BTF blob through the checks the library applies
// before handing a guest's BTF out (kernel/btf.cpp). Both come from a guest: hostile. And its
// loaded modules' kallsyms and split BTF (module_symbols_fuzz.hpp), and the kernel's btf_modules
// list that holds a module's BTF once its init ran (btf_modules_fuzz.hpp).
//
// Input: u32 n, then n bytes of BTF (at most the rest), then the guest memory: those bytes at
// kBase, every other address faults (the search must step over faults). When n has its top bit
// set (0x80000000 and up), the rest of the input is a loaded module's instead, in the format
// module_symbols_fuzz.hpp describes; with its two top bits set (0xc0000000 and up), a
// btf_modules list's, in the format btf_modules_fuzz.hpp describes.
//
// Invariants: the search never reads outside what it was given to search plus what the tables
// it found point to, and fails cleanly (NotFound or Io) or returns tables that agree: at most
// max_symbols entries, exactly kallsyms_num_syms of them, addresses sorted, every name 1..512
// printable characters, every table inside the memory given; a SymbolTable built from them
// parses. validate_btf() never crashes and counts at least one type when it accepts a blob.
#include "fuzz/btf_modules_fuzz.hpp"
#include "fuzz/fuzz_common.hpp"
#include "fuzz/module_symbols_fuzz.hpp"
#include "kernel/btf.hpp"
#include "symbols/kallsyms.hpp"

using namespace xenprobes;
using fuzz::Input;

namespace {

constexpr std::uint64_t kBase = 0xffffffff82000000ull;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  if (size > (1u << 20)) return 0;
  Input in(data, size);
  const std::uint32_t btf_len = in.u32();
  if (size >= 4 && (btf_len & 0xc0000000u) == 0xc0000000u) return fuzz::btf_modules::one_input(data + 4, size - 4);
  if (size >= 4 && (btf_len & 0x80000000u)) return fuzz::module_symbols::one_input(data + 4, size - 4);
  const std::size_t head = std::min<std::size_t>(4, size);
  const std::size_t blen = std::min<std::size_t>(btf_len, size - head);
  std::vector<std::byte> btf(reinterpret_cast<const std::byte*>(data + head),
                             reinterpret_cast<const std::byte*>(data + head + blen));
  const std::uint8_t* mem = data + head + blen;
  const std::size_t mem_len = size - head - blen;

  if (auto r = kernel::validate_btf(btf)) FUZZ_CHECK(*r >= 1, "an accepted BTF with no type");

  auto read = [&](std::uint64_t a, std::span<std::byte> out) -> Result<void> {
    if (a < kBase || a - kBase > mem_len || mem_len - (a - kBase) < out.size()) return fail(Errc::Fault, "unmapped");
    std::memcpy(out.data(), mem + (a - kBase), out.size());
    return {};
  };
  symbols::KallsymsLimits lim;
  lim.max_symbols = 4096;
  lim.chunk_bytes = 4096;
  auto r = symbols::find_kallsyms(read, kBase - 8192, kBase + mem_len + 8192, lim);
  if (!r) {
    FUZZ_CHECK(r.error().code == Errc::NotFound || r.error().code == Errc::Io || r.error().code == Errc::Fault,
               "unexpected error: " + r.error().what);
    FUZZ_CHECK(!r.error().what.empty());
    return 0;
  }
  FUZZ_CHECK(r->entries.size() == r->where.count, "entries != num_syms");
  FUZZ_CHECK(r->entries.size() <= lim.max_symbols);
  const auto inside = [&](std::uint64_t a) { return a >= kBase && a - kBase <= mem_len; };
  FUZZ_CHECK(inside(r->where.token_table) && inside(r->where.token_index) && inside(r->where.markers) &&
                 inside(r->where.names) && inside(r->where.num_syms) && inside(r->where.offsets) &&
                 inside(r->where.relative_base),
             "a table outside the memory given");
  for (std::size_t i = 0; i < r->entries.size(); ++i) {
    const auto& e = r->entries[i];
    FUZZ_CHECK(!e.name.empty() && e.name.size() <= symbols::kMaxNameLen, "bad name length");
    for (char c : e.name) FUZZ_CHECK(c > 0x20 && c < 0x7f, "unprintable name");
    FUZZ_CHECK(i == 0 || r->entries[i - 1].address <= e.address, "addresses not sorted");
  }
  auto t = symbols::to_symbol_table(r->entries, "fuzz");
  if (!t) FUZZ_CHECK(!t.error().what.empty());
  return 0;
}

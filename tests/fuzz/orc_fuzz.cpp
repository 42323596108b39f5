// Fuzz target: the ORC unwinder (kernel/orc.hpp): a fuzzed table (its addresses sorted or not,
// its entries any bits, in any format) parsed and checked, then stacks walked over fuzzed stack
// memory from fuzzed registers. The table and every stack word are the guest's: hostile.
//
// Input: flags (bits 0-1 the format asked for: auto, v1, v2, v3; bit 2 unmapped stack reads
// as zeros, else faults; bit 3 raw 32-bit address offsets, else sorted steps; bit 4 the second
// half of the table is a module's), the entry limit (u16), the count (u16), the addresses (u16
// steps from the text's start, or raw s32 offsets), the 6-byte entries, up to 8 stack regions
// (a u16 word offset from the stack base, a u8 word count, the words), then walks: rip (a u16
// into the text or, with its top bit, any u64), rsp and rbp (u16 offsets from the stack base,
// unaligned allowed, or any u64), r10/r13/rdi/rdx, user mode, max frames.
//
// Invariants: a table parses exactly when its sizes agree, its count is within the limit, its
// addresses are sorted and one lies in its text; a parsed table answers find() like a linear
// search over the entries it kept; a walk returns at most max_frames (clamped to 1 ...
// kMaxFrames) addresses, all in the unwinder's text, reads only 8-byte words at 8-aligned
// kernel-half addresses, at most a bounded number of them, and gives the same walk twice.
#include "fuzz/fuzz_common.hpp"
#include "kernel/orc.hpp"

using namespace xenprobes;
using namespace xenprobes::kernel::orc;
using fuzz::Input;

namespace {

constexpr std::uint64_t kText = 0xffffffff81000000ull, kTextEnd = 0xffffffff81010000ull;
constexpr std::uint64_t kModText = 0xffffffffc0000000ull, kModTextEnd = 0xffffffffc0010000ull;
constexpr std::uint64_t kIpBase = 0xffffffff81200000ull, kStack = 0xffffc90000100000ull;

struct Stack {
  std::map<std::uint64_t, std::uint64_t> words;
  bool zeros = false;
  std::size_t reads = 0;
  kernel::ReadFn reader() {
    return [this](Gva a, std::span<std::byte> out) -> Result<void> {
      ++reads;
      FUZZ_CHECK(out.size() == 8, "a stack read of " + std::to_string(out.size()) + " bytes");
      FUZZ_CHECK(a.value % 8 == 0 && a.value >= symbols::kKernelHalfStart,
                 "a stack read at " + std::to_string(a.value));
      auto it = words.find(a.value);
      if (it == words.end() && !zeros) return fail(Errc::Fault, "unmapped");
      const std::uint64_t v = it == words.end() ? 0 : it->second;
      std::memcpy(out.data(), &v, 8);
      return {};
    };
  }
};

struct Parsed {
  std::vector<std::uint64_t> ips;  // as decoded, every one
  std::vector<std::byte> ip_raw, orc_raw;
};

// A reference lookup: the last kept entry at or below `ip`, by a linear search.
std::optional<std::size_t> reference_find(const std::vector<std::uint64_t>& kept, std::uint64_t ip) {
  std::optional<std::size_t> found;
  for (std::size_t i = 0; i < kept.size(); ++i)
    if (kept[i] <= ip) found = i;
  return found;
}

void check_table(const Result<Table>& t, const Parsed& p, std::uint64_t lo, std::uint64_t hi, std::size_t limit,
                 Format asked) {
  const std::size_t n = p.ips.size();
  const bool sorted = std::is_sorted(p.ips.begin(), p.ips.end());
  std::vector<std::uint64_t> kept;
  for (std::uint64_t ip : p.ips)
    if (ip >= lo && ip <= hi) kept.push_back(ip);
  const bool format_known = asked != Format::Auto || detect_format(p.orc_raw) != Format::Auto;
  const bool should = n > 0 && n <= limit && sorted && !kept.empty() && format_known;
  FUZZ_CHECK(t.has_value() == should, "parse " + std::string(t ? "accepted" : t.error().what) + " with " +
                                          std::to_string(n) + " entries, sorted " + std::to_string(sorted));
  if (!t) return;
  FUZZ_CHECK(t->size() == kept.size() && t->dropped() == n - kept.size());
  for (char c : t->summary()) FUZZ_CHECK(c >= 0x20 && c < 0x7f, "summary not printable");
  // Lookups at every kept address, just around them, and at the text's edges.
  std::vector<std::uint64_t> probes = {lo, lo - 1, hi, hi - 1, 0};
  for (std::uint64_t ip : kept) probes.insert(probes.end(), {ip, ip - 1, ip + 1});
  for (std::uint64_t ip : probes) {
    const Entry* e = t->find(ip);
    const bool in_text = ip >= lo && ip < hi;
    auto ref = in_text ? reference_find(kept, ip) : std::nullopt;
    FUZZ_CHECK((e != nullptr) == ref.has_value(), "find disagrees with the linear search at " + std::to_string(ip));
  }
}

Parsed read_table(Input& in, bool raw_offsets, std::uint64_t text_lo, std::size_t n) {
  Parsed p;
  std::uint64_t ip = text_lo;
  for (std::size_t i = 0; i < n && !in.empty(); ++i) {
    const std::uint64_t field = kIpBase + 4 * i;
    std::int32_t rel;
    if (raw_offsets) {
      rel = static_cast<std::int32_t>(in.u32());
      ip = field + static_cast<std::uint64_t>(static_cast<std::int64_t>(rel));
    } else {
      ip += in.u16() % 0x200;
      rel = static_cast<std::int32_t>(static_cast<std::int64_t>(ip - field));
      ip = field + static_cast<std::uint64_t>(static_cast<std::int64_t>(rel));  // what the bytes say
    }
    p.ips.push_back(ip);
    const auto* b = reinterpret_cast<const std::byte*>(&rel);
    p.ip_raw.insert(p.ip_raw.end(), b, b + 4);
  }
  for (std::size_t i = 0; i < p.ips.size(); ++i) {
    auto e = in.bytes(kEntrySize);
    std::array<std::uint8_t, kEntrySize> raw{};
    std::copy(e.begin(), e.end(), raw.begin());
    const auto* b = reinterpret_cast<const std::byte*>(raw.data());
    p.orc_raw.insert(p.orc_raw.end(), b, b + kEntrySize);
  }
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  Input in(data, size);
  const std::uint8_t flags = in.u8();
  const Format asked = static_cast<Format>(flags & 3);
  Limits limits;
  limits.max_entries = 1 + in.u16() % 2048;
  const std::size_t n = in.u16() % 1024;
  const bool raw_offsets = flags & 8, module = flags & 16;

  Parsed core = read_table(in, raw_offsets, kText, module ? n / 2 : n);
  auto t = Table::parse(kIpBase, core.ip_raw, core.orc_raw, {{kText, kTextEnd}}, asked, limits);
  check_table(t, core, kText, kTextEnd, limits.max_entries, asked);
  std::optional<Table> mod;
  if (module) {
    Parsed m = read_table(in, raw_offsets, kModText, n - n / 2);
    // The module's addresses are relative to kIpBase too (its text is far away: most raw
    // offsets cannot reach it, sorted steps from its start can).
    auto mt = Table::parse(kIpBase, m.ip_raw, m.orc_raw, {{kModText, kModTextEnd}}, asked, limits);
    check_table(mt, m, kModText, kModTextEnd, limits.max_entries, asked);
    if (mt) mod = std::move(*mt);
  }
  if (!t) return 0;

  Stack st;
  st.zeros = flags & 4;
  for (unsigned r = in.u8() % 9; r > 0 && !in.empty(); --r) {
    std::uint64_t at = kStack + 8ull * in.u16();
    for (unsigned w = in.u8(); w > 0 && !in.empty(); --w, at += 8) st.words[at] = in.u64();
  }
  Unwinder u(std::move(*t));
  if (mod) {
    std::vector<Table> mods;
    mods.push_back(std::move(*mod));
    u.set_modules(std::move(mods));
  }
  while (!in.empty()) {
    StartRegs s;
    const std::uint16_t rip = in.u16();
    s.rip = rip & 0x8000 ? in.u64() : (rip & 0x4000 ? kModText : kText) + (rip & 0x3fff);
    const std::uint16_t sp = in.u16();
    s.rsp = sp & 0x8000 ? in.u64() : kStack + (sp & 0x7fff);
    const std::uint16_t bp = in.u16();
    s.rbp = bp & 0x8000 ? in.u64() : kStack + (bp & 0x7fff);
    s.r10 = kStack + in.u16(), s.r13 = in.u64(), s.rdi = kStack + 8ull * in.u8(), s.rdx = in.u64();
    s.user_mode = (in.u8() & 0xf) == 0xf;
    const std::size_t max = in.u8();
    st.reads = 0;
    Walk w = u.walk(s, st.reader(), max);
    const std::size_t cap = std::clamp<std::size_t>(max, 1, kMaxFrames);
    FUZZ_CHECK(w.ips.size() <= cap, std::to_string(w.ips.size()) + " frames over " + std::to_string(cap));
    for (std::uint64_t ip : w.ips) FUZZ_CHECK(u.is_text(ip), "a frame outside the text: " + std::to_string(ip));
    // Per frame: a few words for the stack pointer, the return address or pt_regs, the frame pointer.
    FUZZ_CHECK(st.reads <= 8 * (cap + 1), std::to_string(st.reads) + " reads for " + std::to_string(cap) + " frames");
    FUZZ_CHECK(std::strlen(to_string(w.stop)) > 0);
    Walk again = u.walk(s, st.reader(), max);
    FUZZ_CHECK(again.ips == w.ips && again.stop == w.stop && again.fallback == w.fallback, "a walk is not repeatable");
  }
  return 0;
}

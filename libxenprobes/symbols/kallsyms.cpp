#include "symbols/kallsyms.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

#include "common/bytes.hpp"
#include "common/hex.hpp"

namespace xenprobes::symbols {
namespace {

constexpr std::size_t kTokens = 256;
// No token is longer than a whole symbol (a token is a piece of one).
constexpr std::size_t kMaxTokenLen = kMaxNameLen + 1;
// An entry of kallsyms_names: a 2-byte length and at most the expanded length in tokens
// (compression never makes a name longer), type character included.
constexpr std::uint64_t kMaxEntryBytes = 2 + kMaxNameLen + 1;
constexpr std::uint64_t kMinEntryBytes = 2;  // a length and one token
constexpr std::uint64_t kPageSize = 4096;
constexpr std::uint64_t kImageStep = 2ull << 20;
constexpr std::size_t kMaxMarkerCandidates = 64;
constexpr std::size_t kMaxSignatureHits = 64;
// The token table's signature: the digits are one-character tokens, in order.
constexpr char kDigits[] =
    "0\0"
    "1\0"
    "2\0"
    "3\0"
    "4\0"
    "5\0"
    "6\0"
    "7\0"
    "8\0"
    "9";
constexpr std::size_t kDigitsLen = sizeof kDigits;  // includes the final NUL

std::uint64_t align8(std::uint64_t v) { return (v + 7) & ~std::uint64_t{7}; }

Result<std::vector<std::byte>> read_bytes(const MemoryReadFn& read, std::uint64_t addr, std::uint64_t n,
                                          const char* what) {
  if (addr + n < addr) return fail(Errc::Io, std::string(what) + " would wrap around the address space");
  std::vector<std::byte> out(n);
  if (auto r = read(addr, out); !r)
    return fail(r.error().code, std::string("cannot read ") + what + " (" + std::to_string(n) + " bytes at " +
                                    hex(addr) + "): " + r.error().what);
  return out;
}

// Up to `n` bytes ending at `end`, as many as can be read going down in chunks: the bytes
// below the token table, where the markers and the names are.
std::pair<std::uint64_t, std::vector<std::byte>> read_below(const MemoryReadFn& read, std::uint64_t end,
                                                            std::uint64_t n, std::size_t chunk) {
  n = std::min(n, end);
  std::vector<std::vector<std::byte>> parts;
  std::uint64_t lo = end;
  bool by_page = false;  // after a chunk failed: the rest of the way page by page
  while (end - lo < n) {
    std::uint64_t step = std::min<std::uint64_t>(chunk, n - (end - lo));
    if (by_page) step = std::min<std::uint64_t>(step, (lo & (kPageSize - 1)) ? (lo & (kPageSize - 1)) : kPageSize);
    std::vector<std::byte> part(step);
    if (!read(lo - step, part)) {
      if (by_page) break;
      by_page = true;
      continue;
    }
    lo -= step;
    parts.push_back(std::move(part));
  }
  std::vector<std::byte> out;
  out.reserve(end - lo);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) out.insert(out.end(), it->begin(), it->end());
  return {lo, std::move(out)};
}

// Up to `n` bytes from `addr`, as many as can be read going up page by page: the token table
// is short, and what follows it may be the last mapped page.
std::vector<std::byte> read_upto(const MemoryReadFn& read, std::uint64_t addr, std::uint64_t n) {
  std::vector<std::byte> out;
  while (out.size() < n) {
    const std::uint64_t at = addr + out.size();
    const std::uint64_t step = std::min<std::uint64_t>(kPageSize - (at & (kPageSize - 1)), n - out.size());
    const std::size_t old = out.size();
    out.resize(old + step);
    if (!read(at, std::span(out.data() + old, step))) {
      out.resize(old);
      break;
    }
  }
  return out;
}

struct Tokens {
  std::uint64_t table = 0, index = 0;
  std::vector<std::string> text;  // 256 strings
};

// From the address of the digit signature: the token table's end (after token 0xff), the
// token index right after it, and the table's start from the index. Everything must agree.
Result<Tokens> read_tokens(const MemoryReadFn& read, std::uint64_t digits) {
  // Tokens 0x30..0xff follow the digits.
  const std::uint64_t fwd = (kTokens - 0x30) * (kMaxTokenLen + 1) + 16 + 2 * kTokens;
  const std::vector<std::byte> after = read_upto(read, digits, fwd);
  std::uint64_t pos = 0;
  for (std::size_t i = 0x30; i < kTokens; ++i) {
    auto nul = std::find(after.begin() + static_cast<std::ptrdiff_t>(pos), after.end(), std::byte{0});
    std::uint64_t len = static_cast<std::uint64_t>(nul - after.begin()) - pos;
    if (nul == after.end() || len > kMaxTokenLen)
      return fail(Errc::Io, "kallsyms token " + std::to_string(i) + " at " + hex(digits + pos) +
                                " is not a string of at most " + std::to_string(kMaxTokenLen) + " bytes");
    pos += len + 1;
  }
  const std::uint64_t table_end = digits + pos;
  // The index is aligned after the table (8 on 64-bit builds); accept any padding up to 8.
  for (std::uint64_t pad = 0; pad < 8; ++pad) {
    if (pos + pad + 2 * kTokens > after.size()) break;
    const std::byte* idx = after.data() + pos + pad;
    if (load<std::uint16_t>(idx) != 0) continue;
    const std::uint64_t digits_off = load<std::uint16_t>(idx + std::ptrdiff_t{2} * 0x30);
    if (digits_off > digits || digits_off > 0x30 * (kMaxTokenLen + 1)) continue;
    const std::uint64_t table = digits - digits_off;
    const std::uint64_t table_len = table_end - table;
    auto bytes = read_bytes(read, table, table_len, "the kallsyms token table");
    if (!bytes) return std::unexpected(bytes.error());
    Tokens t;
    t.table = table;
    t.index = table_end + pad;
    std::uint64_t off = 0;
    bool ok = true;
    for (std::size_t i = 0; i < kTokens && ok; ++i) {
      if (load<std::uint16_t>(idx + 2 * i) != off || off >= table_len) {
        ok = false;
        break;
      }
      auto b = bytes->begin() + static_cast<std::ptrdiff_t>(off);
      auto nul = std::find(b, bytes->end(), std::byte{0});
      if (nul == bytes->end() || static_cast<std::uint64_t>(nul - b) > kMaxTokenLen) {
        ok = false;
        break;
      }
      std::string s(reinterpret_cast<const char*>(&*b), static_cast<std::size_t>(nul - b));
      off += s.size() + 1;
      t.text.push_back(std::move(s));
    }
    if (ok && off == table_len) return t;
  }
  return fail(Errc::Io, "no kallsyms token index matches the token table ending at " + hex(table_end));
}

// One kallsyms_names entry at `p` (bounded by `end`): its token numbers, and the next entry.
struct NameEntry {
  const std::byte* tokens = nullptr;
  std::size_t len = 0;
  const std::byte* next = nullptr;
};
std::optional<NameEntry> name_entry(const std::byte* p, const std::byte* end) {
  if (p >= end) return std::nullopt;
  std::size_t len = std::to_integer<std::size_t>(*p++);
  if (len & 0x80) {  // ULEB128, two bytes at most (Linux 6.1+)
    if (p >= end) return std::nullopt;
    std::size_t hi = std::to_integer<std::size_t>(*p++);
    if (hi & 0x80) return std::nullopt;
    len = (len & 0x7f) | (hi << 7);
  }
  if (len == 0 || len > kMaxNameLen + 1 || static_cast<std::size_t>(end - p) < len) return std::nullopt;
  return NameEntry{p, len, p + len};
}

struct Names {
  std::uint64_t num_syms = 0, names = 0;
  std::uint32_t count = 0;
  std::vector<std::byte> bytes;  // [names, names_end)
};

// Walks `count` entries from names[start]; true when every 256th entry starts at its marker
// and the walk ends in the 8 bytes below `markers_at` (the markers follow the names).
bool names_agree(const std::byte* start, const std::byte* limit, std::uint32_t count,
                 const std::vector<std::uint32_t>& markers, std::uint64_t names_addr, std::uint64_t markers_at,
                 std::uint64_t* end_off) {
  const std::byte* p = start;
  for (std::uint32_t i = 0; i < count; ++i) {
    if ((i & 0xff) == 0 && static_cast<std::uint64_t>(p - start) != markers[i >> 8]) return false;
    auto e = name_entry(p, limit);
    if (!e) return false;
    p = e->next;
  }
  const std::uint64_t end = names_addr + static_cast<std::uint64_t>(p - start);
  *end_off = static_cast<std::uint64_t>(p - start);
  return align8(end) == markers_at;
}

// The markers end right below the token table, or below the sequence table (3 or 4 bytes per
// symbol) that some kernels put between them.
bool gap_fits(std::uint64_t gap, std::uint64_t lo, std::uint64_t hi) {
  if (gap == 0) return true;
  for (std::uint64_t width : {3u, 4u}) {
    // align8(width * n) == gap for some n in [lo, hi]
    std::uint64_t n_min = gap >= 7 ? (gap - 7 + width - 1) / width : 0;
    std::uint64_t n_max = gap / width;
    if (n_max >= lo && n_min <= hi) {
      for (std::uint64_t n = std::max(n_min, lo); n <= std::min(n_max, hi); ++n)
        if (align8(width * n) == gap) return true;
    }
  }
  return false;
}

Result<Names> find_names(const MemoryReadFn& read, const Tokens& tok, const KallsymsLimits& limits,
                         std::vector<std::uint32_t>* markers_out, std::uint64_t* markers_addr) {
  // Every table starts 8-aligned (scripts/kallsyms.c aligns each label on 64-bit builds).
  if (tok.table % 8 != 0) return fail(Errc::Io, "a kallsyms token table at " + hex(tok.table) + " is not 8-aligned");
  const std::uint64_t max_markers = (std::uint64_t{limits.max_symbols} + 255) / 256;
  const std::uint64_t window = 4 * max_markers + 4 * std::uint64_t{limits.max_symbols} + 16;
  auto got = read_below(read, tok.table, window, limits.chunk_bytes);
  const std::uint64_t lo = got.first;  // not structured bindings: clang 14 cannot capture those
  const std::vector<std::byte>& below = got.second;
  const std::uint64_t max_step = 256 * kMaxEntryBytes, min_step = 256 * kMinEntryBytes;
  auto at = [&](std::uint64_t addr) { return load<std::uint32_t>(below.data() + (addr - lo)); };
  std::string last_reason = "no kallsyms_markers table below the token table at " + hex(tok.table);

  // follows[i]: how many u32 after the i-th one (from lo) continue a run of plausible
  // markers, computed once from the top down so the scan below stays linear.
  const std::size_t words = below.size() / 4;
  std::vector<std::uint32_t> follows(words + 1, 0);
  for (std::size_t i = words; i-- > 1;) {
    const std::uint32_t prev = load<std::uint32_t>(below.data() + 4 * (i - 1)),
                        cur = load<std::uint32_t>(below.data() + 4 * i);
    const std::uint64_t step = std::uint64_t{cur} - prev;
    if (cur > prev && step >= min_step && step <= max_step) follows[i - 1] = follows[i] + 1;
  }
  std::size_t tried = 0;
  for (std::uint64_t p = (tok.table - 4) & ~std::uint64_t{7}; p >= lo && p + 4 <= tok.table; p -= 8) {
    if (at(p) != 0) continue;
    // The run of plausible markers from p.
    const std::size_t first = (p - lo) / 4;
    const std::size_t len = std::min<std::size_t>(1 + follows[first], max_markers);
    std::vector<std::uint32_t> run(len);
    for (std::size_t k = 0; k < len; ++k) run[k] = load<std::uint32_t>(below.data() + 4 * (first + k));
    for (std::size_t m = run.size(); m >= 1 && m + 2 >= run.size(); --m) {
      const std::uint64_t n_lo = 256 * (m - 1) + 1, n_hi = std::min<std::uint64_t>(256 * m, limits.max_symbols);
      if (n_lo > n_hi || !gap_fits(tok.table - align8(p + 4 * m), n_lo, n_hi)) continue;
      // The names end in the 8 bytes below p; entry 256(m-1) starts at markers[m-1].
      const std::uint64_t last = run[m - 1];
      if (p < last + 2 + 8) continue;
      // Each candidate reads and walks up to the whole names table: a guest that fills its
      // memory with look-alikes gets a bounded number of tries.
      if (++tried > kMaxMarkerCandidates)
        return fail(Errc::Io, "more than " + std::to_string(kMaxMarkerCandidates) +
                                  " look-alikes of kallsyms_markers below the token table at " + hex(tok.table));
      const std::uint64_t s_hi = p - last - 2;
      const std::uint64_t tail = (n_hi - 256 * (m - 1)) * kMaxEntryBytes + 8;
      const std::uint64_t s_lo = s_hi > tail ? s_hi - tail : 0;
      auto region = read_below(read, p, p - (s_lo > 8 ? s_lo - 8 : 0), limits.chunk_bytes);
      const std::uint64_t rlo = region.first;
      const std::vector<std::byte>& rb = region.second;
      const std::vector<std::uint32_t> markers(run.begin(), run.begin() + static_cast<std::ptrdiff_t>(m));
      for (std::uint64_t s = s_hi & ~std::uint64_t{7}; s >= s_lo && s >= rlo + 8; s -= 8) {
        const std::byte* num = rb.data() + (s - 8 - rlo);
        const std::uint32_t n = load<std::uint32_t>(num);
        if (n < n_lo || n > n_hi || load<std::uint32_t>(num + 4) != 0) continue;
        std::uint64_t end_off = 0;
        if (!names_agree(rb.data() + (s - rlo), rb.data() + rb.size(), n, markers, s, p, &end_off)) continue;
        Names out;
        out.num_syms = s - 8;
        out.names = s;
        out.count = n;
        out.bytes.assign(rb.begin() + static_cast<std::ptrdiff_t>(s - rlo),
                         rb.begin() + static_cast<std::ptrdiff_t>(s - rlo + end_off));
        *markers_out = markers;
        *markers_addr = p;
        return out;
      }
      last_reason =
          "kallsyms_markers candidate at " + hex(p) + " (" + std::to_string(m) + " markers) matches no kallsyms_names";
    }
    if (p < 8) break;
  }
  return fail(Errc::Io, last_reason);
}

// Addresses from kallsyms_offsets (kernel/kallsyms.c, kallsyms_sym_address). With
// CONFIG_KALLSYMS_ABSOLUTE_PERCPU a non-negative offset is an absolute value (a per-CPU
// symbol) and a negative one counts down from relative_base - 1; without it every offset is
// unsigned from relative_base. Kernels do not record which, but an x86-64 kernel image spans
// far less than 2 GiB, so only the absolute-per-CPU encoding has negative offsets.
std::optional<std::vector<std::uint64_t>> decode_offsets(const std::vector<std::byte>& raw, std::uint32_t n,
                                                         std::uint64_t base, bool* absolute) {
  *absolute = false;
  for (std::uint32_t i = 0; i < n; ++i)
    if (static_cast<std::int32_t>(load<std::uint32_t>(raw.data() + 4 * std::size_t{i})) < 0) *absolute = true;
  std::vector<std::uint64_t> out(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::int32_t v = static_cast<std::int32_t>(load<std::uint32_t>(raw.data() + 4 * std::size_t{i}));
    if (!*absolute) out[i] = base + static_cast<std::uint32_t>(v);
    else if (v >= 0) out[i] = static_cast<std::uint64_t>(v);
    else out[i] = base - 1 - static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
    if (out[i] < base && (!*absolute || v < 0)) return std::nullopt;  // wrapped
    if (i > 0 && out[i] < out[i - 1]) return std::nullopt;            // the table is sorted
  }
  return out;
}

}  // namespace

Result<KallsymsResult> read_kallsyms_at(const MemoryReadFn& read, std::uint64_t digits, const KallsymsLimits& limits) {
  Tokens tok = XP_TRY(read_tokens(read, digits));
  std::vector<std::uint32_t> markers;
  KallsymsResult res;
  res.where.token_table = tok.table;
  res.where.token_index = tok.index;
  Names names = XP_TRY(find_names(read, tok, limits, &markers, &res.where.markers));
  res.where.names = names.names;
  res.where.num_syms = names.num_syms;
  res.where.count = names.count;
  const std::uint32_t n = names.count;

  // Linux 6.1: offsets, relative_base, num_syms. Later: token_index, offsets, relative_base.
  struct Layout {
    std::uint64_t offsets, base;
    bool after;
  };
  std::vector<Layout> layouts;
  if (names.num_syms >= 8 + align8(4ull * n))
    layouts.push_back({names.num_syms - 8 - align8(4ull * n), names.num_syms - 8, false});
  const std::uint64_t after = align8(tok.index + 2 * kTokens);
  layouts.push_back({after, align8(after + 4ull * n), true});
  std::string why;
  std::optional<std::vector<std::uint64_t>> addrs;
  for (const Layout& l : layouts) {
    auto base = read_bytes(read, l.base, 8, "kallsyms_relative_base");
    auto raw = read_bytes(read, l.offsets, 4ull * n, "kallsyms_offsets");
    if (!base || !raw) {
      why += (why.empty() ? "" : "; ") + (!base ? base.error().what : raw.error().what);
      continue;
    }
    const std::uint64_t b = load<std::uint64_t>(base->data());
    if (b < kKernelHalfStart) {
      why += (why.empty() ? "" : "; ") + std::string("kallsyms_relative_base candidate at ") + hex(l.base) + " holds " +
             hex(b) + ", not a kernel address";
      continue;
    }
    addrs = decode_offsets(*raw, n, b, &res.absolute_percpu);
    if (!addrs) {
      why += (why.empty() ? "" : "; ") + std::string("kallsyms_offsets candidate at ") + hex(l.offsets) +
             " does not decode to sorted addresses";
      continue;
    }
    res.where.offsets = l.offsets;
    res.where.relative_base = l.base;
    res.where.offsets_after_tokens = l.after;
    break;
  }
  if (!addrs)
    return fail(Errc::Io, "kallsyms tables at " + hex(tok.table) + ": no kallsyms_offsets found (" + why + ")");

  res.entries.reserve(n);
  const std::byte* p = names.bytes.data();
  const std::byte* end = p + names.bytes.size();
  std::string buf;
  for (std::uint32_t i = 0; i < n; ++i) {
    auto e = name_entry(p, end);
    if (!e) return fail(Errc::Io, "kallsyms_names entry " + std::to_string(i) + " is cut short");
    buf.clear();
    for (std::size_t k = 0; k < e->len; ++k) {
      buf += tok.text[std::to_integer<std::size_t>(e->tokens[k])];
      if (buf.size() > kMaxNameLen + 1)
        return fail(Errc::Io, "kallsyms symbol " + std::to_string(i) + " expands to more than " +
                                  std::to_string(kMaxNameLen) + " characters");
    }
    if (buf.size() < 2) return fail(Errc::Io, "kallsyms symbol " + std::to_string(i) + " has no name");
    for (char c : buf)
      if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
        return fail(Errc::Io, "kallsyms symbol " + std::to_string(i) + " has a character no symbol name has (" +
                                  std::to_string(static_cast<unsigned char>(c)) + ")");
    res.entries.push_back(KallsymsEntry{buf.substr(1), buf[0], (*addrs)[i]});
    p = e->next;
  }
  return res;
}

Result<KallsymsResult> find_kallsyms(const MemoryReadFn& read, std::uint64_t start, std::uint64_t end,
                                     const KallsymsLimits& limits) {
  if (end < start) return fail(Errc::InvalidArgument, "kallsyms search range ends before it starts");
  end = std::min(end, start + limits.max_scan_bytes < start ? end : start + limits.max_scan_bytes);
  std::optional<Error> last;
  std::vector<std::byte> carry;  // the last bytes of the previous readable chunk
  std::uint64_t carry_end = 0;
  std::uint64_t pos = start;
  std::size_t readable = 0, hits = 0;
  while (pos < end) {
    std::uint64_t n = std::min<std::uint64_t>(limits.chunk_bytes, end - pos);
    std::vector<std::byte> chunk(n);
    if (!read(pos, chunk)) {
      // Page by page: keep what is mapped, then skip to the next 2 MiB step.
      std::uint64_t ok = 0;
      for (; ok < n; ok += kPageSize) {
        std::uint64_t len = std::min<std::uint64_t>(kPageSize, n - ok);
        if (!read(pos + ok, std::span(chunk.data() + ok, len))) break;
      }
      if (ok == 0) {
        carry.clear();
        std::uint64_t next = (pos + kPageSize + kImageStep - 1) & ~(kImageStep - 1);
        if (next <= pos) break;
        pos = next;
        continue;
      }
      n = ok;
      chunk.resize(n);
    }
    ++readable;
    std::vector<std::byte> hay;
    const std::uint64_t hay_start = carry_end == pos && !carry.empty() ? pos - carry.size() : pos;
    if (hay_start != pos) hay = carry;
    hay.insert(hay.end(), chunk.begin(), chunk.end());
    for (std::size_t from = 0; from < hay.size();) {
      const void* hit = ::memmem(hay.data() + from, hay.size() - from, kDigits, kDigitsLen);
      if (!hit) break;
      const auto off = static_cast<std::size_t>(static_cast<const std::byte*>(hit) - hay.data());
      // A real kernel has one; a guest that plants look-alikes gets a bounded number of tries.
      if (++hits > kMaxSignatureHits)
        return fail(Errc::Io, "more than " + std::to_string(kMaxSignatureHits) +
                                  " look-alikes of the kallsyms token table from " + hex(start) +
                                  " on (the last: " + (last ? last->what : std::string("none")) + ")");
      auto r = read_kallsyms_at(read, hay_start + off, limits);
      if (r) return r;
      last = r.error();
      from = off + 1;
    }
    const std::size_t keep = std::min<std::size_t>(kDigitsLen - 1, hay.size());
    carry.assign(hay.end() - static_cast<std::ptrdiff_t>(keep), hay.end());
    carry_end = pos + n;
    pos += n;
  }
  if (last) return std::unexpected(*last);
  return fail(Errc::NotFound, "no kallsyms token table in " + hex(start) + ".." + hex(end) + " (" +
                                  std::to_string(readable) +
                                  " readable chunks): not a Linux kernel with "
                                  "CONFIG_KALLSYMS, or the search started past its .rodata");
}

Result<SymbolTable> to_symbol_table(const std::vector<KallsymsEntry>& entries, std::string source) {
  std::string text;
  text.reserve(entries.size() * 40);
  for (const KallsymsEntry& e : entries) {
    char addr[20];
    std::snprintf(addr, sizeof addr, "%016llx ", static_cast<unsigned long long>(e.address));
    text += addr;
    text += e.type;
    text += ' ';
    text += e.name;
    text += '\n';
  }
  return SymbolTable::parse(text, std::move(source));
}

Result<std::int64_t> slide_from_symbol(SymbolTable& table, std::string_view name, std::uint64_t running) {
  if (running < kKernelHalfStart)
    return fail(Errc::InvalidArgument, std::string(name) + " is at " + hex(running) +
                                           ", which is not a kernel address: cannot take the KASLR slide from it");
  auto found = table.lookup(name);
  if (!found || found->size() != 1)
    return fail(Errc::InvalidArgument, "'" + std::string(name) + "' is " + (found ? "at several addresses" : "not") +
                                           " in " + table.source() + ": cannot take the KASLR slide from it");
  const std::uint64_t link = found->front().address.value - static_cast<std::uint64_t>(table.slide());
  const auto slide = static_cast<std::int64_t>(running - link);
  XP_TRY(table.set_slide(slide));
  return slide;
}

}  // namespace xenprobes::symbols

// ORC tables: decoding, checking, lookup, reading from guest memory (orc.hpp). The walk is in
// orc_walk.cpp.
#include "kernel/orc.hpp"

#include <algorithm>
#include <cstring>

#include "common/hex.hpp"

namespace xenprobes::kernel::orc {

const char* to_string(Format f) {
  switch (f) {
    case Format::Auto: return "auto";
    case Format::V1: return "v1 (Linux 4.14-6.2)";
    case Format::V2: return "v2 (Linux 6.3)";
    case Format::V3: return "v3 (Linux 6.4+)";
  }
  return "?";
}

const char* to_string(Type t) {
  switch (t) {
    case Type::Undefined: return "undefined";
    case Type::EndOfStack: return "end of stack";
    case Type::Call: return "call";
    case Type::Regs: return "regs";
    case Type::RegsPartial: return "regs (iret frame)";
    case Type::Unknown: return "unknown";
  }
  return "?";
}

namespace {

std::uint16_t le16(const std::byte* p) {
  return static_cast<std::uint16_t>(std::to_integer<unsigned>(p[0]) | std::to_integer<unsigned>(p[1]) << 8);
}

std::int32_t le32s(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | std::to_integer<std::uint32_t>(p[i]);
  return static_cast<std::int32_t>(v);
}

// The v1/v2 two-bit type of an entry whose sp_reg is defined.
Type old_type(unsigned t) {
  switch (t) {
    case 0: return Type::Call;
    case 1: return Type::Regs;
    case 2: return Type::RegsPartial;
    default: return Type::Unknown;
  }
}

}  // namespace

Entry decode(std::span<const std::byte, kEntrySize> raw, Format f) {
  Entry e;
  e.sp_offset = static_cast<std::int16_t>(le16(raw.data()));
  e.bp_offset = static_cast<std::int16_t>(le16(raw.data() + 2));
  const unsigned flags = le16(raw.data() + 4);
  e.sp_reg = static_cast<std::uint8_t>(flags & 0xf);
  e.bp_reg = static_cast<std::uint8_t>(flags >> 4 & 0xf);
  if (f == Format::V1 || f == Format::V2) {
    const bool end = f == Format::V1 ? (flags >> 10 & 1) != 0 : (flags >> 11 & 1) != 0;
    if (e.sp_reg == kRegUndefined) {
      e.type = end ? Type::EndOfStack : Type::Undefined;
    } else {
      e.type = old_type(flags >> 8 & 3);
    }
    // v1 has no signal bit: the kernel takes every pt_regs frame as one.
    e.signal = f == Format::V1 ? (e.type == Type::Regs || e.type == Type::RegsPartial) : (flags >> 10 & 1) != 0;
    return e;
  }
  switch (flags >> 8 & 7) {
    case 0: e.type = Type::Undefined; break;
    case 1: e.type = Type::EndOfStack; break;
    case 2: e.type = Type::Call; break;
    case 3: e.type = Type::Regs; break;
    case 4: e.type = Type::RegsPartial; break;
    default: e.type = Type::Unknown; break;
  }
  e.signal = (flags >> 11 & 1) != 0;
  return e;
}

Format detect_format(std::span<const std::byte> orc_raw) {
  std::size_t zero = 0, two = 0;
  bool bit11 = false;
  for (std::size_t off = 0; off + kEntrySize <= orc_raw.size(); off += kEntrySize) {
    const unsigned flags = le16(orc_raw.data() + off + 4);
    bit11 = bit11 || (flags >> 11 & 1) != 0;  // v2's end bit: on end-of-stack entries
    if ((flags & 0xf) != kRegSp) continue;
    const unsigned t = flags >> 8 & 7;
    zero += t == 0;
    two += t == 2;
  }
  if (zero == 0 && two == 0) return Format::Auto;
  if (two > zero) return Format::V3;
  return bit11 ? Format::V2 : Format::V1;
}

Result<Table> Table::parse(std::uint64_t ip_base, std::span<const std::byte> ip_raw, std::span<const std::byte> orc_raw,
                           std::vector<Range> text, Format format, const Limits& limits) {
  if (ip_raw.size() % 4 != 0 || orc_raw.size() % kEntrySize != 0 || ip_raw.size() / 4 != orc_raw.size() / kEntrySize)
    return fail(Errc::InvalidArgument, "ORC tables of " + std::to_string(ip_raw.size()) + " and " +
                                           std::to_string(orc_raw.size()) + " bytes do not describe the same entries");
  const std::size_t n = ip_raw.size() / 4;
  if (n == 0) return fail(Errc::InvalidArgument, "the ORC table is empty");
  if (n > limits.max_entries)
    return fail(Errc::InvalidArgument, "the ORC table has " + std::to_string(n) + " entries, over the limit of " +
                                           std::to_string(limits.max_entries));
  if (ip_base > UINT64_MAX - ip_raw.size())
    return fail(Errc::InvalidArgument, "the ORC address table wraps around the address space");
  if (format == Format::Auto) format = detect_format(orc_raw);
  if (format == Format::Auto)
    return fail(Errc::InvalidArgument, "the ORC table's format cannot be told (no entry based on the stack pointer)");
  Table t;
  t.format_ = format;
  std::sort(text.begin(), text.end(), [](const Range& a, const Range& b) { return a.start < b.start; });
  std::erase_if(text, [](const Range& r) { return r.empty(); });
  t.text_ = std::move(text);
  t.ips_.reserve(n);
  t.entries_.reserve(n);
  std::uint64_t prev = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t field = ip_base + 4 * i;
    const std::uint64_t ip =
        field + static_cast<std::uint64_t>(static_cast<std::int64_t>(le32s(ip_raw.data() + 4 * i)));
    // Sortedness over every entry, kept or not: the kernel's own lookup relies on it.
    if (i > 0 && ip < prev)
      return fail(Errc::InvalidArgument, "the ORC address table is not sorted (entry " + std::to_string(i) + " at " +
                                             hex(ip) + " is below the one before it)");
    prev = ip;
    // A section's terminator sits at its end address: kept (it ends the last function there).
    const bool inside =
        std::any_of(t.text_.begin(), t.text_.end(), [&](const Range& r) { return ip >= r.start && ip <= r.end; });
    if (!inside) {
      ++t.dropped_;
      continue;
    }
    t.ips_.push_back(ip);
    t.entries_.push_back(
        decode(std::span<const std::byte, kEntrySize>(orc_raw.data() + kEntrySize * i, kEntrySize), format));
  }
  if (t.ips_.empty())
    return fail(Errc::InvalidArgument,
                "none of the ORC table's " + std::to_string(n) + " entries lies in the text it describes");
  return t;
}

bool Table::covers(std::uint64_t ip) const {
  auto it =
      std::upper_bound(text_.begin(), text_.end(), ip, [](std::uint64_t a, const Range& r) { return a < r.start; });
  return it != text_.begin() && std::prev(it)->contains(ip);
}

const Entry* Table::find(std::uint64_t ip) const {
  if (!covers(ip)) return nullptr;
  // The last entry at or below ip: of equal addresses the last, as the kernel's search.
  auto it = std::upper_bound(ips_.begin(), ips_.end(), ip);
  if (it == ips_.begin()) return nullptr;
  return &entries_[static_cast<std::size_t>(it - ips_.begin()) - 1];
}

std::string Table::summary() const {
  std::string s = std::to_string(ips_.size()) + " entries (" + to_string(format_) + ")";
  if (dropped_) s += ", " + std::to_string(dropped_) + " outside the text dropped";
  return s;
}

namespace {

Result<Table> read_table(const ReadFn& read, std::uint64_t ip_addr, std::uint64_t orc_addr, std::uint64_t num,
                         std::vector<Range> text, Format format, const Limits& limits) {
  if (num == 0) return fail(Errc::InvalidArgument, "the ORC table is empty");
  if (num > limits.max_entries)
    return fail(Errc::InvalidArgument, "the ORC table has " + std::to_string(num) + " entries, over the limit of " +
                                           std::to_string(limits.max_entries));
  if (ip_addr < symbols::kKernelHalfStart || orc_addr < symbols::kKernelHalfStart || ip_addr > UINT64_MAX - 4 * num ||
      orc_addr > UINT64_MAX - kEntrySize * num)
    return fail(Errc::InvalidArgument, "the ORC table is not in the kernel's half of the address space");
  kernel::Limits lim;
  lim.chunk_bytes = limits.chunk_bytes;
  TableStatus st;
  st.name = "ORC";
  auto ips = entries::read_bytes(read, ip_addr, 4 * num, lim, st);
  if (!ips) return fail(Errc::Fault, "cannot read the ORC address table: " + st.why);
  auto orcs = entries::read_bytes(read, orc_addr, kEntrySize * num, lim, st);
  if (!orcs) return fail(Errc::Fault, "cannot read the ORC entries: " + st.why);
  return Table::parse(ip_addr, *ips, *orcs, std::move(text), format, limits);
}

}  // namespace

Result<Table> read_kernel_table(const symbols::SymbolTable& syms, const ReadFn& read, Format format,
                                const Limits& limits) {
  auto sym = [&](const char* n) -> Result<std::uint64_t> {
    auto a = syms.resolve(n);
    if (!a) return fail(Errc::NotFound, std::string("no symbol ") + n);
    return a->value;
  };
  auto ip_start = sym("__start_orc_unwind_ip"), ip_stop = sym("__stop_orc_unwind_ip");
  auto orc_start = sym("__start_orc_unwind"), orc_stop = sym("__stop_orc_unwind");
  if (!ip_start || !ip_stop || !orc_start || !orc_stop)
    return fail(Errc::NotFound,
                "the guest kernel has no ORC unwind tables (no __start_orc_unwind_ip ... "
                "__stop_orc_unwind in its symbols: a kernel without CONFIG_UNWINDER_ORC)");
  auto stext = sym("_stext"), etext = sym("_etext");
  if (!stext || !etext || *etext <= *stext)
    return fail(Errc::NotFound, "the guest kernel's text bounds (_stext, _etext) are not in its symbols");
  if (*ip_stop < *ip_start || *orc_stop < *orc_start)
    return fail(Errc::InvalidArgument, "the ORC table's bounds are reversed");
  const std::uint64_t ip_bytes = *ip_stop - *ip_start, orc_bytes = *orc_stop - *orc_start;
  if (ip_bytes % 4 != 0 || orc_bytes % kEntrySize != 0 || ip_bytes / 4 != orc_bytes / kEntrySize)
    return fail(Errc::InvalidArgument, "the ORC tables' sizes (" + std::to_string(ip_bytes) + " and " +
                                           std::to_string(orc_bytes) + " bytes) do not describe the same entries");
  std::vector<Range> text{{*stext, *etext}};
  auto sinit = sym("_sinittext"), einit = sym("_einittext");
  if (sinit && einit && *einit > *sinit) text.push_back({*sinit, *einit});
  return read_table(read, *ip_start, *orc_start, ip_bytes / 4, std::move(text), format, limits);
}

Result<Table> read_module_table(const ReadFn& read, std::uint64_t ip_addr, std::uint64_t orc_addr, std::uint64_t num,
                                Range text, Format format, const Limits& limits) {
  if (text.empty()) return fail(Errc::InvalidArgument, "the module has no text");
  return read_table(read, ip_addr, orc_addr, num, {text}, format, limits);
}

}  // namespace xenprobes::kernel::orc

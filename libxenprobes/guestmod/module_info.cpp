#include "common/hex.hpp"
#include "guestmod/module_info.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <optional>

#include "mem/guest_memory.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::guestmod {

namespace {

// "xenstore key <path> = '<value>': <why>"
std::string bad(const std::string& path, std::string_view value, std::string_view why) {
  return "xenstore key " + path + " = '" + sanitize(value) + "': " + std::string(why);
}

bool ranges_overlap(std::uint64_t a_first, std::uint64_t a_last, std::uint64_t b_first, std::uint64_t b_last) {
  return a_first <= b_last && b_first <= a_last;
}

// Reads a key the module must have written; a missing key is NotFound naming it.
Result<std::string> read_required(hv::Hypervisor& hv, const std::string& path) {
  auto v = hv.xs_read(path);
  if (!v) {
    if (v.error().code == Errc::NotFound)
      return fail(Errc::NotFound, "xenstore key " + path + " is missing although the guest module says it is ready");
    return fail(v.error().code, "reading xenstore key " + path + ": " + v.error().what);
  }
  return *v;
}

Result<std::uint64_t> read_decimal(hv::Hypervisor& hv, const std::string& path, std::uint64_t min, std::uint64_t max) {
  auto s = XP_TRY(read_required(hv, path));
  auto v = parse_decimal(s, max);
  if (!v) return fail(Errc::InvalidArgument, bad(path, s, "not a decimal number up to " + std::to_string(max)));
  if (*v < min) return fail(Errc::InvalidArgument, bad(path, s, "must be at least " + std::to_string(min)));
  return *v;
}

// Every byte of [first, last] within rel32 reach of `text`: a jmp rel32 from a slot back to
// the kernel (and a RIP-relative operand aimed at the kernel) must be encodable. The x86
// relocator still checks each displacement exactly; this refuses areas where no slot could.
bool within_rel32(std::uint64_t first, std::uint64_t last, std::uint64_t text) {
  auto lo = static_cast<std::int64_t>(first - text);
  auto hi = static_cast<std::int64_t>(last - text);
  return lo >= std::numeric_limits<std::int32_t>::min() && hi <= std::numeric_limits<std::int32_t>::max();
}

}  // namespace

std::optional<std::uint64_t> parse_decimal(std::string_view s, std::uint64_t max) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  if (s.size() > 1 && s[0] == '0') return std::nullopt;  // no leading zeros (octal ambiguity)
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  if (v > max) return std::nullopt;
  return v;
}

std::optional<std::uint64_t> parse_hex(std::string_view s) {
  if (s.size() < 3 || s.size() > 18 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s.substr(2)) {
    unsigned d;
    if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
    else return std::nullopt;
    v = (v << 4) | d;  // at most 16 digits: cannot overflow
  }
  return v;
}

std::string sanitize(std::string_view s) {
  constexpr std::size_t kMax = 40;
  std::string out;
  for (char c : s.substr(0, kMax)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > kMax) out += "...";
  return out;
}

std::string module_dir(DomId dom) { return "/local/domain/" + std::to_string(dom.value) + "/" XENPROBES_XS_DIR; }

std::string module_key(DomId dom, std::string_view key) { return module_dir(dom) + "/" + std::string(key); }

Result<ModuleInfo> read_module_info(hv::Hypervisor& hv, DomId dom, const CheckMapped& check_mapped,
                                    const ModuleInfoOptions& options) {
  if (!check_mapped) return fail(Errc::InvalidArgument, "read_module_info: no check_mapped callback");
  const std::string domstr = std::to_string(dom.value);
  ModuleInfo info;

  // version: its absence means the module is not loaded at all.
  const std::string vpath = module_key(dom, XENPROBES_XS_VERSION);
  auto vs = hv.xs_read(vpath);
  if (!vs) {
    if (vs.error().code == Errc::NotFound)
      return fail(Errc::NotFound, "the guest module xenprobesU is not loaded in domain " + domstr + " (no " + vpath +
                                      "): load it in the guest (insmod xenprobesU.ko), or use the agentless vmevent "
                                      "channel in int3 mode, which needs no out-of-line execution area (HVM/PVH only)");
    return fail(vs.error().code, "reading xenstore key " + vpath + ": " + vs.error().what);
  }
  auto version = parse_decimal(*vs, std::numeric_limits<unsigned>::max());
  if (!version) return fail(Errc::InvalidArgument, bad(vpath, *vs, "not a decimal protocol version"));
  if (*version != XENPROBES_PROTOCOL_VERSION)
    return fail(Errc::NotSupported, "guest module speaks protocol " + std::to_string(*version) +
                                        ", this library speaks " + std::to_string(XENPROBES_PROTOCOL_VERSION) +
                                        ": install matching versions of xenprobesU and libxenprobes");
  info.version = static_cast<unsigned>(*version);

  // state: written last by the module, so checking it before the rest avoids half a set.
  const std::string spath = module_key(dom, XENPROBES_XS_STATE);
  auto st = hv.xs_read(spath);
  if (!st) {
    if (st.error().code == Errc::NotFound)
      return fail(Errc::Again,
                  "guest module not ready in domain " + domstr + " (no " + spath + " yet): watch it and retry");
    return fail(st.error().code, "reading xenstore key " + spath + ": " + st.error().what);
  }
  if (*st != XENPROBES_XS_STATE_READY)
    return fail(Errc::Again, "guest module not ready in domain " + domstr + " (" + spath + " = '" + sanitize(*st) +
                                 "'): watch it and retry");

  // kernel-text: canonical upper half, page aligned, and the guard above it must not wrap.
  const std::string tpath = module_key(dom, XENPROBES_XS_KERNEL_TEXT);
  auto ts = XP_TRY(read_required(hv, tpath));
  auto text = parse_hex(ts);
  if (!text) return fail(Errc::InvalidArgument, bad(tpath, ts, "not a 0x-prefixed 64-bit hex address"));
  if (*text < kUpperHalfStart)
    return fail(Errc::InvalidArgument, bad(tpath, ts, "not a canonical kernel (upper-half) address"));
  if (*text % kPageSize) return fail(Errc::InvalidArgument, bad(tpath, ts, "not page aligned"));
  if (options.kernel_text_guard > std::numeric_limits<std::uint64_t>::max() - *text)
    return fail(Errc::InvalidArgument, bad(tpath, ts, "too close to the top of the address space"));
  info.kernel_text = Gva{*text};

  // release: printable, bounded (it ends up in messages and in System.map lookups).
  const std::string rpath = module_key(dom, XENPROBES_XS_RELEASE);
  auto rel = XP_TRY(read_required(hv, rpath));
  if (rel.empty() || rel.size() > kMaxReleaseLen ||
      !std::all_of(rel.begin(), rel.end(), [](char c) { return c > 0x20 && c < 0x7f; }))
    return fail(Errc::InvalidArgument, bad(rpath, rel,
                                           "not a kernel release (1.." + std::to_string(kMaxReleaseLen) +
                                               " printable characters, no blanks)"));
  info.release = std::move(rel);

  info.nr_cpus = static_cast<unsigned>(XP_TRY(read_decimal(hv, module_key(dom, XENPROBES_XS_NR_CPUS), 1, kMaxNrCpus)));
  auto count = XP_TRY(read_decimal(hv, module_key(dom, XENPROBES_XS_OEA_COUNT), 1, XENPROBES_OEA_MAX_AREAS));

  const std::uint64_t guard_first = *text, guard_last = *text + options.kernel_text_guard - 1;
  for (unsigned i = 0; i < count; ++i) {
    char key[64];
    std::snprintf(key, sizeof key, XENPROBES_XS_OEA_ADDR_FMT, i);
    const std::string apath = module_key(dom, key);
    std::snprintf(key, sizeof key, XENPROBES_XS_OEA_SIZE_FMT, i);
    const std::string zpath = module_key(dom, key);
    auto as = XP_TRY(read_required(hv, apath));
    auto zs = XP_TRY(read_required(hv, zpath));

    auto addr = parse_hex(as);
    if (!addr) return fail(Errc::InvalidArgument, bad(apath, as, "not a 0x-prefixed 64-bit hex address"));
    auto size = parse_decimal(zs, std::numeric_limits<std::uint64_t>::max());
    if (!size) return fail(Errc::InvalidArgument, bad(zpath, zs, "not a decimal size"));
    if (*size == 0 || *size % kPageSize)
      return fail(Errc::InvalidArgument, bad(zpath, zs, "not a nonzero multiple of 4096"));
    if (*size > XENPROBES_OEA_MAX_SIZE)
      return fail(Errc::InvalidArgument,
                  bad(zpath, zs, "larger than " + std::to_string(XENPROBES_OEA_MAX_SIZE) + " bytes"));
    if (*addr % kPageSize) return fail(Errc::InvalidArgument, bad(apath, as, "not page aligned"));
    if (*size - 1 > std::numeric_limits<std::uint64_t>::max() - *addr)
      return fail(Errc::InvalidArgument, bad(apath, as, "area of " + zs + " bytes wraps around the address space"));
    const OeaArea area{Gva{*addr}, *size};
    if (*addr < kUpperHalfStart)
      return fail(Errc::InvalidArgument, bad(apath, as, "not a canonical kernel (upper-half) address"));
    if (!within_rel32(*addr, area.last(), *text))
      return fail(Errc::InvalidArgument,
                  bad(apath, as,
                      "area [" + hex(*addr) + ", " + hex(area.last()) +
                          "] is not entirely within +-2 GiB (rel32) of kernel text " + hex(*text)));
    if (ranges_overlap(*addr, area.last(), guard_first, guard_last))
      return fail(Errc::InvalidArgument,
                  bad(apath, as, "area overlaps the kernel image [" + hex(guard_first) + ", " + hex(guard_last) + "]"));
    for (unsigned j = 0; j < info.areas.size(); ++j) {
      const auto& o = info.areas[j];
      if (ranges_overlap(*addr, area.last(), o.addr.value, o.last()))
        return fail(Errc::InvalidArgument, bad(apath, as, "area overlaps oea/" + std::to_string(j)));
    }
    for (std::uint64_t off = 0; off < *size; off += kPageSize) {
      if (auto r = check_mapped(Gva{*addr + off}); !r)
        return fail(Errc::Fault, bad(apath, as, "page " + hex(*addr + off) + " is not usable: " + r.error().what));
    }
    info.areas.push_back(area);
  }

  // module-text: optional (older modules publish none), but both keys or neither.
  auto read_optional = [&](const std::string& path) -> Result<std::optional<std::string>> {
    auto v = hv.xs_read(path);
    if (v) return std::optional<std::string>(std::move(*v));
    if (v.error().code == Errc::NotFound) return std::optional<std::string>();
    return fail(v.error().code, "reading xenstore key " + path + ": " + v.error().what);
  };
  const std::string mspath = module_key(dom, XENPROBES_XS_MODULE_TEXT_START);
  const std::string mepath = module_key(dom, XENPROBES_XS_MODULE_TEXT_END);
  auto mss = XP_TRY(read_optional(mspath));
  auto mes = XP_TRY(read_optional(mepath));
  if (mss || mes) {
    if (!mss || !mes)
      return fail(Errc::NotFound, "xenstore key " + (mss ? mepath : mspath) + " is missing although " +
                                      (mss ? mspath : mepath) +
                                      " is there: the guest module publishes both or neither; reload it");
    auto start = parse_hex(*mss);
    if (!start) return fail(Errc::InvalidArgument, bad(mspath, *mss, "not a 0x-prefixed 64-bit hex address"));
    auto end = parse_hex(*mes);
    if (!end) return fail(Errc::InvalidArgument, bad(mepath, *mes, "not a 0x-prefixed 64-bit hex address"));
    if (*start < kUpperHalfStart)
      return fail(Errc::InvalidArgument, bad(mspath, *mss, "not a canonical kernel (upper-half) address"));
    if (*end < kUpperHalfStart)
      return fail(Errc::InvalidArgument, bad(mepath, *mes, "not a canonical kernel (upper-half) address"));
    if (*end <= *start)
      return fail(Errc::InvalidArgument,
                  bad(mepath, *mes,
                      "not above " + std::string(XENPROBES_XS_MODULE_TEXT_START) + " " + hex(*start) +
                          " (the end is one past the last byte of the module's text)"));
    if (*end - *start > kMaxModuleText)
      return fail(Errc::InvalidArgument,
                  bad(mepath, *mes,
                      "module text of " + std::to_string(*end - *start) + " bytes from " + hex(*start) +
                          ", more than " + std::to_string(kMaxModuleText) + " bytes: not a module's text"));
    if (options.kernel_text_guard && ranges_overlap(*start, *end - 1, guard_first, guard_last))
      return fail(Errc::InvalidArgument,
                  bad(mspath, *mss,
                      "module text [" + hex(*start) + ", " + hex(*end) + ") overlaps the kernel image [" +
                          hex(guard_first) + ", " + hex(guard_last) + "]"));
    info.module_text_start = Gva{*start};
    info.module_text_end = Gva{*end};
  }

  // fixup-slots: optional (older modules publish none), all three keys or none, and only with
  // module-text, which must hold the slots (they are the module's code for the kernel's fault
  // handling: it finds their entries by the module that holds the faulting address).
  const std::string fapath = module_key(dom, XENPROBES_XS_FIXUP_SLOTS_ADDR);
  const std::string fcpath = module_key(dom, XENPROBES_XS_FIXUP_SLOTS_COUNT);
  const std::string ftpath = module_key(dom, XENPROBES_XS_FIXUP_SLOTS_TABLE);
  auto fas = XP_TRY(read_optional(fapath));
  auto fcs = XP_TRY(read_optional(fcpath));
  auto fts = XP_TRY(read_optional(ftpath));
  if (fas || fcs || fts) {
    if (!fas || !fcs || !fts)
      return fail(Errc::NotFound, "the guest module published only some of " + fapath + ", " + fcpath + " and " +
                                      ftpath + ": it publishes all three or none; reload it");
    auto addr = parse_hex(*fas);
    if (!addr) return fail(Errc::InvalidArgument, bad(fapath, *fas, "not a 0x-prefixed 64-bit hex address"));
    auto count = parse_decimal(*fcs, XENPROBES_FIXUP_SLOTS_MAX);
    if (!count || *count == 0)
      return fail(Errc::InvalidArgument,
                  bad(fcpath, *fcs, "not a decimal count 1.." + std::to_string(XENPROBES_FIXUP_SLOTS_MAX)));
    auto table = parse_hex(*fts);
    if (!table) return fail(Errc::InvalidArgument, bad(ftpath, *fts, "not a 0x-prefixed 64-bit hex address"));
    const std::uint64_t bytes = *count * XENPROBES_FIXUP_SLOT_SIZE, tbytes = *count * XENPROBES_FIXUP_ENTRY_SIZE;
    if (*addr % kPageSize) return fail(Errc::InvalidArgument, bad(fapath, *fas, "not page aligned"));
    if (!info.has_module_text() || *addr < info.module_text_start.value || bytes > info.module_text_end.value - *addr)
      return fail(
          Errc::InvalidArgument,
          bad(fapath, *fas,
              std::to_string(*count) + " slots from " + hex(*addr) + " are not inside the module's published text" +
                  (info.has_module_text()
                       ? " [" + hex(info.module_text_start.value) + ", " + hex(info.module_text_end.value) + ")"
                       : std::string(" (module-text is missing)"))));
    for (unsigned j = 0; j < info.areas.size(); ++j)
      if (ranges_overlap(*addr, *addr + bytes - 1, info.areas[j].addr.value, info.areas[j].last()))
        return fail(Errc::InvalidArgument, bad(fapath, *fas, "the slots overlap oea/" + std::to_string(j)));
    if (*table < kUpperHalfStart || *table % 4 || tbytes - 1 > std::numeric_limits<std::uint64_t>::max() - *table)
      return fail(Errc::InvalidArgument,
                  bad(ftpath, *fts,
                      "not a 4-byte aligned upper-half address with room for " + std::to_string(*count) + " entries"));
    // Each entry's offsets (s32) must reach its slot and the kernel's text.
    if (!within_rel32(*table, *table + tbytes - 1, *addr) || !within_rel32(*table, *table + tbytes - 1, *text))
      return fail(Errc::InvalidArgument,
                  bad(ftpath, *fts, "the entries are not within +-2 GiB (rel32) of the slots and of kernel text"));
    if (ranges_overlap(*table, *table + tbytes - 1, *addr, *addr + bytes - 1))
      return fail(Errc::InvalidArgument, bad(ftpath, *fts, "the entries overlap the slots"));
    // Dom0 writes slot code into the OEA areas and entries here: one byte in both would let
    // an entry write land in a slot.
    for (unsigned j = 0; j < info.areas.size(); ++j)
      if (ranges_overlap(*table, *table + tbytes - 1, info.areas[j].addr.value, info.areas[j].last()))
        return fail(Errc::InvalidArgument, bad(ftpath, *fts, "the entries overlap oea/" + std::to_string(j)));
    for (std::uint64_t off = 0; off < bytes; off += kPageSize)
      if (auto r = check_mapped(Gva{*addr + off}); !r)
        return fail(Errc::Fault, bad(fapath, *fas, "page " + hex(*addr + off) + " is not usable: " + r.error().what));
    info.fixup_slots = FixupSlots{Gva{*addr}, static_cast<unsigned>(*count), Gva{*table}};
  }

  // jump-entry: optional (older modules make no jump probes), only with module-text, which must
  // hold it (it is the module's code), outside every area Dom0 writes (the OEA, the fixup slots
  // and their entries), and within rel32 reach of every OEA area (a detour calls it from there).
  const std::string jpath = module_key(dom, XENPROBES_XS_JUMP_ENTRY);
  if (auto js = XP_TRY(read_optional(jpath))) {
    auto entry = parse_hex(*js);
    if (!entry) return fail(Errc::InvalidArgument, bad(jpath, *js, "not a 0x-prefixed 64-bit hex address"));
    if (!info.has_module_text() || !info.in_module_text(Gva{*entry}))
      return fail(Errc::InvalidArgument,
                  bad(jpath, *js,
                      "not inside the module's published text" +
                          (info.has_module_text()
                               ? " [" + hex(info.module_text_start.value) + ", " + hex(info.module_text_end.value) + ")"
                               : std::string(" (module-text is missing)"))));
    for (unsigned j = 0; j < info.areas.size(); ++j) {
      if (info.areas[j].contains(Gva{*entry}))
        return fail(Errc::InvalidArgument, bad(jpath, *js, "inside oea/" + std::to_string(j) + ", where Dom0 writes"));
      if (!within_rel32(info.areas[j].addr.value, info.areas[j].last(), *entry))
        return fail(
            Errc::InvalidArgument,
            bad(jpath, *js, "not within +-2 GiB (rel32) of oea/" + std::to_string(j) + ", where detours call it from"));
    }
    if (const auto& f = info.fixup_slots) {
      const std::uint64_t e = *entry;
      if (f->contains(Gva{e}) ||
          (e >= f->table.value && e - f->table.value < std::uint64_t{f->count} * XENPROBES_FIXUP_ENTRY_SIZE))
        return fail(Errc::InvalidArgument,
                    bad(jpath, *js, "inside the fixup slots or their entries, where Dom0 writes"));
    }
    info.jump_entry = Gva{*entry};
  }
  return info;
}

Result<GuestChannelInfo> read_guest_channel_info(hv::Hypervisor& hv, DomId dom, const ModuleInfo& info,
                                                 const ModuleInfoOptions& options) {
  const std::string domstr = std::to_string(dom.value);
  GuestChannelInfo ch;

  // control/addr: its absence alone means "a module without the guest channel", not an error
  // in what it published.
  const std::string apath = module_key(dom, XENPROBES_XS_CONTROL_ADDR);
  auto as = hv.xs_read(apath);
  if (!as) {
    if (as.error().code == Errc::NotFound)
      return fail(Errc::NotFound, "the guest module in domain " + domstr + " publishes no " + apath +
                                      ": it predates the guest channel (a module speaking protocol " +
                                      std::to_string(XENPROBES_PROTOCOL_VERSION) +
                                      " with the guest channel publishes control/addr, control/pages and evtchn); "
                                      "install the current xenprobesU in the guest, or use the debugger channel "
                                      "(a Xen with CONFIG_GDBSX) or, for HVM/PVH guests, the vmevent channel");
    return fail(as.error().code, "reading xenstore key " + apath + ": " + as.error().what);
  }
  const std::string ppath = module_key(dom, XENPROBES_XS_CONTROL_PAGES);
  const std::string epath = module_key(dom, XENPROBES_XS_EVTCHN);

  auto addr = parse_hex(*as);
  if (!addr) return fail(Errc::InvalidArgument, bad(apath, *as, "not a 0x-prefixed 64-bit hex address"));
  if (*addr < kUpperHalfStart)
    return fail(Errc::InvalidArgument, bad(apath, *as, "not a canonical kernel (upper-half) address"));
  if (*addr % kPageSize) return fail(Errc::InvalidArgument, bad(apath, *as, "not page aligned"));
  ch.control = Gva{*addr};

  ch.pages = static_cast<unsigned>(XP_TRY(read_decimal(hv, ppath, 1, XENPROBES_CTL_MAX_PAGES)));
  if (ch.size() - 1 > std::numeric_limits<std::uint64_t>::max() - *addr)
    return fail(Errc::InvalidArgument,
                bad(apath, *as, "area of " + std::to_string(ch.pages) + " pages wraps around the address space"));
  if (options.kernel_text_guard > std::numeric_limits<std::uint64_t>::max() - info.kernel_text.value)
    return fail(Errc::InvalidArgument, "kernel text " + hex(info.kernel_text.value) + " too close to the top");
  const std::uint64_t guard_first = info.kernel_text.value;
  const std::uint64_t guard_last = guard_first + options.kernel_text_guard - 1;
  if (options.kernel_text_guard && ranges_overlap(*addr, ch.last(), guard_first, guard_last))
    return fail(
        Errc::InvalidArgument,
        bad(apath, *as, "control area overlaps the kernel image [" + hex(guard_first) + ", " + hex(guard_last) + "]"));
  for (std::size_t j = 0; j < info.areas.size(); ++j) {
    const auto& o = info.areas[j];
    // Dom0 writes the control area and executes nothing from it; the OEA holds slot code
    // Dom0 wrote: one page in both would let a table write land in a slot.
    if (ranges_overlap(*addr, ch.last(), o.addr.value, o.last()))
      return fail(Errc::InvalidArgument, bad(apath, *as, "control area overlaps oea/" + std::to_string(j)));
  }
  // Nor the fixup slots or their exception-table entries, which Dom0 writes too.
  if (const auto& f = info.fixup_slots) {
    const std::uint64_t n = f->count;
    if (ranges_overlap(*addr, ch.last(), f->addr.value, f->addr.value + n * XENPROBES_FIXUP_SLOT_SIZE - 1))
      return fail(Errc::InvalidArgument, bad(apath, *as, "control area overlaps the fixup slots"));
    if (ranges_overlap(*addr, ch.last(), f->table.value, f->table.value + n * XENPROBES_FIXUP_ENTRY_SIZE - 1))
      return fail(Errc::InvalidArgument, bad(apath, *as, "control area overlaps the fixup slots' entries"));
  }

  ch.evtchn = static_cast<std::uint32_t>(XP_TRY(read_decimal(hv, epath, 1, kMaxEvtchnPort)));

  ch.features = XP_TRY(read_features(hv, dom));
  return ch;
}

Result<std::uint32_t> read_features(hv::Hypervisor& hv, DomId dom) {
  // Absent is an older module; malformed refuses, as every key does.
  const std::string fpath = module_key(dom, XENPROBES_XS_FEATURES);
  auto fs = hv.xs_read(fpath);
  if (!fs) {
    if (fs.error().code == Errc::NotFound) return 0u;
    return fail(fs.error().code, "reading xenstore key " + fpath + ": " + fs.error().what);
  }
  auto f = parse_hex(*fs);
  if (!f) return fail(Errc::InvalidArgument, bad(fpath, *fs, "not a 0x-prefixed hex number"));
  // The bits Dom0 knows.
  return static_cast<std::uint32_t>(*f & (XENPROBES_FEATURE_RET_WRITE | XENPROBES_FEATURE_JUMP_ISLAND));
}

Result<std::optional<RingsInfo>> read_rings_info(hv::Hypervisor& hv, DomId dom, const ModuleInfo& info,
                                                 const ModuleInfoOptions& options) {
  const std::string apath = module_key(dom, XENPROBES_XS_RINGS_ADDR);
  const std::string cpath = module_key(dom, XENPROBES_XS_RINGS_COUNT);
  const std::string opath = module_key(dom, XENPROBES_XS_RINGS_ORDER);
  std::optional<std::string> vals[3];
  const std::string* paths[3] = {&apath, &cpath, &opath};
  for (int k = 0; k < 3; ++k) {
    auto v = hv.xs_read(*paths[k]);
    if (v) {
      vals[k] = std::move(*v);
    } else if (v.error().code != Errc::NotFound) {
      return fail(v.error().code, "reading xenstore key " + *paths[k] + ": " + v.error().what);
    }
  }
  if (!vals[0] && !vals[1] && !vals[2]) return std::optional<RingsInfo>{};
  for (int k = 0; k < 3; ++k)
    if (!vals[k])
      return fail(Errc::InvalidArgument, "xenstore key " + *paths[k] +
                                             " is missing while the guest module publishes other rings/* keys: "
                                             "rings/addr, rings/count and rings/order come together");
  RingsInfo r;
  auto addr = parse_hex(*vals[0]);
  if (!addr) return fail(Errc::InvalidArgument, bad(apath, *vals[0], "not a 0x-prefixed 64-bit hex address"));
  auto count = parse_decimal(*vals[1], info.nr_cpus);
  if (!count || *count == 0)
    return fail(Errc::InvalidArgument,
                bad(cpath, *vals[1], "not a decimal number in 1..nr-cpus (" + std::to_string(info.nr_cpus) + ")"));
  auto order = parse_decimal(*vals[2], XENPROBES_RING_MAX_ORDER);
  if (!order || *order < XENPROBES_RING_MIN_ORDER)
    return fail(Errc::InvalidArgument, bad(opath, *vals[2],
                                           "not a decimal number in " + std::to_string(XENPROBES_RING_MIN_ORDER) +
                                               ".." + std::to_string(XENPROBES_RING_MAX_ORDER)));
  r.addr = Gva{*addr};
  r.count = static_cast<unsigned>(*count);
  r.order = static_cast<unsigned>(*order);
  const std::string fpath = module_key(dom, XENPROBES_XS_RINGS_CAP_FLAGS);
  if (auto f = hv.xs_read(fpath)) {
    auto flags = parse_hex(*f);
    if (!flags || *flags > 0xff) return fail(Errc::InvalidArgument, bad(fpath, *f, "not a 0x-prefixed hex byte"));
    r.cap_flags |= static_cast<std::uint32_t>(*flags) & XENPROBES_CAP_AUTO;
  } else if (f.error().code != Errc::NotFound) {
    return fail(f.error().code, "reading xenstore key " + fpath + ": " + f.error().what);
  }
  if (r.bytes() > kMaxRingsBytes)
    return fail(Errc::InvalidArgument,
                bad(cpath, *vals[1],
                    std::to_string(r.count) + " rings of 2^" + std::to_string(r.order) + " bytes are more than " +
                        std::to_string(kMaxRingsBytes >> 20) + " MiB in all"));
  const std::uint64_t first = r.addr.value, last = first + r.bytes() - 1;
  if (first < kUpperHalfStart || first % kPageSize || last < first)
    return fail(Errc::InvalidArgument, bad(apath, *vals[0],
                                           "not a page-aligned upper-half address with room for " +
                                               std::to_string(r.bytes()) + " bytes of rings"));
  const std::uint64_t kt = info.kernel_text.value;
  if (ranges_overlap(first, last, kt, kt + options.kernel_text_guard - 1))
    return fail(Errc::InvalidArgument, bad(apath, *vals[0], "the rings overlap the kernel's text"));
  if (info.has_module_text() &&
      ranges_overlap(first, last, info.module_text_start.value, info.module_text_end.value - 1))
    return fail(Errc::InvalidArgument, bad(apath, *vals[0], "the rings overlap the module's text"));
  for (unsigned j = 0; j < info.areas.size(); ++j)
    if (ranges_overlap(first, last, info.areas[j].addr.value, info.areas[j].last()))
      return fail(Errc::InvalidArgument, bad(apath, *vals[0], "the rings overlap oea/" + std::to_string(j)));
  return std::optional<RingsInfo>{r};
}

Result<std::vector<OeaArea>> added_areas(const ModuleInfo& fresh, std::span<const OeaArea> known) {
  if (fresh.areas.size() < known.size())
    return fail(Errc::Io, "the guest module now publishes " + std::to_string(fresh.areas.size()) +
                              " out-of-line execution areas, " + std::to_string(known.size()) +
                              " were known: published areas must never disappear");
  for (std::size_t i = 0; i < known.size(); ++i)
    if (!(fresh.areas[i] == known[i]))
      return fail(Errc::Io, "the guest module moved out-of-line execution area oea/" + std::to_string(i) + " from " +
                                hex(known[i].addr.value) + " (" + std::to_string(known[i].size) + " bytes) to " +
                                hex(fresh.areas[i].addr.value) + " (" + std::to_string(fresh.areas[i].size) +
                                " bytes)");
  return std::vector<OeaArea>(fresh.areas.begin() + static_cast<std::ptrdiff_t>(known.size()), fresh.areas.end());
}

Result<void> request_growth(hv::Hypervisor& hv, DomId dom, std::size_t bytes) {
  if (bytes == 0 || bytes > XENPROBES_OEA_MAX_SIZE)
    return fail(Errc::InvalidArgument, "an out-of-line execution area grows by 1.." +
                                           std::to_string(XENPROBES_OEA_MAX_SIZE) + " bytes, not " +
                                           std::to_string(bytes));
  const std::uint64_t rounded = (bytes + kPageSize - 1) / kPageSize * kPageSize;
  if (auto r = hv.xs_rm(module_key(dom, XENPROBES_XS_OEA_ERROR)); !r && r.error().code != Errc::NotFound)
    return fail(r.error().code, "clearing " + module_key(dom, XENPROBES_XS_OEA_ERROR) + ": " + r.error().what);
  const std::string path = module_key(dom, XENPROBES_XS_OEA_REQUEST);
  if (auto r = hv.xs_write(path, std::to_string(rounded)); !r)
    return fail(r.error().code, "asking the guest module for a larger area (" + path + "): " + r.error().what);
  return {};
}

CheckMapped check_mapped_via(mem::GuestMemory& memory) {
  return [&memory](Gva page) -> Result<void> {
    auto t = memory.translate(page);
    if (!t) return std::unexpected(std::move(t.error()));
    if (t->nx) return fail(Errc::Fault, "mapped no-execute (NX)");
    return {};
  };
}

}  // namespace xenprobes::guestmod

// Fuzz target: the guest module's xenstore keys (guestmod/module_info.cpp). The guest writes its
// own /local/domain/<id>/data/xenprobes subtree, so every value is hostile.
//
// Input: text, one directive per line (a seed is a readable key set, see corpus/module_info):
//   key=value      the module's key (relative to its directory; "/abs/path=value" for others)
//   !key           xs_read of that key fails with EIO
//   -0x<page>      check_mapped refuses that page
//   @guard=<n>     ModuleInfoOptions::kernel_text_guard
//   @grow=<n>      request_growth(n) afterwards
//   @known=<n>     added_areas() against the first n areas read (@moved: one of them moved)
// Invariants: whatever the keys, read_module_info either fails with a documented code and a
// printable message, or returns values that obey every rule of protocol.h; the same for
// read_guest_channel_info; added_areas and request_growth keep their contracts; the strict
// parsers agree with a reference parser.
#include <charconv>
#include <cinttypes>
#include <limits>

#include "fuzz/fuzz_common.hpp"
#include "guestmod/module_info.hpp"
#include "xenprobes/protocol.h"

using namespace xenprobes;
using namespace xenprobes::guestmod;
using fuzz::printable;

namespace {

bool overlaps(std::uint64_t a0, std::uint64_t a1, std::uint64_t b0, std::uint64_t b1) { return a0 <= b1 && b0 <= a1; }

// Reference parsers, written apart from module_info.cpp's.
std::optional<std::uint64_t> ref_decimal(std::string_view s, std::uint64_t max) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  if (!std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 10);
  if (ec != std::errc{} || p != s.data() + s.size() || v > max) return std::nullopt;
  return v;
}
std::optional<std::uint64_t> ref_hex(std::string_view s) {
  if (s.size() < 3 || s.size() > 18 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return std::nullopt;
  s.remove_prefix(2);
  if (!std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
    return std::nullopt;
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

void check_parsers(std::string_view s, std::uint64_t max) {
  FUZZ_CHECK(parse_decimal(s, max) == ref_decimal(s, max), "parse_decimal('" + sanitize(s) + "')");
  FUZZ_CHECK(parse_hex(s) == ref_hex(s), "parse_hex('" + sanitize(s) + "')");
  const std::string z = sanitize(s);
  FUZZ_CHECK(printable(z) && z.size() <= 43, "sanitize gave '" + z + "'");
}

void check_error(const Error& e, std::initializer_list<Errc> allowed) {
  FUZZ_CHECK(std::find(allowed.begin(), allowed.end(), e.code) != allowed.end(),
             "unexpected code " + std::to_string(static_cast<int>(e.code)) + ": " + e.what);
  FUZZ_CHECK(!e.what.empty());
  FUZZ_CHECK(printable(e.what), "hostile bytes in the message: " + sanitize(e.what));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  if (size > 8192) return 0;
  const DomId dom{7};
  fuzz::FakeHv hv;
  hv.add_domain(dom, hv::GuestType::Pv, 1);
  ModuleInfoOptions opts;
  std::set<std::uint64_t> unmapped;
  std::optional<std::uint64_t> grow, known_n;
  bool moved = false;

  std::string_view text(reinterpret_cast<const char*>(data), size);
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (line.empty()) continue;
    const std::size_t eq = line.find('=');
    const std::string_view key = line.substr(0, eq), value = eq == std::string_view::npos ? "" : line.substr(eq + 1);
    check_parsers(value, std::numeric_limits<std::uint64_t>::max());
    check_parsers(value, kMaxNrCpus);
    if (line[0] == '!') {
      hv.xs_read_fails[module_key(dom, line.substr(1))] = Errc::Io;
    } else if (line[0] == '-') {
      if (auto p = parse_hex(line.substr(1))) unmapped.insert(*p);
    } else if (key == "@guard") {
      if (auto g = parse_decimal(value, ~0ull)) opts.kernel_text_guard = *g;
    } else if (key == "@grow") {
      grow = parse_decimal(value, ~0ull).value_or(0);
    } else if (key == "@known") {
      known_n = parse_decimal(value, 64).value_or(0);
    } else if (key == "@moved") {
      moved = true;
    } else if (eq != std::string_view::npos) {
      if (key.starts_with("/")) hv.xs[std::string(key)] = std::string(value);
      else hv.xs[module_key(dom, key)] = std::string(value);
    }
  }

  std::vector<std::uint64_t> checked;
  CheckMapped cm = [&](Gva page) -> Result<void> {
    checked.push_back(page.value);
    if (unmapped.contains(page.value)) return fail(Errc::Fault, "not mapped (fuzz)");
    return {};
  };
  auto r = read_module_info(hv, dom, cm, opts);
  if (!r) {
    check_error(r.error(),
                {Errc::NotFound, Errc::NotSupported, Errc::Again, Errc::InvalidArgument, Errc::Fault, Errc::Io});
  } else {
    const ModuleInfo& m = *r;
    const std::uint64_t text0 = m.kernel_text.value;
    FUZZ_CHECK(m.version == XENPROBES_PROTOCOL_VERSION);
    FUZZ_CHECK(text0 >= kUpperHalfStart && text0 % kPageSize == 0);
    FUZZ_CHECK(opts.kernel_text_guard <= ~0ull - text0);
    FUZZ_CHECK(!m.release.empty() && m.release.size() <= kMaxReleaseLen);
    FUZZ_CHECK(std::all_of(m.release.begin(), m.release.end(), [](char c) { return c > 0x20 && c < 0x7f; }));
    FUZZ_CHECK(m.nr_cpus >= 1 && m.nr_cpus <= kMaxNrCpus);
    FUZZ_CHECK(!m.areas.empty() && m.areas.size() <= XENPROBES_OEA_MAX_AREAS);
    const std::uint64_t g0 = text0, g1 = text0 + opts.kernel_text_guard - 1;
    std::size_t pages = 0;
    for (std::size_t i = 0; i < m.areas.size(); ++i) {
      const OeaArea& a = m.areas[i];
      FUZZ_CHECK(a.size > 0 && a.size % kPageSize == 0 && a.size <= XENPROBES_OEA_MAX_SIZE);
      FUZZ_CHECK(a.addr.value % kPageSize == 0 && a.addr.value >= kUpperHalfStart);
      FUZZ_CHECK(a.size - 1 <= ~0ull - a.addr.value, "area wraps");
      const auto lo = static_cast<std::int64_t>(a.addr.value - text0), hi = static_cast<std::int64_t>(a.last() - text0);
      FUZZ_CHECK(lo >= std::numeric_limits<std::int32_t>::min() && hi <= std::numeric_limits<std::int32_t>::max(),
                 "area out of rel32 reach");
      FUZZ_CHECK(opts.kernel_text_guard == 0 || !overlaps(a.addr.value, a.last(), g0, g1), "area in the guard");
      for (std::size_t j = 0; j < i; ++j)
        FUZZ_CHECK(!overlaps(a.addr.value, a.last(), m.areas[j].addr.value, m.areas[j].last()), "areas overlap");
      for (std::uint64_t off = 0; off < a.size; off += kPageSize) {
        FUZZ_CHECK(!unmapped.contains(a.addr.value + off), "an unmapped page was accepted");
        ++pages;
      }
    }
    FUZZ_CHECK(checked.size() == pages, "every page checked once");
    if (m.has_module_text()) {
      FUZZ_CHECK(m.module_text_start.value >= kUpperHalfStart && m.module_text_end.value > m.module_text_start.value);
      FUZZ_CHECK(m.module_text_end.value - m.module_text_start.value <= kMaxModuleText);
      FUZZ_CHECK(opts.kernel_text_guard == 0 ||
                 !overlaps(m.module_text_start.value, m.module_text_end.value - 1, g0, g1));
      FUZZ_CHECK(m.in_module_text(m.module_text_start) && !m.in_module_text(m.module_text_end));
    } else {
      FUZZ_CHECK(m.module_text_start.value == 0 && m.module_text_end.value == 0);
    }

    auto ch = read_guest_channel_info(hv, dom, m, opts);
    if (!ch) {
      check_error(ch.error(), {Errc::NotFound, Errc::InvalidArgument, Errc::Io});
    } else {
      FUZZ_CHECK(ch->control.value >= kUpperHalfStart && ch->control.value % kPageSize == 0);
      FUZZ_CHECK(ch->pages >= 1 && ch->pages <= XENPROBES_CTL_MAX_PAGES);
      FUZZ_CHECK(ch->size() - 1 <= ~0ull - ch->control.value, "control area wraps");
      FUZZ_CHECK(ch->evtchn >= 1 && ch->evtchn <= kMaxEvtchnPort);
      FUZZ_CHECK(opts.kernel_text_guard == 0 || !overlaps(ch->control.value, ch->last(), g0, g1));
      for (const OeaArea& a : m.areas)
        FUZZ_CHECK(!overlaps(ch->control.value, ch->last(), a.addr.value, a.last()), "control area overlaps an OEA");
    }

    // rings/*: absent (nullopt), refused, or within every bound protocol.h gives them.
    auto rings = read_rings_info(hv, dom, m, opts);
    if (!rings) {
      check_error(rings.error(), {Errc::InvalidArgument, Errc::Io});
      FUZZ_CHECK(printable(rings.error().what), "a printable reason");
    } else if (*rings) {
      const RingsInfo& ri = **rings;
      FUZZ_CHECK(ri.count >= 1 && ri.count <= m.nr_cpus);
      FUZZ_CHECK(ri.order >= XENPROBES_RING_MIN_ORDER && ri.order <= XENPROBES_RING_MAX_ORDER);
      FUZZ_CHECK(ri.bytes() <= kMaxRingsBytes);
      FUZZ_CHECK((ri.cap_flags & XENPROBES_CAP_USER) && !(ri.cap_flags & ~(XENPROBES_CAP_USER | XENPROBES_CAP_AUTO)),
                 "only the capture flags Dom0 knows");
      FUZZ_CHECK(ri.addr.value >= kUpperHalfStart && ri.addr.value % kPageSize == 0);
      FUZZ_CHECK(ri.bytes() - 1 <= ~0ull - ri.addr.value, "rings wrap");
      const std::uint64_t r0 = ri.addr.value, r1 = r0 + ri.bytes() - 1;
      FUZZ_CHECK(opts.kernel_text_guard == 0 || !overlaps(r0, r1, g0, g1), "rings in the guard");
      for (const OeaArea& a : m.areas) FUZZ_CHECK(!overlaps(r0, r1, a.addr.value, a.last()), "rings overlap an OEA");
      if (m.has_module_text())
        FUZZ_CHECK(!overlaps(r0, r1, m.module_text_start.value, m.module_text_end.value - 1), "rings in module text");
    } else {
      FUZZ_CHECK(!hv.xs.contains(module_key(dom, XENPROBES_XS_RINGS_ADDR)) &&
                     !hv.xs.contains(module_key(dom, XENPROBES_XS_RINGS_COUNT)) &&
                     !hv.xs.contains(module_key(dom, XENPROBES_XS_RINGS_ORDER)),
                 "no rings only when none of the keys is there");
    }

    if (known_n) {
      std::vector<OeaArea> known(m.areas.begin(), m.areas.begin() + std::min<std::size_t>(*known_n, m.areas.size()));
      if (*known_n > m.areas.size()) known.push_back(OeaArea{Gva{0xffffffffa0000000ull}, kPageSize});
      if (moved && !known.empty()) known.back().size += kPageSize;
      auto added = added_areas(m, known);
      const bool prefix = known.size() <= m.areas.size() && std::equal(known.begin(), known.end(), m.areas.begin());
      FUZZ_CHECK(added.has_value() == prefix, "added_areas accepts exactly a known prefix");
      if (added) {
        FUZZ_CHECK(added->size() == m.areas.size() - known.size());
        FUZZ_CHECK(
            std::equal(added->begin(), added->end(), m.areas.begin() + static_cast<std::ptrdiff_t>(known.size())));
      } else {
        check_error(added.error(), {Errc::Io});
      }
    }
  }

  // hook-path/*: read whatever the rest says (Dom0 reads it with a valid module only, but the
  // parser stands alone). Absent only without a count and a first entry; else every value
  // came from an entry below the count, in the upper half, sorted, no duplicates.
  auto hook = read_hook_path(hv, dom);
  const std::string hcount = module_key(dom, XENPROBES_XS_HOOK_PATH_COUNT);
  if (!hook) {
    check_error(hook.error(), {Errc::InvalidArgument, Errc::Io});
  } else if (!*hook) {
    FUZZ_CHECK(!hv.xs.contains(hcount) && !hv.xs.contains(module_key(dom, "hook-path/0")),
               "no hook path only when neither the count nor a first entry is there");
  } else {
    const std::vector<std::uint64_t>& h = **hook;
    const auto n = ref_decimal(hv.xs[hcount], XENPROBES_HOOK_PATH_MAX);
    FUZZ_CHECK(n.has_value(), "a count the reference parser refuses was accepted");
    FUZZ_CHECK(h.size() <= *n && h.size() <= XENPROBES_HOOK_PATH_MAX);
    FUZZ_CHECK(std::is_sorted(h.begin(), h.end()) && std::adjacent_find(h.begin(), h.end()) == h.end());
    std::set<std::uint64_t> published;
    for (unsigned i = 0; i < *n; ++i) {
      const auto v = ref_hex(hv.xs[module_key(dom, "hook-path/" + std::to_string(i))]);
      FUZZ_CHECK(v && *v >= kUpperHalfStart, "an entry the rules refuse was accepted");
      published.insert(*v);
    }
    FUZZ_CHECK(std::equal(h.begin(), h.end(), published.begin(), published.end()), "exactly the published entries");
  }

  if (grow) {
    hv.xs[module_key(dom, XENPROBES_XS_OEA_ERROR)] = "old";
    auto g = request_growth(hv, dom, *grow);
    if (*grow == 0 || *grow > XENPROBES_OEA_MAX_SIZE) {
      FUZZ_CHECK(!g && g.error().code == Errc::InvalidArgument);
    } else {
      FUZZ_CHECK(g.has_value());
      const auto req = parse_decimal(hv.xs[module_key(dom, XENPROBES_XS_OEA_REQUEST)], ~0ull);
      FUZZ_CHECK(req && *req % kPageSize == 0 && *req >= *grow && *req - *grow < kPageSize, "oea-request rounded up");
      FUZZ_CHECK(!hv.xs.contains(module_key(dom, XENPROBES_XS_OEA_ERROR)), "a stale oea-error is cleared");
    }
  }
  return 0;
}

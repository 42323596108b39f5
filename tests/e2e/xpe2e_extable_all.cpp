// xpe2e-probe safety-extable-all --domid D [--channel guest] [--timeout S] [--batch N]
//                                 [--functions F1,F2,...]
//
// Bad user pointers while every probe-able instruction of the kernel's user-access routines is
// probed (issue 12, "Shown on a real guest"), the Dom0 side of
// tools/e2e/scenarios/stock_pv_safety_extable_all.sh, a hazard class beside `safety`'s extable
// (which probes only the instructions the exception table covers in a few routines).
//
// The guest runs xpe2e-workload safety; its phase "extable-all" makes the kernel's user accesses
// fault (EFAULT from openat, uname, nanosleep and wait4 on bad pointers, a read cut short at a
// PROT_NONE page, paths ending at a page's end, execve with a bad argv and a bad argv[0], a read
// of /dev/zero cut short) and checks each outcome itself. It runs twice:
//   1. with nothing probed: the control, its result line kept;
//   2. with a probe on every instruction of kRoutines (those in this kernel), each decoded from
//      the running guest's text with Capstone (from the symbol to the next one) and asked for:
//      every registration is accepted (counted by the mode the library chose, "moved" apart) or
//      refused (counted by the rule the refusal names). The exception table (read from the
//      guest's __ex_table) says which instructions can fault into a fixup: on the guest channel
//      each must be boosted in one of the guest module's fixup slots, or refused by
//      'guest-hook-path' (the module's own int3 path, e.g. copy_from_user_nofault).
// Asserted: both runs ok=1 and their result lines identical (the guest sees what it sees
// unprobed); every refusal names its rule; every probe counts its hits exactly (handler calls
// = ProbeStats.hits, none unhandled) and the routines the phase must use were hit; every routine
// byte-identical after the unregistration; the guest alive, no module timeout, the module's
// traps cleared and its unload clean. Prints "XPE2E-SAFETY extable-all ..." tallies.
#include <cstring>
#include <deque>
#include <set>

#include "xpe2e_common.hpp"
#include "xpe2e_text.hpp"

using namespace xenprobes;
using namespace xpe2e;

namespace {

// The kernel's user-access routines: Debian 12's 6.1 (copy_user_*, clear_user_*,
// __copy_user_nocache) and Debian 13's 6.12 (rep_movs_alternative, rep_stos_alternative); the
// rest in both. A name absent from the running kernel is skipped and listed.
const char* const kRoutines[] = {
    "copy_user_generic_unrolled",
    "copy_user_generic_string",
    "copy_user_enhanced_fast_string",
    "rep_movs_alternative",
    "rep_stos_alternative",
    "clear_user_original",
    "clear_user_rep_good",
    "clear_user_erms",
    "__copy_user_nocache",
    "strncpy_from_user",
    "strnlen_user",
    "__get_user_1",
    "__get_user_2",
    "__get_user_4",
    "__get_user_8",
    "__get_user_nocheck_1",
    "__get_user_nocheck_2",
    "__get_user_nocheck_4",
    "__get_user_nocheck_8",
    "__put_user_1",
    "__put_user_2",
    "__put_user_4",
    "__put_user_8",
    "__put_user_nocheck_1",
    "__put_user_nocheck_2",
    "__put_user_nocheck_4",
    "__put_user_nocheck_8",
    "_copy_from_user",
    "_copy_to_user",
    "copy_from_user_nofault",
    "copy_to_user_nofault",
    "strncpy_from_user_nofault",
    "copy_mc_to_user",
};
// What the guest's phase cannot do without (xpe2e-workload's phase_extable_all): a path copy
// for every open and execve, the argv pointers' get_user, the argv strings' lengths, uname's
// copy out, nanosleep's copy in, wait4's put_user of the status.
const std::set<std::string> kMustHit = {"strncpy_from_user", "__get_user_8",    "strnlen_user",
                                        "_copy_to_user",     "_copy_from_user", "__put_user_4"};
constexpr std::uint64_t kMaxRoutineBytes = 16384;

struct Options {
  DomId dom{0};
  std::string channel = "guest";
  int timeout_s = 240;
  unsigned batch = 200;
  std::vector<std::string> functions;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) fatal("safety-extable-all: option " + k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--domid") o.dom = DomId{static_cast<std::uint32_t>(std::stoul(v))};
    else if (k == "--channel") o.channel = v;
    else if (k == "--timeout") o.timeout_s = std::stoi(v);
    else if (k == "--batch") o.batch = static_cast<unsigned>(std::stoul(v));
    else if (k == "--functions") {
      std::istringstream in(v);
      for (std::string f; std::getline(in, f, ',');)
        if (!f.empty()) o.functions.push_back(f);
    } else {
      fatal("safety-extable-all: unknown option " + k);
    }
  }
  if (!o.dom.value) fatal("safety-extable-all: --domid is required");
  if (!o.batch) fatal("safety-extable-all: --batch must be at least 1");
  if (o.functions.empty()) o.functions.assign(std::begin(kRoutines), std::end(kRoutines));
  return o;
}

struct Routine {
  std::string name;
  std::uint64_t start = 0, end = 0;
  std::vector<std::byte> text;              // the snapshot, taken before anything is armed
  std::vector<std::uint64_t> insns;         // instruction addresses, decoded from it
  std::set<std::uint64_t> covered;          // instructions the exception table covers
  std::uint64_t accepted = 0, refused = 0;  // registrations
  std::uint64_t covered_fixup = 0;          // covered, boosted in a fixup slot
  std::uint64_t covered_hookpath = 0;       // covered, refused by guest-hook-path
  std::string covered_bad;                  // covered and neither: what happened
};

struct Point {
  std::size_t routine = 0;
  std::uint64_t at = 0;
  Probe probe;
  std::uint64_t handler = 0;  // handler calls
};

// Sends the guest phase `i` (xpe2e-workload safety) and serves hits until its result.
std::optional<std::string> phase(Session& s, DomId dom, int i, const std::string& name, int seconds) {
  hv::Hypervisor& hv = s.hypervisor();
  must(hv.xs_write(dom_path(dom, fmt("data/xpe2e/safety/go-%d", i)), fmt("%s %d", name.c_str(), seconds)),
       "write data/xpe2e/safety/go");
  say("XPE2E-STAGE safety phase %d: %s", i, name.c_str());
  const std::string key = dom_path(dom, fmt("data/xpe2e/safety/result-%d", i));
  const auto t0 = Clock::now();
  auto last_alive = t0, last_read = t0;
  const auto end = t0 + std::chrono::seconds(seconds + 30);
  unsigned errors = 0;
  while (Clock::now() < end) {
    auto r = s.run_once(100);
    if (!r && ++errors <= 3) say("XPE2E-INFO: run_once: %s", r.error().what.c_str());
    // xenstore at most every 0.5 s while hits come (a read per hit slows the guest down).
    if (r && *r > 0 && Clock::now() - last_read < std::chrono::milliseconds(500)) continue;
    last_read = Clock::now();
    if (auto v = hv.xs_read(key)) {
      (void)s.run_once(0);
      say("XPE2E-INFO: phase %d %s: %.1f s: %s", i, name.c_str(),
          std::chrono::duration<double>(Clock::now() - t0).count(), v->c_str());
      return *v;
    }
    if (Clock::now() - last_alive > std::chrono::seconds(1)) {
      last_alive = Clock::now();
      std::string st;
      if (!domain_alive(hv, dom, &st)) {
        say("XPE2E-INFO: phase %s: the domain is not running any more (%s)", name.c_str(), st.c_str());
        return std::nullopt;
      }
    }
  }
  say("XPE2E-INFO: phase %s: no result within %d s; %s", name.c_str(), seconds + 30,
      describe(ctl_header(hv, dom)).c_str());
  return std::nullopt;
}

// The exception table's instruction addresses, from the guest's own __ex_table (entries of
// three s32: insn, fixup, data, each relative to its own field).
std::optional<std::vector<std::uint64_t>> extable(GuestView& view, const Kallsyms& ks, std::string* why) {
  auto b = ks.addr("__start___ex_table"), e = ks.addr("__stop___ex_table");
  if (!b || !e || *e <= *b || *e - *b > (16u << 20) || (*e - *b) % 12) {
    *why = "no usable __start___ex_table/__stop___ex_table in /proc/kallsyms";
    return std::nullopt;
  }
  std::vector<std::byte> t;
  if (!read_guest(view, *b, *e - *b, &t, why)) return std::nullopt;
  std::vector<std::uint64_t> out;
  for (std::size_t off = 0; off + 12 <= t.size(); off += 12) {
    std::int32_t rel;
    std::memcpy(&rel, t.data() + off, 4);
    out.push_back(*b + off + static_cast<std::int64_t>(rel));
  }
  return out;
}

std::string tally(const std::map<std::string, std::uint64_t>& m) {
  std::string s;
  for (auto& [k, n] : m) s += fmt(" %s=%" PRIu64, k.c_str(), n);
  return s;
}

}  // namespace

int xpe2e_extable_all_main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::string channel;
  auto s = open_module_session(o.dom, must(parse_channel_kind(o.channel), "--channel"), &channel);
  hv::Hypervisor& hv = s->hypervisor();
  const bool guest = channel == "guest";
  Kallsyms ks;
  if (!ks.load("/proc/kallsyms")) fatal("cannot read /proc/kallsyms");
  auto ready = wait_key(hv, dom_path(o.dom, "data/xpe2e/safety/ready"), 120);
  if (!check("safety.ready", ready && *ready == "1",
             ready ? "guest: " + *ready : "no data/xpe2e/safety/ready within 120 s"))
    fatal("the guest's safety loop did not start");

  // 1. The control: the same phase with nothing probed.
  auto control = phase(*s, o.dom, 1, "extable-all", o.timeout_s);
  if (!check("extable_all.control", control && num(kv(*control), "ok") == 1,
             control ? "unprobed: " + *control : "no result from the unprobed phase"))
    fatal("the guest's extable-all phase fails with nothing probed");

  // 2. The routines, decoded from the running guest's text, and the exception table.
  auto view = must(GuestView::open(hv, o.dom), "GuestView::open");
  std::string why;
  auto ex = extable(*view, ks, &why);
  if (!check("extable_all.table", ex && !ex->empty(), ex ? fmt("%zu entries", ex->size()) : why))
    fatal("cannot read the guest's exception table");
  std::vector<Routine> rs;
  std::string absent;
  std::size_t asked = 0, covered = 0;
  for (const std::string& name : o.functions) {
    auto a = ks.addr(name);
    const std::uint64_t end = a ? ks.end_of(*a) : 0;
    if (!a || end <= *a || end - *a > kMaxRoutineBytes) {
      absent += " " + name;
      continue;
    }
    Routine r{name, *a, end, {}, {}, {}, 0, 0, 0, 0, {}};
    if (!read_guest(*view, *a, end - *a, &r.text, &why)) fatal("the text of " + name + ": " + why);
    std::uint64_t stop = 0;
    for (const Decoded& d : decode(r.text, *a, &stop)) r.insns.push_back(d.addr);
    if (stop != end)
      say("XPE2E-INFO: extable-all: %s: Capstone stopped at +%#" PRIx64 " of %zu bytes", name.c_str(), stop - *a,
          r.text.size());
    const std::set<std::uint64_t> bounds(r.insns.begin(), r.insns.end());
    for (std::uint64_t x : *ex)
      if (x >= *a && x < end) {
        r.covered.insert(x);
        if (!bounds.count(x))
          check("extable_all.boundary." + name, false,
                fmt("__ex_table covers %s, not an instruction of this program's decoding", ks.describe(x).c_str()));
      }
    asked += r.insns.size();
    covered += r.covered.size();
    rs.push_back(std::move(r));
  }
  say("XPE2E-INFO: extable-all: %zu routines, %zu instructions, %zu covered by __ex_table; not in this kernel:%s",
      rs.size(), asked, covered, absent.empty() ? " none" : absent.c_str());
  bool have_all = true;
  for (const std::string& m : kMustHit)
    have_all &= std::any_of(rs.begin(), rs.end(), [&](const Routine& r) { return r.name == m; });
  if (!check("extable_all.routines", have_all && covered > 0,
             fmt("%zu routines with %zu covered instructions; the phase's own routines present: %s", rs.size(), covered,
                 have_all ? "yes" : "no")))
    fatal("the routines the phase needs are not in this kernel");

  // The guest module's fixup slots (protocol.h): where every covered instruction must go.
  std::uint64_t fx_lo = 0, fx_hi = 0;
  if (guest) {
    auto a = hv.xs_read(dom_path(o.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_FIXUP_SLOTS_ADDR));
    auto n = hv.xs_read(dom_path(o.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_FIXUP_SLOTS_COUNT));
    if (!check("extable_all.fixup_slots", a && n, "the module publishes fixup-slots/addr and /count"))
      fatal("no fixup slots");
    fx_lo = std::stoull(*a, nullptr, 16);
    fx_hi = fx_lo + std::stoull(*n) * XENPROBES_FIXUP_SLOT_SIZE;
  }

  // 3. A probe on every instruction, --batch at a time (a pause of the domain each), hits
  // served in between.
  std::deque<Point> pts;
  std::map<std::string, std::uint64_t> modes, rules;
  std::map<std::string, std::string> example;
  const auto t_reg = Clock::now();
  std::size_t in_batch = 0;
  must(s->begin_batch(), "begin_batch");
  for (std::size_t ri = 0; ri < rs.size(); ++ri) {
    Routine& r = rs[ri];
    for (std::uint64_t at : r.insns) {
      if (in_batch++ == o.batch) {
        must(s->end_batch(), "end_batch");
        (void)s->run_once(0);
        must(s->begin_batch(), "begin_batch");
        in_batch = 1;
      }
      Point& p = pts.emplace_back();
      p.routine = ri;
      p.at = at;
      Point* pp = &p;
      auto res = s->probe(o.dom, Gva{at}, [pp](HitContext&) {
        ++pp->handler;
        return 0;
      });
      const bool is_covered = r.covered.count(at) != 0;
      if (!res) {
        const std::string rule = rule_of(res.error());
        if (!rules[rule]++) example[rule] = ks.describe(at) + ": " + res.error().what;
        ++r.refused;
        if (is_covered && rule == "guest-hook-path") ++r.covered_hookpath;
        else if (is_covered) r.covered_bad += fmt(" %s refused by %s;", ks.describe(at).c_str(), rule.c_str());
        pts.pop_back();
        continue;
      }
      p.probe = std::move(*res);
      ++r.accepted;
      auto i = p.probe.info();
      std::string mode = i ? mode_name(i->mode) : "?";
      if (i && i->address.value != at) mode = "moved (" + mode + ")";
      ++modes[mode];
      if (!is_covered) continue;
      const bool in_fixup = i && i->mode == ExecMode::Boosted && i->address.value == at &&
                            (!guest || (i->slot.value >= fx_lo && i->slot.value < fx_hi));
      if (in_fixup) ++r.covered_fixup;
      else
        r.covered_bad +=
            fmt(" %s: mode=%s slot=%#" PRIx64 ";", ks.describe(at).c_str(), mode.c_str(), i ? i->slot.value : 0);
    }
  }
  must(s->end_batch(), "end_batch");
  std::uint64_t acc = 0, ref = 0;
  for (auto& [m, n] : modes) acc += n;
  for (auto& [m, n] : rules) ref += n;
  say("XPE2E-SAFETY extable-all registered %zu routines in %.1f s: asked=%zu accepted=%" PRIu64 " refused=%" PRIu64,
      rs.size(), std::chrono::duration<double>(Clock::now() - t_reg).count(), asked, acc, ref);
  say("XPE2E-SAFETY extable-all accepted by mode:%s", tally(modes).c_str());
  say("XPE2E-SAFETY extable-all refused by rule:%s", tally(rules).c_str());
  for (auto& [rule, e] : example) say("XPE2E-SAFETY extable-all refused %s e.g. %s", rule.c_str(), e.c_str());
  check("extable_all.counted", acc + ref == asked,
        fmt("%zu asked = %" PRIu64 " accepted + %" PRIu64 " refused", asked, acc, ref));
  bool unnamed = false;
  for (auto& [rule, n] : rules) unnamed |= rule.rfind("other:", 0) == 0;
  check("extable_all.refusals_named", !unnamed, "every refusal names its rule (no 'other:' above)");
  for (const Routine& r : rs)
    if (!r.covered.empty())
      check("extable_all.covered." + r.name, r.covered_bad.empty(),
            fmt("%zu covered: %" PRIu64 " boosted in a fixup slot, %" PRIu64 " refused by guest-hook-path",
                r.covered.size(), r.covered_fixup, r.covered_hookpath) +
                (r.covered_bad.empty() ? "" : ";" + r.covered_bad));

  // 4. The phase again, every accepted probe armed.
  auto probed = phase(*s, o.dom, 2, "extable-all", o.timeout_s);
  check("extable_all.guest", probed && num(kv(*probed), "ok") == 1,
        probed ? "probed: " + *probed : "no result from the probed phase");
  check("extable_all.same_as_unprobed", probed && *probed == *control,
        probed ? "probed: " + *probed + " | unprobed: " + *control : "no result from the probed phase");

  // 5. Counts, then everything unregistered and the text compared.
  std::vector<std::uint64_t> hits(rs.size()), handler(rs.size()), unhandled(rs.size());
  for (const Point& p : pts) {
    auto st = p.probe.stats();
    hits[p.routine] += st.hits;
    unhandled[p.routine] += st.unhandled;
    handler[p.routine] += p.handler;
  }
  std::uint64_t all_hits = 0;
  for (std::size_t ri = 0; ri < rs.size(); ++ri) {
    const Routine& r = rs[ri];
    all_hits += hits[ri];
    const bool must_hit = kMustHit.count(r.name) != 0;
    say("XPE2E-SAFETY extable-all routine %s bytes=%zu asked=%zu accepted=%" PRIu64 " refused=%" PRIu64
        " covered=%zu covered_fixup=%" PRIu64 " hits=%" PRIu64,
        r.name.c_str(), r.text.size(), r.insns.size(), r.accepted, r.refused, r.covered.size(), r.covered_fixup,
        hits[ri]);
    check("extable_all.hits." + r.name, hits[ri] == handler[ri] && unhandled[ri] == 0 && (!must_hit || hits[ri] > 0),
          fmt("handler %" PRIu64 ", ProbeStats.hits %" PRIu64 ", unhandled %" PRIu64 "%s", handler[ri], hits[ri],
              unhandled[ri], must_hit ? " (the phase must use it)" : ""));
  }
  say("XPE2E-SAFETY extable-all hits=%" PRIu64, all_hits);
  std::size_t failed = 0;
  std::string first;
  for (std::size_t k = 0; k < pts.size(); ++k) {
    if (k % o.batch == 0) {
      if (k) must(s->end_batch(), "end_batch");
      (void)s->run_once(0);
      must(s->begin_batch(), "begin_batch");
    }
    if (auto r = pts[k].probe.unregister(); !r && !failed++) first = ks.describe(pts[k].at) + ": " + r.error().what;
  }
  if (!pts.empty()) must(s->end_batch(), "end_batch");
  check("extable_all.unregistered", failed == 0,
        failed ? fmt("%zu failed, the first %s", failed, first.c_str()) : fmt("%zu probes", pts.size()));
  view->flush();
  std::string diff;
  for (const Routine& r : rs) {
    std::vector<std::byte> now;
    if (!read_guest(*view, r.start, r.text.size(), &now, &why)) {
      diff += " " + r.name + ": " + why + ";";
      continue;
    }
    for (std::size_t k = 0; k < now.size(); ++k)
      if (now[k] != r.text[k]) {
        diff += fmt(" %s+0x%zx: %02x, was %02x;", r.name.c_str(), k, static_cast<unsigned>(now[k]),
                    static_cast<unsigned>(r.text[k]));
        break;
      }
  }
  check("extable_all.text_restored", diff.empty(),
        diff.empty() ? fmt("%zu routines byte-identical to their snapshot", rs.size()) : "changed:" + diff);
  std::string st;
  check("extable_all.alive", domain_alive(hv, o.dom, &st), st);

  // 6. The end of the guest's safety loop, the module's counters, its unload.
  must(hv.xs_write(dom_path(o.dom, "data/xpe2e/safety/end"), "1"), "write data/xpe2e/safety/end");
  auto done = wait_key(hv, dom_path(o.dom, "data/xpe2e/done"), 60);
  check("workload.ok", done && num(kv(*done), "ok") == 1, done ? *done : "no data/xpe2e/done within 60 s");
  if (guest) {
    auto h = ctl_header(hv, o.dom);
    check("module.no_timeouts", h && h->timeouts == 0, describe(h));
  }
  s.reset();
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  if (guest) {
    auto h = ctl_header(*hvp, o.dom);
    check("module.traps_cleared", h && h->nr_traps == 0, "after the session closed: " + describe(h));
  }
  must(hvp->xs_write(dom_path(o.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hvp, dom_path(o.dom, "data/xpe2e/unloaded"), 90);
  check("module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG safety-extable-all %s %d", g_failed ? "FAIL" : "PASS", g_failed);
  return g_failed ? 1 : 0;
}

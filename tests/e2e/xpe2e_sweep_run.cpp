// The real-kernel sweep's Sweep (xpe2e_sweep.hpp): the functions selected and decoded, the
// counted syscalls' entries, a round of the guest's workload with a batch armed, capping hot
// probes, unregistering, the checks after each batch, and run() over every batch with the tally.
#include <capstone/capstone.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_sweep.hpp"

namespace xpe2e::sweep {

namespace {

// The syscalls the guest's round makes an exact number of times, and the result key for each.
struct Counted {
  const char* function;
  const char* key;
};
constexpr Counted kCounted[] = {
    {"__x64_sys_getppid", "getppid"},
    {"__x64_sys_getsid", "getsid"},
    {"__x64_sys_fsync", "fsync"},
    {"__x64_sys_listen", "listen"},
};

}  // namespace

void Sweep::serve(int ms) {
  auto t0 = Clock::now();
  auto r = s_.run_once(ms);
  run_max_s_ = std::max(run_max_s_, since(t0) - ms / 1000.0);
  if (!r) say("XPE2E-INFO: run_once: %s", r.error().what.c_str());
  cap_pending();
}

// Probes whose handler reached the cap: unregistered together (one pause of the domain).
void Sweep::cap_pending() {
  if (to_cap_.empty()) return;
  std::vector<Point*> now;
  now.swap(to_cap_);
  auto t0 = Clock::now();
  (void)s_.begin_batch();
  for (Point* p : now) {
    if (!p->probe) continue;
    if (auto r = p->probe.unregister(); !r)
      say("XPE2E-INFO: unregister a capped probe at %#" PRIx64 ": %s", p->at.value, r.error().what.c_str());
    p->capped = true;
    ++t_.capped;
  }
  (void)s_.end_batch();
  cap_max_s_ = std::max(cap_max_s_, since(t0));
}

bool Sweep::select_functions() {
  auto all = must(s_.find_symbols(a_.dom, "*"), "find_symbols(*)");
  std::map<std::string, const SymbolInfo*> by_name;
  for (const auto& y : all)
    if (y.function) by_name.emplace(y.name, &y);
  auto view = must(GuestView::open(hv_, a_.dom), "GuestView::open");
  csh h;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) fatal("cs_open");
  std::set<std::uint64_t> seen;
  for (const auto& ar : kAreas) {
    unsigned taken = 0;
    std::vector<std::string> absent, large;
    for (const char* n : ar.functions) {
      if (a_.per_area && taken >= a_.per_area) break;
      if (!a_.only.empty() && a_.only.find("," + std::string(n) + ",") == std::string::npos) continue;
      auto it = by_name.find(n);
      if (it == by_name.end()) {
        absent.push_back(n);
        continue;
      }
      const SymbolInfo& y = *it->second;
      if (y.size == 0 || y.size > a_.max_fn_bytes) {
        large.push_back(fmt("%s (%" PRIu64 " bytes)", n, y.size));
        continue;
      }
      if (!seen.insert(y.address.value).second) continue;  // an alias of one taken already
      Function f{ar.name, n, y.address, y.size, {}, {}, false};
      std::vector<std::byte> b(y.size);
      for (std::uint64_t off = 0; off < b.size();) {
        std::size_t k = std::min<std::uint64_t>(4096 - ((y.address.value + off) & 4095), b.size() - off);
        must(view->read(Gva{y.address.value + off}, std::span(b).subspan(off, k)), "read the text of " + f.name);
        off += k;
      }
      cs_insn* insn = nullptr;
      std::size_t cnt =
          cs_disasm(h, reinterpret_cast<const std::uint8_t*>(b.data()), b.size(), y.address.value, 0, &insn);
      std::uint64_t end = y.address.value;
      for (std::size_t i = 0; i < cnt; ++i) {
        f.insns.push_back(insn[i].address);
        end = insn[i].address + insn[i].size;
      }
      if (cnt) cs_free(insn, cnt);
      f.undecodable_tail = end != y.address.value + y.size;
      if (f.undecodable_tail)
        say("XPE2E-INFO: %s: Capstone stopped at +%#" PRIx64 " of %" PRIu64 " bytes", f.name.c_str(),
            end - y.address.value, y.size);
      t_.area_functions[ar.name]++;
      t_.area_insns[ar.name] += f.insns.size();
      fns_.push_back(std::move(f));
      ++taken;
    }
    std::string ab, lg;
    for (auto& x : absent) ab += " " + x;
    for (auto& x : large) lg += " " + x;
    say("XPE2E-SWEEP area %s functions=%u absent=%zu%s%s large=%zu%s", ar.name, taken, absent.size(),
        absent.empty() ? "" : ":", ab.c_str(), large.size(), lg.c_str());
  }
  cs_close(&h);
  std::uint64_t insns = 0;
  for (auto& f : fns_) insns += f.insns.size();
  std::string per;
  bool spread = true;
  for (const auto& ar : kAreas) {
    per += fmt(" %s=%" PRIu64, ar.name, t_.area_functions[ar.name]);
    spread &= t_.area_functions[ar.name] >= 20;
  }
  return check("sweep.functions", fns_.size() >= a_.min_functions && (spread || a_.min_functions == 0),
               fmt("%zu functions, %" PRIu64 " instructions (at least %u functions, 20 per area):%s", fns_.size(),
                   insns, a_.min_functions, per.c_str()));
}

// The counted syscalls' entries (asked for by name: the library places them past the ftrace
// site); they stay for the whole sweep, uncapped.
void Sweep::register_counted() {
  for (const auto& c : kCounted) {
    Point& p = counted_.emplace_back();
    p.counted = true;
    Point* pp = &p;
    auto r = s_.probe(a_.dom, std::string_view(c.function), [pp](HitContext&) {
      ++pp->hits;
      return 0;
    });
    if (!r) fatal(fmt("probe on %s: ", c.function) + r.error().what);
    p.probe = std::move(*r);
    auto i = p.probe.info();
    p.at = i ? i->address : Gva{0};
    say("XPE2E-INFO: counted: %s at %#" PRIx64 " (%s)", c.function, p.at.value, i ? i->instruction.c_str() : "?");
  }
}

// Sends the guest round `phase` and serves hits until its result; hot probes are capped as they
// go, and at `hot_limit` seconds every sweep probe of the batch goes.
std::optional<std::string> Sweep::round(int phase, const std::string& tag, std::deque<Point>* batch, double* hot_at) {
  must(hv_.xs_write(dom_path(a_.dom, fmt("data/xpe2e/safety/go-%d", phase)), fmt("sweep %d", a_.round_limit)),
       "write data/xpe2e/safety/go");
  const std::string key = dom_path(a_.dom, fmt("data/xpe2e/safety/result-%d", phase));
  auto t0 = Clock::now(), last_read = t0;
  auto end = t0 + std::chrono::seconds(a_.round_limit + 30);
  *hot_at = -1;
  while (Clock::now() < end) {
    auto t_run = Clock::now();
    auto r = s_.run_once(100);
    if (r && *r > 0) run_max_s_ = std::max(run_max_s_, since(t_run));
    if (!r) say("XPE2E-INFO: run_once: %s", r.error().what.c_str());
    cap_pending();
    if (batch && *hot_at < 0 && since(t0) > a_.hot_limit) {
      *hot_at = since(t0);
      std::size_t armed = 0;
      for (auto& p : *batch) armed += bool(p.probe);
      say("XPE2E-INFO: %s: the round is still running after %.0f s: its %zu armed sweep probes go", tag.c_str(),
          *hot_at, armed);
      t_.hot_dropped += armed;
      unregister(*batch, tag);
    }
    // xenstore only between hits, at most every 0.5 s (a read per hit slows the guest down).
    if (r && *r > 0 && since(last_read) < 0.5) continue;
    last_read = Clock::now();
    if (auto v = hv_.xs_read(key)) {
      serve(0);
      say("XPE2E-INFO: %s: round %.1f s: %s", tag.c_str(), since(t0), v->c_str());
      return *v;
    }
    std::string st;
    if (!domain_alive(hv_, a_.dom, &st)) {
      say("XPE2E-INFO: %s: the domain is not running any more (%s)", tag.c_str(), st.c_str());
      return std::nullopt;
    }
    for (auto& l : console_bad(a_.console, &console_off_)) pending_bad_.push_back(l);
  }
  say("XPE2E-INFO: %s: no result within %d s; %s", tag.c_str(), a_.round_limit + 30,
      describe(ctl_header(hv_, a_.dom)).c_str());
  return std::nullopt;
}

// Unregisters a batch's probes, a pause of the domain per 100, serving hits in between.
void Sweep::unregister(std::deque<Point>& pts, const std::string& tag) {
  std::size_t n = 0, failed = 0;
  std::string first;
  for (auto it = pts.begin(); it != pts.end();) {
    serve(0);
    (void)s_.begin_batch();
    for (unsigned k = 0; k < 100 && it != pts.end(); ++it) {
      if (!it->probe) continue;
      ++k;
      ++n;
      if (auto r = it->probe.unregister(); !r) {
        if (!failed++) first = fmt("%#" PRIx64 ": ", it->at.value) + r.error().what;
      }
    }
    (void)s_.end_batch();
  }
  serve(0);
  if (failed)
    check("sweep." + tag + ".unregister", false, fmt("%zu of %zu failed; first: %s", failed, n, first.c_str()));
}

bool Sweep::after_batch(const std::string& tag, const std::optional<std::string>& res, std::size_t fn_from,
                        std::size_t fn_to) {
  bool ok = true;
  auto m = res ? kv(*res) : std::map<std::string, std::string>{};
  ok &= check("sweep." + tag + ".guest", res && num(m, "ok") == 1,
              res ? "guest: " + *res : "no result from the guest's round");
  // Counts: every counted entry's hits in this round equal the guest's calls.
  std::string cs;
  bool exact = true;
  for (std::size_t k = 0; k < std::size(kCounted); ++k) {
    Point& p = counted_[k];
    std::uint64_t d = p.hits - counted_before_[kCounted[k].key];
    counted_before_[kCounted[k].key] = p.hits;
    long want = num(m, kCounted[k].key);
    exact &= want >= 0 && static_cast<long>(d) == want;
    cs += fmt(" %s %" PRIu64 "/%ld", kCounted[k].key, d, want);
  }
  ok &= check("sweep." + tag + ".counts", exact, "probe hits / the guest's calls:" + cs);
  std::string st;
  bool alive = domain_alive(hv_, a_.dom, &st);
  ok &= check("sweep." + tag + ".alive", alive, st);
  if (!alive) {
    dead_ = true;
    return false;
  }
  // Text: every function of the batch byte-identical to its snapshot.
  auto view = GuestView::open(hv_, a_.dom);
  std::string diff;
  std::size_t same = 0;
  for (std::size_t i = fn_from; i < fn_to && view && diff.empty(); ++i) {
    Function& f = fns_[i];
    std::vector<std::byte> now(f.text.size());
    if (auto r = (*view)->read(f.start, now); !r) {
      diff = f.name + ": " + r.error().what;
      break;
    }
    for (std::size_t k = 0; k < now.size(); ++k)
      if (now[k] != f.text[k]) {
        diff = fmt("%s+0x%zx: %02x, was %02x", f.name.c_str(), k, static_cast<unsigned>(now[k]),
                   static_cast<unsigned>(f.text[k]));
        break;
      }
    if (diff.empty()) ++same;
  }
  if (!view) diff = "GuestView::open: " + view.error().what;
  ok &= check("sweep." + tag + ".text", diff.empty(),
              diff.empty() ? fmt("%zu functions byte-identical to their snapshots", same) : diff);
  auto h = ctl_header(hv_, a_.dom);
  ok &= check("sweep." + tag + ".module", h && h->timeouts == 0 && !h->dom0_gone, describe(h));
  auto bad = console_bad(a_.console, &console_off_);
  bad.insert(bad.begin(), pending_bad_.begin(), pending_bad_.end());
  pending_bad_.clear();
  std::string b;
  for (std::size_t i = 0; i < bad.size() && i < 5; ++i) b += " | " + bad[i];
  ok &= check("sweep." + tag + ".console", bad.empty(),
              bad.empty() ? "no oops/WARN/BUG/lockup/stall line in the guest's console"
                          : fmt("%zu bad lines:", bad.size()) + b);
  return ok;
}

int Sweep::run() {
  auto ready = wait_key(hv_, dom_path(a_.dom, "data/xpe2e/safety/ready"), 120);
  if (!check("sweep.ready", ready && *ready == "1",
             ready ? "guest: " + *ready : "no data/xpe2e/safety/ready within 120 s"))
    fatal("the guest's round loop did not start");
  if (!a_.console.empty()) (void)console_bad(a_.console, &console_off_);  // only what comes from now on

  auto t_sel = Clock::now();
  if (!select_functions()) fatal("not enough functions");
  say("XPE2E-INFO: selection and decoding: %.1f s", since(t_sel));
  register_counted();

  // Round 1: only the counted entries: the workload's own numbers and time.
  {
    double hot = -1;
    auto res = round(++phase_, "baseline", nullptr, &hot);
    if (!after_batch("baseline", res, 0, 0)) {
      say("XPE2E-INFO: the round without the sweep's probes failed: no batch is tried");
      return 1;
    }
  }

  // The batches: consecutive instructions over the function list.
  struct Ref {
    std::size_t fn;
    std::uint64_t at;
  };
  std::vector<Ref> all;
  for (std::size_t i = 0; i < fns_.size(); ++i)
    for (auto at : fns_[i].insns) all.push_back(Ref{i, at});
  const std::size_t nbatches = (all.size() + a_.batch - 1) / a_.batch;
  say("XPE2E-INFO: %zu instructions in %zu batches of at most %u", all.size(), nbatches, a_.batch);
  auto t_all = Clock::now();
  double reg_s = 0, round_s = 0, unreg_s = 0;
  for (std::size_t b = 0; b < nbatches && !dead_; ++b) {
    const std::string tag = fmt("batch%zu", b + 1);
    const std::size_t from = b * a_.batch, to = std::min(all.size(), from + a_.batch);
    const std::size_t fn_from = all[from].fn, fn_to = all[to - 1].fn + 1;
    // Snapshots of the batch's functions, while nothing is armed in them.
    {
      auto view = must(GuestView::open(hv_, a_.dom), "GuestView::open");
      for (std::size_t i = fn_from; i < fn_to; ++i) {
        Function& f = fns_[i];
        f.text.assign(f.size, std::byte{0});
        for (std::uint64_t off = 0; off < f.text.size();) {
          std::size_t k = std::min<std::uint64_t>(4096 - ((f.start.value + off) & 4095), f.text.size() - off);
          must(view->read(Gva{f.start.value + off}, std::span(f.text).subspan(off, k)), "snapshot " + f.name);
          off += k;
        }
      }
    }
    // Registration: the domain paused for at most ~0.5 s at a time, hits served in between.
    std::deque<Point> pts;
    auto t_reg = Clock::now();
    std::size_t acc = 0, ref = 0, i = from;
    while (i < to) {
      serve(0);
      (void)s_.begin_batch();
      auto slice = Clock::now();
      for (; i < to && since(slice) < 0.5; ++i) {
        const Function& f = fns_[all[i].fn];
        Point& p = pts.emplace_back();
        p.fn = all[i].fn;
        p.at = Gva{all[i].at};
        Point* pp = &p;
        std::vector<Point*>* cap_list = &to_cap_;
        const unsigned cap = a_.cap;
        auto r = s_.probe(a_.dom, p.at, [pp, cap_list, cap](HitContext&) {
          if (++pp->hits == cap) cap_list->push_back(pp);
          return 0;
        });
        ++t_.points;
        if (!r) {
          std::string rule = rule_of(r.error());
          if (!t_.refused[rule]++) t_.example[rule] = r.error().what;
          ++ref;
          pts.pop_back();
          continue;
        }
        p.probe = std::move(*r);
        auto info = p.probe.info();
        std::string mode = info ? mode_name(info->mode) : "info-failed";
        if (info && info->address != p.at) mode = "moved (" + mode + ")";
        t_.accepted[mode]++;
        t_.area_accepted[f.area]++;
        ++acc;
      }
      (void)s_.end_batch();
    }
    serve(0);
    double reg = since(t_reg);
    reg_s += reg;
    // One round of the guest's workload with the batch armed.
    double hot = -1;
    auto t_round = Clock::now();
    auto res = round(++phase_, tag, &pts, &hot);
    double rnd = since(t_round);
    round_s += rnd;
    std::uint64_t hits = 0, hit_points = 0, capped = 0;
    for (auto& p : pts) {
      hits += p.hits;
      hit_points += p.hits > 0;
      capped += p.capped;
      if (p.hits) t_.area_hit[fns_[p.fn].area]++;
    }
    t_.hits += hits;
    auto t_un = Clock::now();
    unregister(pts, tag);
    double un = since(t_un);
    unreg_s += un;
    say("XPE2E-SWEEP batch %zu/%zu functions %s..%s (%zu) asked=%zu accepted=%zu refused=%zu hits=%" PRIu64
        " points_hit=%" PRIu64 " capped=%" PRIu64
        "%s register=%.1fs round=%.1fs unregister=%.1fs max_cap=%.2fs max_run_once=%.2fs",
        b + 1, nbatches, fns_[fn_from].name.c_str(), fns_[fn_to - 1].name.c_str(), fn_to - fn_from, to - from, acc, ref,
        hits, hit_points, capped, hot >= 0 ? fmt(" dropped-at=%.0fs", hot).c_str() : "", reg, rnd, un, cap_max_s_,
        run_max_s_);
    cap_max_s_ = run_max_s_ = 0;
    if (!after_batch(tag, res, fn_from, fn_to)) {
      say("XPE2E-INFO: %s failed: functions %s..%s", tag.c_str(), fns_[fn_from].name.c_str(),
          fns_[fn_to - 1].name.c_str());
      if (dead_) break;
    }
  }
  say("XPE2E-INFO: batches: %.1f s (register %.1f s, rounds %.1f s, unregister %.1f s)", since(t_all), reg_s, round_s,
      unreg_s);

  // The tally.
  std::uint64_t acc = 0, ref = 0;
  for (auto& [m, n] : t_.accepted) {
    say("XPE2E-SWEEP accepted %s %" PRIu64, m.c_str(), n);
    acc += n;
  }
  for (auto& [r, n] : t_.refused) {
    say("XPE2E-SWEEP refused %s %" PRIu64 " e.g. %s", r.c_str(), n, t_.example[r].c_str());
    ref += n;
  }
  for (const auto& ar : kAreas)
    say("XPE2E-SWEEP area-total %s functions=%" PRIu64 " instructions=%" PRIu64 " accepted=%" PRIu64
        " points_hit=%" PRIu64,
        ar.name, t_.area_functions[ar.name], t_.area_insns[ar.name], t_.area_accepted[ar.name], t_.area_hit[ar.name]);
  say("XPE2E-SWEEP total functions=%zu asked=%" PRIu64 " accepted=%" PRIu64 " refused=%" PRIu64 " hits=%" PRIu64
      " capped=%" PRIu64 " dropped_hot=%" PRIu64,
      fns_.size(), t_.points, acc, ref, t_.hits, t_.capped, t_.hot_dropped);
  check("sweep.every_instruction", acc + ref == t_.points && acc > 0,
        fmt("%" PRIu64 " asked = %" PRIu64 " accepted + %" PRIu64 " refused", t_.points, acc, ref));
  bool unexpected = false;
  for (auto& [r, n] : t_.refused) unexpected |= r.rfind("other:", 0) == 0;
  check("sweep.refusals_named", !unexpected, "every refusal names its rule (no 'other:' entries above)");
  return 0;
}

}  // namespace xpe2e::sweep

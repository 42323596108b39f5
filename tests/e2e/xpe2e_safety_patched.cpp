// xpe2e-probe safety --hazards statickey and ftrace: sites the guest's kernel rewrites at run
// time (a tracepoint's static key and static calls, a function's ftrace site).
#include <capstone/capstone.h>

#include <algorithm>
#include <cinttypes>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"
#include "xpe2e_safety.hpp"

namespace xpe2e::probe {

// 2. A tracepoint's static key (jump label) and static call sites in kernel_clone, and the
// static call's trampoline: the kernel rewrites them when the tracepoint is enabled and BUG()s
// on a byte it did not expect (an int3).
void hazard_statickey(SafetyCtx& x) {
  hv::Hypervisor& hv = x.s.hypervisor();
  auto fn = x.ks.addr("kernel_clone");
  auto tp = x.syms.addr("__tracepoint_sched_process_fork");
  auto sck = x.syms.addr("__SCK__tp_func_sched_process_fork");
  auto sct = x.syms.addr("__SCT__tp_func_sched_process_fork");
  if (!check("safety.statickey.symbols", fn && tp && sck && sct,
             fmt("kernel_clone %#" PRIx64 ", __tracepoint_sched_process_fork %#" PRIx64
                 ", __SCK__tp_func_sched_process_fork %#" PRIx64 ", __SCT__tp_func_sched_process_fork %#" PRIx64,
                 fn.value_or(0), tp.value_or(0), sck.value_or(0), sct.value_or(0))))
    return;
  const std::uint64_t fn_end = x.ks.end_of(*fn);
  // struct tracepoint { const char *name; struct static_key key; ... }: the key is at +8.
  const std::uint64_t key = *tp + 8;

  std::vector<std::uint64_t> jump_sites, call_sites;
  std::uint64_t base = 0;
  std::string why;
  // __jump_table: {s32 code, s32 target, s64 key}, each relative to its own field; the key's
  // low 2 bits are flags (the kernel sorted the table at boot, fixing up the offsets).
  if (auto t = read_table(hv, x.dom, x.syms, "__start___jump_table", "__stop___jump_table", &base, &why)) {
    std::size_t n_key = 0;
    for (std::size_t off = 0; off + 16 <= t->size(); off += 16) {
      std::uint64_t e = base + off;
      std::uint64_t k = (e + 8 + static_cast<std::uint64_t>(s64_at(*t, off + 8) & ~std::int64_t{3}));
      if (k != key) continue;
      ++n_key;
      std::uint64_t code = e + static_cast<std::int64_t>(s32_at(*t, off));
      std::uint64_t target = e + 4 + static_cast<std::int64_t>(s32_at(*t, off + 4));
      say("XPE2E-INFO: __jump_table: key __tracepoint_sched_process_fork.key: code %s (%#" PRIx64 ") target %s",
          x.ks.describe(code).c_str(), code, x.ks.describe(target).c_str());
      if (code >= *fn && code < fn_end) jump_sites.push_back(code);
    }
    check("safety.statickey.jump_sites", !jump_sites.empty(),
          fmt("%zu of the table's %zu entries for this key, %zu in kernel_clone [%#" PRIx64 ", %#" PRIx64 ")", n_key,
              t->size() / 16, jump_sites.size(), *fn, fn_end));
  } else {
    check("safety.statickey.jump_sites", false, why);
  }
  // .static_call_sites: {s32 addr, s32 key}, relative; the key's low 2 bits are flags.
  if (auto t = read_table(hv, x.dom, x.syms, "__start_static_call_sites", "__stop_static_call_sites", &base, &why)) {
    std::size_t n_key = 0;
    for (std::size_t off = 0; off + 8 <= t->size(); off += 8) {
      std::uint64_t e = base + off;
      std::uint64_t k = (e + 4 + static_cast<std::int64_t>(s32_at(*t, off + 4))) & ~std::uint64_t{3};
      if (k != *sck) continue;
      ++n_key;
      std::uint64_t site = e + static_cast<std::int64_t>(s32_at(*t, off));
      say("XPE2E-INFO: .static_call_sites: key __SCK__tp_func_sched_process_fork: site %s (%#" PRIx64 ")",
          x.ks.describe(site).c_str(), site);
      if (site >= *fn && site < fn_end) call_sites.push_back(site);
    }
    check("safety.statickey.call_sites", !call_sites.empty(),
          fmt("%zu of the table's %zu entries for this key, %zu in kernel_clone", n_key, t->size() / 8,
              call_sites.size()));
  } else {
    check("safety.statickey.call_sites", false, why);
  }

  std::vector<Armed> armed;
  must(x.s.begin_batch(), "begin_batch");
  for (auto a : jump_sites)
    expect_refused(fmt("safety.statickey.refused.jump-label.%s", x.ks.describe(a).c_str()),
                   x.s.probe(x.dom, Gva{a}, safety_counter()), "jump-label", x.ks.describe(a), Gva{a}, armed);
  for (auto a : call_sites)
    expect_refused(fmt("safety.statickey.refused.static-call.%s", x.ks.describe(a).c_str()),
                   x.s.probe(x.dom, Gva{a}, safety_counter()), "static-call", x.ks.describe(a), Gva{a}, armed);
  expect_refused("safety.statickey.refused.static-call-trampoline", x.s.probe(x.dom, Gva{*sct}, safety_counter()),
                 "static-call-trampoline", "__SCT__tp_func_sched_process_fork", Gva{*sct}, armed);
  // The instructions right before and right after each site, armed while the kernel rewrites
  // the site next to them (text_poke_bp: an int3 over the site's first byte, its tail, its
  // first byte, each checked against what the kernel expects there): our trap bytes next door
  // must neither disturb the rewrite nor be disturbed by it.
  std::vector<Armed> near;
  std::vector<std::pair<std::uint64_t, std::vector<std::byte>>> near_bytes;
  {
    std::vector<std::uint64_t> sites = jump_sites;
    sites.insert(sites.end(), call_sites.begin(), call_sites.end());
    std::set<std::uint64_t> points;
    auto view = must(GuestView::open(hv, x.dom), "GuestView::open");
    std::vector<std::byte> b(fn_end > *fn && fn_end - *fn <= 65536 ? fn_end - *fn : 0);
    csh h;
    if (!b.empty() && view->read(Gva{*fn}, b) && cs_open(CS_ARCH_X86, CS_MODE_64, &h) == CS_ERR_OK) {
      cs_insn* insn = nullptr;
      const std::size_t n = cs_disasm(h, reinterpret_cast<const std::uint8_t*>(b.data()), b.size(), *fn, 0, &insn);
      for (std::size_t i = 0; i < n; ++i)
        for (std::uint64_t site : sites) {
          const bool is_site = std::find(sites.begin(), sites.end(), insn[i].address) != sites.end();
          if (!is_site && (insn[i].address + insn[i].size == site || insn[i].address == site + 5))
            points.insert(insn[i].address);
        }
      if (n) cs_free(insn, n);
      cs_close(&h);
    }
    for (std::uint64_t a : points) {
      auto r = x.s.probe(x.dom, Gva{a}, safety_counter());
      if (!r) {
        say("XPE2E-INFO: statickey: neighbour %s refused: %s", x.ks.describe(a).c_str(), r.error().what.c_str());
        continue;
      }
      auto i = r->info();
      say("XPE2E-INFO: statickey: neighbour %s armed (%s, mode=%s)", x.ks.describe(a).c_str(),
          i ? i->instruction.c_str() : "?", i ? mode_name(i->mode) : "?");
      near_bytes.emplace_back(a, b.size() >= a - *fn + 16
                                     ? std::vector<std::byte>(b.begin() + static_cast<long>(a - *fn),
                                                              b.begin() + static_cast<long>(a - *fn + 16))
                                     : std::vector<std::byte>{});
      near.push_back(Armed{"neighbour " + x.ks.describe(a), Gva{a}, std::move(*r)});
    }
    check("safety.statickey.neighbours.armed", !near.empty(),
          fmt("%zu of the %zu instructions next to the %zu sites armed", near.size(), points.size(), sites.size()));
  }
  must(x.s.end_batch(), "end_batch");
  // Enable sched_process_fork, fork 5 times, disable it, then toggle sched_process_exec.
  auto res = safety_phase(x.s, x.dom, ++x.phase, "statickey", x.timeout_s);
  std::uint64_t near_hits = 0;
  for (auto& a : near) near_hits += g_safety_hits[a.at.value];
  unregister_all(armed, "statickey");
  unregister_all(near, "statickey");
  x.dead = !phase_checks(hv, x.dom, "statickey", res);
  if (!near_bytes.empty()) {
    check("safety.statickey.neighbours.hits", near_hits > 0,
          fmt("%" PRIu64 " hits on the instructions next to the sites while the guest forked with the key on and off",
              near_hits));
    if (!x.dead) {
      auto view = must(GuestView::open(hv, x.dom), "GuestView::open");
      std::size_t same = 0;
      std::string diff;
      for (auto& [a, was] : near_bytes) {
        std::vector<std::byte> now(was.size());
        if (!was.empty() && view->read(Gva{a}, now) && now == was) ++same;
        else diff += fmt(" %s", x.ks.describe(a).c_str());
      }
      check("safety.statickey.neighbours.text_restored", same == near_bytes.size(),
            diff.empty() ? fmt("the %zu neighbours' 16 bytes each byte-identical afterwards", same)
                         : "changed or unreadable:" + diff);
    }
  }
}

// 3. The ftrace site at a function's entry: ftrace rewrites it (tracers, kprobe events on
// ftrace) and refuses, with a WARN, bytes it did not write. A probe asked for by name or at the
// function's start must be moved past the 5-byte site, and must still see every call.
void hazard_ftrace(SafetyCtx& x) {
  hv::Hypervisor& hv = x.s.hypervisor();
  const char* name = "__x64_sys_getppid";
  auto start = x.ks.addr(name);
  if (!check("safety.ftrace.symbol", start.has_value(), fmt("%s at %#" PRIx64, name, start.value_or(0)))) return;
  auto before = snapshot(hv, x.dom, {{name, Gva{*start}}});
  say("XPE2E-INFO: %s starts with %s (the ftrace site: 0f1f440000 is its NOP5)", name,
      hexbytes(before[0].bytes, 8).c_str());

  std::uint64_t by_name_hits = 0, by_addr_hits = 0;
  auto count_into = [](std::uint64_t* n) -> PreHandler {
    return [n](HitContext&) {
      ++*n;
      return 0;
    };
  };
  std::vector<std::pair<std::string, Result<Probe>>> regs;
  regs.emplace_back("byname", x.s.probe(x.dom, std::string_view(name), count_into(&by_name_hits)));
  const std::string addr_expr = fmt("0x%" PRIx64, *start);
  regs.emplace_back("byaddr", x.s.probe(x.dom, std::string_view(addr_expr), count_into(&by_addr_hits)));
  std::vector<Armed> armed;
  // Debian 13's 6.12 (IBT) has endbr64 before the ftrace site; the probe goes past both.
  const auto& b0 = before[0].bytes;
  const bool endbr = b0.size() >= 4 && b0[0] == std::byte{0xf3} && b0[1] == std::byte{0x0f} &&
                     b0[2] == std::byte{0x1e} && b0[3] == std::byte{0xfa};
  const std::uint64_t past = *start + (endbr ? 4 : 0) + 5;
  for (auto& [tag, r] : regs) {
    std::string asked = tag == "byname" ? std::string(name) : "'" + addr_expr + "'";
    if (!r) {
      check("safety.ftrace." + tag + ".moved", false,
            fmt("%s: refused (%s): ", asked.c_str(), errc_name(r.error().code)) + r.error().what);
      continue;
    }
    auto i = r->info();
    check("safety.ftrace." + tag + ".moved", i && i->address.value == past,
          i ? fmt("%s: ProbeInfo.address %#" PRIx64 " = %s (the function starts at %#" PRIx64
                  "; past its ftrace site: %#" PRIx64 "), %s, mode=%s",
                  asked.c_str(), i->address.value, x.ks.describe(i->address.value).c_str(), *start, past,
                  i->instruction.c_str(), mode_name(i->mode))
            : "info(): " + i.error().what);
    armed.push_back(Armed{asked, i ? i->address : Gva{*start}, std::move(*r)});
  }
  // set_ftrace_filter + the function tracer, 10 getppid, nop; a kprobe event on the function,
  // 10 getppid; the guest reports its count (20).
  auto res = safety_phase(x.s, x.dom, ++x.phase, "ftrace", x.timeout_s);
  std::vector<ProbeStats> st;
  for (auto& a : armed) st.push_back(a.probe.stats());
  unregister_all(armed, "ftrace");
  long calls = res ? num(kv(*res), "getppid") : -1;
  if (regs[0].second)
    check("safety.ftrace.byname.hits", (long)by_name_hits == calls && calls == 20,
          fmt("the probe by name counted %" PRIu64 ", the guest made %ld getppid calls", by_name_hits, calls));
  if (regs[1].second)
    check("safety.ftrace.byaddr.hits", (long)by_addr_hits == calls && calls == 20,
          fmt("the probe by address counted %" PRIu64 ", the guest made %ld getppid calls", by_addr_hits, calls));
  x.dead = !phase_checks(hv, x.dom, "ftrace", res);
  if (!x.dead) {
    std::string diff = compare(hv, x.dom, before);
    check("safety.ftrace.text_restored", diff.empty(),
          diff.empty() ? fmt("%s: %zu bytes byte-identical (the tracer put its NOP5 back)", name, kSnapBytes) : diff);
  }
}

}  // namespace xpe2e::probe

// The probe set of `probe` and `kill` (xpe2e_probe_kill.cpp): XP with pre- and post-handlers,
// a boosted, an emulated and a skipped-mode probe, XrP, on real kernel functions of the guest,
// each counted in g_c; maybe_die() is kill's SIGKILL from inside a handler.
#include <capstone/capstone.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_probe.hpp"

namespace xpe2e::probe {

namespace {

// The options of the probes that have no post-handler (--method).
ProbeOptions pre_only() { return ProbeOptions{g_args.method == "fastest" ? ProbeMethod::Fastest : ProbeMethod::Trap}; }
bool skipped(const char* what) {
  return ("," + g_args.skip + ",").find(std::string(",") + what + ",") != std::string::npos;
}

// ---- finding a relative call in a function (capstone, like the library, but independent) ----

struct Insn {
  Gva addr;
  unsigned size = 0;
  std::uint8_t first = 0;
  std::string text;
};

// The function's first instructions, decoded from the running guest's text.
std::vector<Insn> disasm(hv::Hypervisor& hv, DomId dom, const char* name, Gva fn, std::size_t max) {
  auto view = must(GuestView::open(hv, dom), "GuestView::open");
  std::vector<std::byte> b(256);
  must(view->read(fn, b), std::string("read the bytes of ") + name);
  std::vector<Insn> out;
  csh h;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) fatal("cs_open");
  cs_insn* insn = nullptr;
  std::size_t n = cs_disasm(h, reinterpret_cast<const std::uint8_t*>(b.data()), b.size(), fn.value, max, &insn);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(
        Insn{Gva{insn[i].address}, insn[i].size, insn[i].bytes[0], fmt("%s %s", insn[i].mnemonic, insn[i].op_str)});
    say("XPE2E-INFO: %s+0x%02" PRIx64 ": %s", name, insn[i].address - fn.value, out.back().text.c_str());
    if (insn[i].id == X86_INS_RET || insn[i].id == X86_INS_INT3 || insn[i].id == X86_INS_JMP) break;
  }
  if (n) cs_free(insn, n);
  cs_close(&h);
  return out;
}

// The first nop after the function's first ret within its first 256 bytes (the padding
// before the next function), decoded from the running guest's text; nullopt when none.
std::optional<Gva> padding_nop(hv::Hypervisor& hv, DomId dom, Gva fn) {
  auto view = must(GuestView::open(hv, dom), "GuestView::open");
  std::vector<std::byte> b(256);
  must(view->read(fn, b), "read the bytes after a function's ret");
  csh h;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) fatal("cs_open");
  cs_insn* insn = nullptr;
  std::size_t n = cs_disasm(h, reinterpret_cast<const std::uint8_t*>(b.data()), b.size(), fn.value, 0, &insn);
  std::optional<Gva> out;
  bool after_ret = false;
  for (std::size_t i = 0; i < n && !out; ++i) {
    if (insn[i].id == X86_INS_RET) after_ret = true;
    else if (after_ret && insn[i].id == X86_INS_NOP) out = Gva{insn[i].address};
  }
  if (n) cs_free(insn, n);
  cs_close(&h);
  return out;
}

}  // namespace

// Kept separate from ProbeSet so handlers can capture it by pointer before the set exists.
Counters g_c;
unsigned g_die_after = 0;
std::string g_die_in;

// `where` names the handler calling (or register, unregister); `hits` its count so far.
void maybe_die(const char* where, std::uint64_t hits) {
  if (g_die_after && g_die_in == where && hits == g_die_after) {
    const std::uint64_t getppid = g_c.ret_getppid_entries - g_c.ret_getppid_returns,
                        openat = g_c.ret_openat_entries - g_c.ret_openat_returns;
    const bool in_handler = g_die_in != "register" && g_die_in != "unregister";
    say("XPE2E-KILL: SIGKILL to myself %s %s %u %s%s; XrP calls in flight: %" PRIu64 " (__x64_sys_getppid %" PRIu64
        ", __x64_sys_openat %" PRIu64 ")",
        in_handler ? "inside the" : "right after", where, g_die_after, in_handler ? "handler's hits" : "probes",
        in_handler ? " (a vCPU waits for this answer)" : "", getppid + openat, getppid, openat);
    std::fflush(nullptr);
    ::kill(::getpid(), SIGKILL);
  }
}

void register_probes(Session& s, DomId dom, ProbeSet& ps) {
  auto resolve = [&](const char* sym) { return must(s.resolve(dom, sym), std::string("resolve ") + sym); };
  Gva getppid = resolve("__x64_sys_getppid");
  Gva openat = resolve("__x64_sys_openat");
  Gva filp = resolve("do_filp_open");
  Gva unlink = resolve("do_unlinkat");
  ps.functions = {
      {"__x64_sys_getppid", getppid}, {"__x64_sys_openat", openat}, {"do_filp_open", filp}, {"do_unlinkat", unlink}};
  auto keep = [&](Probe p) -> Probe* {
    ps.probes.push_back(std::move(p));
    maybe_die("register", ps.probes.size());  // kill --die-in register
    return &ps.probes.back();
  };
  ps.probes.reserve(16);  // handles are referred to by pointer below: no reallocation
  // Decode before anything is patched (a probe's int3 would stop the decoding).
  auto ins = disasm(s.hypervisor(), dom, "__x64_sys_getppid", getppid, 40);
  auto oi = disasm(s.hypervisor(), dom, "__x64_sys_openat", openat, 4);
  const std::optional<Gva> pad = padding_nop(s.hypervisor(), dom, getppid);

  // XP with a pre- and a post-handler on the syscall's entry. The library places it past
  // the function's ftrace site (docs/probes.md, "Entry placement"); the post-handler must see
  // rip at the instruction after the placed one.
  auto placed = std::make_shared<std::uint64_t>(getppid.value);
  auto post_rip = std::make_shared<std::uint64_t>(0);
  ps.getppid = keep(must(s.probe(
                             dom, getppid,
                             [](HitContext&) {
                               ++g_c.getppid_pre;
                               maybe_die("getppid", g_c.getppid_pre);
                               return 0;
                             },
                             [post_rip](HitContext& c) {
                               ++g_c.getppid_post;
                               if (c.regs().rip != *post_rip && ++g_c.post_rip_wrong == 1)
                                 g_c.first_post_rip = fmt("getppid post-handler rip %#" PRIx64 ", expected %#" PRIx64,
                                                          c.regs().rip, *post_rip);
                             }),
                         "XP on __x64_sys_getppid"));
  *placed = ps.getppid->info()->address.value;
  for (const Insn& i : ins)
    if (i.addr.value == *placed) *post_rip = i.addr.value + i.size;
  check("xp.getppid.next", *post_rip != 0,
        fmt("the instruction after the placed probe: %#" PRIx64 " (0: the placed address is not an instruction "
            "boundary of the test's own decoding)",
            *post_rip));
  check(
      "xp.getppid.placed", *placed != getppid.value && ps.getppid->info()->requested == getppid,
      fmt("asked for at 0x%" PRIx64 ", placed at __x64_sys_getppid+0x%" PRIx64 " (%s): %s", getppid.value,
          *placed - getppid.value, ps.getppid->info()->instruction.c_str(), ps.getppid->info()->moved_because.c_str()));
  ps.points.push_back(Gva{*placed});

  // XP on the function's first relative call (Dom0 emulates it: pushes the return address
  // on the guest's stack) and on the instruction the call returns to (a plain instruction:
  // boosted, pre-handler only). Not on the 1-byte `push rbx` right before the call: channels
  // that find stops by rip == probe + 1 (debugger) refuse a probe after a probed 1-byte
  // instruction.
  // A call right after the placed entry probe when that is a 1-byte instruction (`push rbx`
  // on Debian's 6.1) is the continuation the debugger channel copies with it: the next call.
  std::uint64_t not_before = *placed;
  for (const Insn& i : ins)
    if (i.addr.value == *placed && i.size == 1) not_before = *placed + 2;
  const Insn* call = nullptr;
  const Insn* after_call = nullptr;
  for (std::size_t i = 0; i < ins.size(); ++i)
    if (ins[i].size == 5 && ins[i].first == 0xe8 && ins[i].addr.value >= not_before) {
      call = &ins[i];
      if (i + 1 < ins.size()) after_call = &ins[i + 1];
      break;
    }
  if (!after_call && !skipped("boosted"))
    check("boosted.found", false,
          "no instruction after a call rel32 in __x64_sys_getppid: the boosted probe is missing");
  if (after_call && !skipped("boosted")) {
    ps.boosted = keep(must(s.probe(
                               dom, after_call->addr,
                               [](HitContext&) {
                                 ++g_c.boosted;
                                 return 0;
                               },
                               {}, pre_only()),
                           "XP on the return site of __x64_sys_getppid's first call (" + after_call->text + ")"));
    ps.points.push_back(after_call->addr);
  }
  if (skipped("branch")) {
  } else if (call) {
    ps.branch = keep(must(s.probe(
                              dom, call->addr,
                              [](HitContext&) {
                                ++g_c.branch;
                                maybe_die("call", g_c.branch);
                                return 0;
                              },
                              {}, pre_only()),
                          "XP on the call in __x64_sys_getppid (" + call->text + ")"));
    ps.points.push_back(call->addr);
  } else {
    check("branch.found", false, "no call rel32 in __x64_sys_getppid before its first ret/jmp");
  }

  // XP on openat: the wrapper gets struct pt_regs * in rdi; the user's filename is regs->si.
  if (!skipped("openat")) {
    ps.openat = keep(must(s.probe(dom, openat,
                                  [](HitContext& c) {
                                    ++g_c.openat_hits;
                                    auto p = c.read_u64(Gva{c.regs().rdi + kPtRegsSi});
                                    Result<std::string> name = p ? c.read_string(Gva{*p}, 256)
                                                                 : Result<std::string>(std::unexpected(p.error()));
                                    if (!name) {
                                      ++g_c.openat_read_errors;
                                      if (g_c.first_read_error.empty())
                                        g_c.first_read_error = "openat user filename: " + name.error().what;
                                    } else if (*name == kTarget) {
                                      ++g_c.openat_target;
                                    } else {
                                      ++g_c.openat_other;
                                    }
                                    return 0;
                                  }),  // a trap: openat2's post-handler shares its point
                          "XP on __x64_sys_openat"));
    ps.points.push_back(openat);
  }

  // A pre- and post-handler on a plain instruction: openat's first one past its entry, where
  // the entry probe lands too. Past the ftrace site (nop5) on Debian 12's 6.1, the second
  // instruction; past endbr64 and the ftrace site on Debian 13's 6.12 (IBT), the third.
  std::size_t o2 = 0;
  if (o2 < oi.size() && oi[o2].text.starts_with("endbr64")) ++o2;
  if (o2 < oi.size() && oi[o2].size == 5 && oi[o2].text.starts_with("nop")) ++o2;
  if (!skipped("openat2")) {
    if (o2 > 0 && o2 < oi.size()) {
      const std::uint64_t next = oi[o2].addr.value + oi[o2].size;
      ps.openat2 =
          keep(must(s.probe(
                        dom, oi[o2].addr,
                        [](HitContext&) {
                          ++g_c.openat2_pre;
                          return 0;
                        },
                        [next](HitContext& c) {
                          ++g_c.openat2_post;
                          if (c.regs().rip != next && ++g_c.openat2_post_rip_wrong == 1 && g_c.first_post_rip.empty())
                            g_c.first_post_rip =
                                fmt("openat post-handler rip %#" PRIx64 ", expected %#" PRIx64, c.regs().rip, next);
                        }),
                    "XP with a post-handler on __x64_sys_openat's first instruction past its entry"));
      ps.points.push_back(oi[o2].addr);
    } else {
      check("openat2.found", false,
            "__x64_sys_openat: no instruction past an ftrace site at its entry: the trap-after probe is missing");
    }
  }

  // XP on do_filp_open(dfd, struct filename *, op): the kernel's copy of the name.
  if (!skipped("filp")) {
    ps.filp = keep(must(s.probe(
                            dom, filp,
                            [](HitContext& c) {
                              auto p = c.read_u64(Gva{c.regs().rsi});
                              Result<std::string> name =
                                  p ? c.read_string(Gva{*p}, 256) : Result<std::string>(std::unexpected(p.error()));
                              if (!name) {
                                ++g_c.filp_read_errors;
                                if (g_c.first_read_error.empty())
                                  g_c.first_read_error = "do_filp_open kernel filename: " + name.error().what;
                              } else if (*name == kTarget) {
                                ++g_c.filp_target;
                                maybe_die("filp", g_c.filp_target);
                              } else {
                                ++g_c.filp_other;
                              }
                              return 0;
                            },
                            {}, pre_only()),
                        "XP on do_filp_open"));
    ps.points.push_back(filp);
  }

  // XrP on getppid (coexists with the XP there) and on do_unlinkat.
  if (!skipped("xrp")) {
    ps.ret_getppid = keep(must(s.ret_probe(
                                   dom, getppid,
                                   [](HitContext&, std::span<std::byte>) {
                                     ++g_c.ret_getppid_entries;
                                     return 0;
                                   },
                                   [](HitContext& c, std::span<std::byte>) {
                                     ++g_c.ret_getppid_returns;
                                     ++g_c.getppid_rax[c.regs().rax];
                                   }),
                               "XrP on __x64_sys_getppid"));
    ps.ret_unlink = keep(must(s.ret_probe(dom, unlink, {},
                                          [](HitContext& c, std::span<std::byte>) {
                                            ++g_c.ret_unlink_returns;
                                            ++g_c.unlink_rax[c.regs().rax];
                                          }),
                              "XrP on do_unlinkat"));
    ps.points.push_back(unlink);
    // The outer call of do_filp_open: in flight while that handler runs (kill --die-in filp).
    ps.ret_openat = keep(must(s.ret_probe(
                                  dom, openat,
                                  [](HitContext&, std::span<std::byte>) {
                                    ++g_c.ret_openat_entries;
                                    return 0;
                                  },
                                  [](HitContext& c, std::span<std::byte>) {
                                    ++g_c.ret_openat_returns;
                                    if (static_cast<std::int32_t>(c.regs().rax) < 0) ++g_c.ret_openat_failed;
                                  }),
                              "XrP on __x64_sys_openat"));
  }

  // XP on a nop: the alignment padding after __x64_sys_getppid's ret (the kernel's straight-line
  // code has no executed nop past the ftrace site, which the library moves probes off). Its
  // mode must be skipped, and the guest never runs it: no hit.
  if (!skipped("skipped")) {
    if (const auto& nop = pad) {
      ps.skipped = keep(must(s.probe(dom, *nop,
                                     [](HitContext&) {
                                       ++g_c.skipped_hits;
                                       return 0;
                                     }),
                             fmt("XP on the nop at %#" PRIx64 " after __x64_sys_getppid's ret", nop->value)));
    } else {
      check("skipped.found", false, "no nop after __x64_sys_getppid's ret: the skipped-mode probe is missing");
    }
  }

  // The armed points are where the library placed the probes: one asked for at a function's
  // start sits past its ftrace site.
  ps.points.clear();
  for (Probe* p : {ps.getppid, ps.boosted, ps.branch, ps.openat, ps.openat2, ps.filp, ps.ret_getppid, ps.ret_unlink,
                   ps.ret_openat, ps.skipped}) {
    if (!p) continue;
    auto i = p->info();
    if (!check(fmt("probe.%" PRIu64 ".info", p->id()), i.has_value(), i ? "registered" : i.error().what)) continue;
    say("XPE2E-INFO: probe %" PRIu64 ": %s mode=%s slot=%#" PRIx64 " trampoline=%#" PRIx64 "%s%s", p->id(),
        i->instruction.c_str(), mode_name(i->mode), i->slot.value, i->trampoline.value,
        i->moved_because.empty() ? "" : "; moved: ", i->moved_because.c_str());
    if (std::find(ps.points.begin(), ps.points.end(), i->address) == ps.points.end()) ps.points.push_back(i->address);
  }
  // Each execution mode on real kernel text (docs/probes.md): a post-handler on a copied
  // instruction makes its slot end in a trap (trap-after), and so does any other probe
  // sharing that point.
  auto mode_is = [](const char* name, Probe* p, ExecMode want, const char* why) {
    if (!p) return;
    auto i = p->info();
    // --method fastest: a pre-handler-only probe may be a jump probe instead (its detour).
    if (i && g_args.method == "fastest" && i->method == ProbeMethod::Jump) {
      check(std::string("xp.") + name + ".mode", i->mode == ExecMode::Detour,
            fmt("a jump probe, mode=%s: %s", mode_name(i->mode), i->instruction.c_str()));
      return;
    }
    check(std::string("xp.") + name + ".mode", i && i->mode == want,
          i ? fmt("mode=%s, expected %s (%s): %s", mode_name(i->mode), mode_name(want), why, i->instruction.c_str())
            : i.error().what);
  };
  mode_is("getppid", ps.getppid, ExecMode::TrapAfter, "a post-handler on a copied instruction");
  mode_is("boosted", ps.boosted, ExecMode::Boosted, "a plain instruction, pre-handler only");
  mode_is("call", ps.branch, ExecMode::Emulated, "a call rel32: Dom0 pushes the return address");
  mode_is("openat2", ps.openat2, ExecMode::TrapAfter, "a post-handler on a copied instruction");
  mode_is("skipped", ps.skipped, ExecMode::Skipped, "a nop");
  if (ps.openat && ps.openat2 && ps.openat->info() && ps.openat2->info() &&
      ps.openat->info()->address == ps.openat2->info()->address)
    mode_is("openat", ps.openat, ExecMode::TrapAfter,
            "placed on the first instruction past the entry, with its post-handler");
}

}  // namespace xpe2e::probe

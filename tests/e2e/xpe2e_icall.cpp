// xpe2e-probe kill-icall --domid D --snapshot FILE [--functions F1,F2,...] [--max-functions N]
//                        [--die-after-hits N] [--timeout S]
//
// kill -9 with a probe armed on an indirect branch (issue 12, "Shown on a real guest"), the Dom0
// side of tools/e2e/scenarios/stock_kill9_icall.sh. On the guest channel a probe on `call *%reg`
// or `jmp *%reg` is an emulated branch: Dom0 sets rip to the register's value (and pushes the
// return address). When Dom0 dies with a vCPU waiting at such a probe, the guest module's
// fallback must emulate the branch itself (guest-module/xp_fallback.c), and every later hit too
// until its fail-safe has restored the text.
//
// The candidate functions (--functions, default kCandidates: functions the workload runs on its
// openat/read/unlink paths) are decoded from the running guest's text with Capstone: the text as
// booted, after alternatives have rewritten `call __x86_indirect_thunk_<reg>` into `call *%reg`
// (or `lfence; call *%reg`) where the guest's Spectre v2 mitigation allows it (with generic
// retpolines they stay thunk calls: counted, and said so when nothing else is found). The first
// --max-functions (3) candidates with an indirect branch through a register are taken, and
// every such branch in them gets a counting probe, which must be emulated (ProbeInfo.mode). An
// indirect branch through memory there is asked for too and must be refused (the module's
// fallback cannot emulate one). The text of the functions probed is saved to FILE first, in
// verify-text's format. Then the workload is let go, and the program SIGKILLs itself inside the
// handler of the probe whose hit is the --die-after-hits-th (30) counted on these probes after
// the go: a vCPU waits for that answer at an indirect branch. The scenario checks the rest (the
// workload's results, the module's restore, the guest's log).
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <set>

#include "xpe2e_common.hpp"
#include "xpe2e_text.hpp"

using namespace xenprobes;
using namespace xpe2e;

namespace {

// On the paths of the workload's openat, read and unlink calls (tools/e2e/domu/workload_run.c),
// in the order they are tried. On Debian 12's 6.1 booted with indirect branches in place
// (spectre_v2=off) the first three are vfs_read (f_op->read, the xenbus device's, and read_iter,
// tmpfs's), security_file_open (the LSMs' file_open hooks) and vfs_unlink (i_op->unlink).
const char* const kCandidates[] = {
    "vfs_read",       "security_file_open", "vfs_unlink",  "new_sync_read",        "ksys_read",
    "do_dentry_open", "vfs_open",           "path_openat", "do_filp_open",         "do_sys_openat2",
    "filp_close",     "vfs_write",          "__fput",      "security_path_unlink", "security_inode_unlink",
    "step_into",      "walk_component",     "lookup_fast", "inode_permission",     "security_inode_permission",
    "complete_walk",  "terminate_walk",     "dput",        "do_unlinkat",
};

constexpr std::uint64_t kMaxFunctionBytes = 16384;

struct Icall {
  std::string where;  // "vfs_read+0xa0"
  std::string text;   // "call rax"
  std::uint64_t addr = 0;
  Probe probe;
  std::uint64_t hits = 0, after_go = 0;
};

std::deque<Icall> g_icalls;  // stable addresses: the handlers hold pointers
bool g_go = false;
std::uint64_t g_after_go = 0, g_die_after = 30;

[[noreturn]] void die_in(const Icall& at) {
  std::string per;
  for (const Icall& c : g_icalls)
    per += fmt("%s%s %" PRIu64 " (%" PRIu64 " after go)", per.empty() ? "" : ", ", c.where.c_str(), c.hits, c.after_go);
  say("XPE2E-KILL: SIGKILL to myself inside the handler of the probe on %s (%s), hit %" PRIu64
      " after go on the indirect-branch probes (a vCPU waits for this answer at an indirect %s); hits: %s",
      at.where.c_str(), at.text.c_str(), g_after_go, at.text.rfind("jmp", 0) == 0 ? "jmp" : "call", per.c_str());
  std::fflush(nullptr);
  ::kill(::getpid(), SIGKILL);
  std::abort();
}

struct Options {
  DomId dom{0};
  std::string snapshot;
  std::vector<std::string> functions;
  unsigned max_functions = 3;
  int timeout_s = 300;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) fatal("kill-icall: option " + k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--domid") o.dom = DomId{static_cast<std::uint32_t>(std::stoul(v))};
    else if (k == "--snapshot") o.snapshot = v;
    else if (k == "--max-functions") o.max_functions = static_cast<unsigned>(std::stoul(v));
    else if (k == "--die-after-hits") g_die_after = std::stoull(v);
    else if (k == "--timeout") o.timeout_s = std::stoi(v);
    else if (k == "--functions") {
      std::istringstream in(v);
      for (std::string f; std::getline(in, f, ',');)
        if (!f.empty()) o.functions.push_back(f);
    } else {
      fatal("kill-icall: unknown option " + k);
    }
  }
  if (!o.dom.value || o.snapshot.empty()) fatal("kill-icall: --domid and --snapshot are required");
  if (!o.max_functions || !g_die_after) fatal("kill-icall: --max-functions and --die-after-hits must be at least 1");
  if (o.functions.empty()) o.functions.assign(std::begin(kCandidates), std::end(kCandidates));
  return o;
}

struct Candidate {
  std::string name;
  std::uint64_t start = 0;
  std::vector<std::byte> text;
  std::vector<Decoded> via_reg, via_mem;
  unsigned thunk_calls = 0;
};

// Serves hits until the workload's data/xpe2e/done (the handler kills the program before, if all
// goes as planned).
std::optional<std::string> run_workload(Session& s, DomId dom, int seconds) {
  g_go = true;
  must(s.hypervisor().xs_write(dom_path(dom, "data/xpe2e/go"), "1"), "write data/xpe2e/go");
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < end) {
    auto r = s.run_once(100);
    if (!r) {
      check("run_once", false, r.error().what);
      return std::nullopt;
    }
    if (*r > 0) continue;  // xenstore only between hits
    if (auto d = s.hypervisor().xs_read(dom_path(dom, "data/xpe2e/done"))) return *d;
  }
  return std::nullopt;
}

}  // namespace

int xpe2e_icall_main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::string channel;
  auto s = open_module_session(o.dom, ChannelKind::Guest, &channel);
  check("channel", channel == "guest", "serving channel: " + channel);
  Kallsyms ks;
  if (!ks.load("/proc/kallsyms")) fatal("cannot read /proc/kallsyms");
  auto view = must(GuestView::open(s->hypervisor(), o.dom), "GuestView::open");

  // Decode every candidate from the running guest's text, before anything is patched.
  std::vector<Candidate> cands;
  std::string absent;
  for (const std::string& name : o.functions) {
    auto a = ks.addr(name);
    const std::uint64_t end = a ? ks.end_of(*a) : 0;
    if (!a || end <= *a || end - *a > kMaxFunctionBytes) {
      absent += " " + name;
      continue;
    }
    Candidate c{name, *a, {}, {}, {}, 0};
    std::string why;
    if (!read_guest(*view, *a, end - *a, &c.text, &why)) fatal("the text of " + name + ": " + why);
    std::uint64_t stop = 0;
    for (const Decoded& d : decode(c.text, *a, &stop)) {
      if (d.via_reg) c.via_reg.push_back(d);
      else if (d.via_mem) c.via_mem.push_back(d);
      else if ((d.call || d.jmp) && d.target && ks.at(d.target).starts_with("__x86_indirect_thunk_")) ++c.thunk_calls;
    }
    std::string list;
    for (const auto* v : {&c.via_reg, &c.via_mem})
      for (const Decoded& d : *v) list += fmt(" +0x%" PRIx64 " %s;", d.addr - *a, d.text.c_str());
    say("XPE2E-INFO: icall: %s (%zu bytes): %zu through a register, %zu through memory, %u through retpoline "
        "thunks%s%s",
        name.c_str(), c.text.size(), c.via_reg.size(), c.via_mem.size(), c.thunk_calls, list.empty() ? "" : ":",
        list.c_str());
    cands.push_back(std::move(c));
  }
  if (!absent.empty()) say("XPE2E-INFO: icall: not in this kernel (or no usable extent):%s", absent.c_str());

  std::vector<const Candidate*> picked;
  unsigned thunks = 0;
  for (const Candidate& c : cands) {
    thunks += c.thunk_calls;
    if (!c.via_reg.empty() && picked.size() < o.max_functions) picked.push_back(&c);
  }
  std::string names;
  for (const Candidate* c : picked) names += " " + c->name;
  if (!check("icall.found", !picked.empty(),
             picked.empty()
                 ? fmt("no indirect call or jmp through a register in %zu candidate functions (%u calls through "
                       "retpoline thunks: the guest keeps its retpolines, boot it with spectre_v2=off)",
                       cands.size(), thunks)
                 : "probing every indirect branch through a register in" + names)) {
    say("XPE2E-PROG kill-icall FAIL %d", g_failed);
    return 1;
  }
  say("XPE2E-INFO: icall: the first one: %s+0x%" PRIx64 " (%s)", picked[0]->name.c_str(),
      picked[0]->via_reg[0].addr - picked[0]->start, picked[0]->via_reg[0].text.c_str());

  // The text the module's restore must give back (the functions probed, whole, as decoded
  // above), in verify-text's format.
  {
    std::ofstream out(o.snapshot);
    for (const Candidate* c : picked) {
      std::string hex;
      for (std::byte b : c->text) hex += fmt("%02x", static_cast<unsigned>(b));
      out << c->name << ' ' << std::hex << c->start << ' ' << hex << '\n';
    }
    if (!out) fatal("cannot write the snapshot " + o.snapshot);
  }

  must(s->begin_batch(), "begin_batch");
  for (const Candidate* c : picked) {
    for (const Decoded& d : c->via_reg) {
      Icall& ic = g_icalls.emplace_back();
      ic.where = fmt("%s+0x%" PRIx64, c->name.c_str(), d.addr - c->start);
      ic.text = d.text;
      ic.addr = d.addr;
      Icall* p = &ic;
      auto r = s->probe(o.dom, Gva{d.addr}, [p](HitContext&) {
        ++p->hits;
        if (g_go) {
          ++p->after_go;
          if (++g_after_go == g_die_after) die_in(*p);
        }
        return 0;
      });
      if (!check("icall.registered." + ic.where, r.has_value(),
                 d.text + ": " + (r ? "registered" : std::string(errc_name(r.error().code)) + " " + r.error().what))) {
        g_icalls.pop_back();
        continue;
      }
      ic.probe = std::move(*r);
      auto i = ic.probe.info();
      check("icall.mode." + ic.where, i && i->mode == ExecMode::Emulated && i->address.value == d.addr,
            i ? fmt("%s: mode=%s at %#" PRIx64 " (an indirect branch: Dom0 emulates it, and the module's "
                    "fallback once Dom0 is gone)",
                    i->instruction.c_str(), mode_name(i->mode), i->address.value)
              : i.error().what);
    }
  }
  must(s->end_batch(), "end_batch");
  // Through memory (none where alternatives wrote `call *%reg`): the module's fallback could not
  // run one, so the library must refuse it (asked for one at a time, outside the batch).
  for (const Candidate* c : picked)
    for (const Decoded& d : c->via_mem) {
      const std::string where = fmt("%s+0x%" PRIx64, c->name.c_str(), d.addr - c->start);
      auto r = s->probe(o.dom, Gva{d.addr}, [](HitContext&) { return 0; });
      if (r) {
        check("icall.mem_refused." + where, false, d.text + ": registered; the module's fallback cannot emulate it");
        (void)r->unregister();
      } else {
        check("icall.mem_refused." + where,
              r.error().code == Errc::NotSupported && rule_of(r.error()) == "guest:memory-indirect-branch",
              d.text + ": " + errc_name(r.error().code) + " " + r.error().what);
      }
    }

  std::string armed;
  view->flush();
  for (const Icall& ic : g_icalls) {
    auto b = view->read_u64(Gva{ic.addr});
    if (!b || (*b & 0xff) != 0xcc) armed += fmt(" %s holds %02" PRIx64 ";", ic.where.c_str(), b ? *b & 0xff : 0);
  }
  check("text.armed", armed.empty(),
        armed.empty() ? fmt("%zu indirect-branch probe points hold int3", g_icalls.size()) : "not armed:" + armed);

  auto done = run_workload(*s, o.dom, o.timeout_s);
  // Only reached when fewer than --die-after-hits hits came after the go.
  std::string per;
  for (const Icall& c : g_icalls) per += fmt(" %s=%" PRIu64 "/%" PRIu64, c.where.c_str(), c.hits, c.after_go);
  check("killed", false,
        fmt("the workload finished (%s) with %" PRIu64 " hits after the go, before %" PRIu64 "; hits/after go:%s",
            done.value_or("no done").c_str(), g_after_go, g_die_after, per.c_str()));
  say("XPE2E-PROG kill-icall FAIL %d", g_failed);
  return 1;
}

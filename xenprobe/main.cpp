// xenprobe: bpftrace-style one-liners against Xen guest kernels, from Dom0 (docs/xenprobe.md).
//
//   xenprobe [-d DOMAIN]... (-e PROGRAM | FILE)
//   xenprobe list [-d DOMAIN]... [PATTERN]
//   xenprobe doctor [-d DOMAIN]...
//
// The program is parsed and checked before anything is attached; then each selected domain
// gets its own instance of it (its own maps), every probe of every domain is registered in
// one batch, and the session's loop runs the actions until exit(), -c, --duration, a signal,
// or every domain has gone (or, on the simulated Xen, every guest has finished its workload).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "main_internal.hpp"

namespace xenprobe {
namespace {

constexpr const char* kFooter = R"(
PROGRAM
  PROBE[, PROBE]... [/PREDICATE/] { ACTION; ... }   (docs/xenprobe.md has the grammar)

  Probes:   kprobe:FUNC  kprobe:FUNC+OFFSET  kretprobe:FUNC  (k: and kr: for short;
            FUNC may be a glob: kprobe:vfs_*)  BEGIN  END  interval:s:N  interval:ms:N
  Builtins: arg0..arg5 (kprobe), retval (kretprobe), func, probe, cpu (the vCPU), nsecs
            (Dom0's monotonic clock; with --method async, in kprobes, the guest's clock at
            the hit), domain (its name), comm, pid, tid (the guest's BTF),
            kstack, kstack(N) (the guest kernel's stack, unwound from Dom0 with its ORC
            tables, at most N <= 127 frames: a map key @[kstack] or printf("%s", kstack))
  Actions:  @map[k1, k2] = count() | sum(x) | avg(x) | min(x) | max(x) | hist(x)
                           | lhist(x, min, max, step) | expression;
            $var = expression;  @m++; @m += x;  if (c) { ... } else { ... }
            printf("fmt", ...)  print(@m)  clear(@m)  delete(@m[k])  exit()
  Values:   integers (+ - * / % & | ^ << >> ! ~ == != < <= > >= && || ?:), strings
            ("..", str(addr[, len]), ==, !=), kaddr("symbol"), casts and fields through
            BTF: ((struct file *)arg0)->f_path.dentry->d_name.name, (uint32)x, p[i]

ASYNC PROBES (--method async)
  A kprobe is an async probe: the guest module writes each hit (registers, the guest's clock,
  captures) into a per-vCPU ring and goes on; xenprobe runs the block from the record later.
  The guest channel and a guest module with rings only. A kprobe block may use argN, func,
  probe, cpu, nsecs, domain, kaddr, maps, variables, printf, predicates, str(argN [+ C]) and
  one read at argN + C (((struct S *)argN)->field): at most 8 such captures per block. comm,
  pid, tid, kstack and reads through memory are refused before anything is attached (use
  --method trap). kretprobes stay trap probes. After exit() or -c, records still in the rings
  are dropped; at the end the rings are read once more, and hits the rings had no room for
  are reported as lost events.

OUTPUT
  text: bpftrace's layout (maps printed at exit, hist/lhist as bar charts); with several
        domains every line starts with "[DOMAIN] ".
  json: one JSON record per line: {"type": T, "domain": NAME, "data": ...} with bpftrace's
        types attached_probes, printf, map, hist and lost_events. Errors go to stderr.

SIMULATED XEN
  --sim (or XENPROBES_BACKEND=sim) runs against the library's simulated Xen in this process:
  --sim-guests N demo guests named sim-1..sim-N (domids 1..N, --sim-vcpus each), created
  paused, started once the probes are in place. --sim-iterations K makes each guest run K
  iterations of its deterministic workload and halt; xenprobe then ends by itself.
  --sim-destroy NAME@HITS destroys a guest once HITS of its hits have been handled (xl destroy).
  --sim-ring-order N gives the simulated guest module's async rings 2^N bytes each (12..24).
  --sim-image ELF boots another guest image (its symbols from its memory, or --symbols);
  --sim-no-module GLOB runs the guests it names without the guest module (agentless: vm_event).

EXIT STATUS
  0 done; 1 the program, the options or the attachment was wrong, or the session failed
  while running (the message says what to do; what was collected is still printed).

EXAMPLES
  xenprobe -d web1 -e 'kprobe:do_sys_openat2 { @[str(arg1)] = count(); }'
  xenprobe -d 'web*' -e 'kretprobe:vfs_read /retval < 0/ { @errors[retval] = count(); }'
  xenprobe --sim --sim-guests 2 --sim-iterations 100 -e 'kprobe:sys_read { @bytes = hist(arg2); }'
  xenprobe list --sim 'sys_*'
)";

}  // namespace
}  // namespace xenprobe

static int run_main(int argc, char** argv) {
  using xenprobe::Options;
  Options o;
  CLI::App app{"xenprobe: bpftrace-style probes in running Xen guest kernels, handled in Dom0"};
  app.description(
      "xenprobe: bpftrace-style probes in running Xen guest kernels, handled in Dom0\n\n  xenprobe [OPTIONS] (-e "
      "PROGRAM | FILE)\n  xenprobe list [OPTIONS] [PATTERN]\n  xenprobe doctor [OPTIONS]\n");
  app.footer(xenprobe::kFooter);
  app.get_formatter()->column_width(34);
  auto* e = app.add_option("-e,--program", o.program_text, "the program, on the command line");
  auto* f = app.add_option("file", o.program_file, "the program, in a file")->check(CLI::ExistingFile);
  e->excludes(f);
  f->excludes(e);
  auto add_common = [&](CLI::App& a) {
    // One value per -d (and --symbols, --sim-destroy): CLI11's vector options would otherwise
    // swallow the words after them, the program file or list's pattern among them.
    a.add_option("-d,--domain", o.domains,
                 "a guest to probe: its name, its domid or a glob of names ('web*'); repeat for several "
                 "(default: the only guest)")
        ->allow_extra_args(false);
    a.add_option(
         "--symbols", o.symbol_files,
         "DOMAIN=FILE: the guest kernel's System.map (or a /proc/kallsyms copy, or its vmlinux) for that domain "
         "(default: its kallsyms, read from its memory)")
        ->allow_extra_args(false);
    a.add_option("--channel", o.channel, "how hits reach Dom0: auto, guest, vmevent or debugger")
        ->check(CLI::IsMember({"auto", "guest", "vmevent", "debugger"}));
    a.add_option("--method", o.method,
                 "how kprobes go into the guest: trap (default: a trap byte, every channel), jump (a jump to a "
                 "detour: the guest channel, where the jump rules allow; refused otherwise, saying why), "
                 "fastest (a jump where it can be one, else a trap; never async) or async (the guest records "
                 "each hit in a ring and goes on, the block runs in Dom0 afterwards: see ASYNC PROBES); "
                 "kretprobes are trap probes whatever the method")
        ->check(CLI::IsMember({"trap", "jump", "fastest", "async"}));
    a.add_flag("--sim", o.sim, "use the simulated Xen (also: XENPROBES_BACKEND=sim)");
    a.add_option("--sim-guests", o.sim_guests, "simulated demo guests to create, named sim-1..sim-N (default 1)");
    a.add_option("--sim-vcpus", o.sim_vcpus, "vCPUs of each simulated guest (default 2)");
    a.add_option("--sim-iterations", o.sim_iterations,
                 "workload iterations each simulated guest runs before it halts; 0 = forever (default)");
    a.add_option("--sim-type", o.sim_type, "pv (default), pvh or hvm")->check(CLI::IsMember({"pv", "pvh", "hvm"}));
    a.add_option("--sim-destroy", o.sim_destroy, "NAME@HITS: destroy that simulated guest after HITS of its hits")
        ->allow_extra_args(false);
    a.add_option("--sim-ring-order", o.sim_ring_order,
                 "simulated Xen only: the guest module's async rings hold 2^N bytes each (12 ... 24; default: "
                 "the simulated module's, 14)");
    a.add_option("--sim-image", o.sim_image,
                 "a static x86-64 guest ELF the simulated guests boot instead of the demo guest (its symbols: "
                 "its kallsyms, read from its memory as on a real Xen, or --symbols; default: the demo guest)")
        ->check(CLI::ExistingFile);
    a.add_option("--sim-no-module", o.sim_no_module,
                 "GLOB: the simulated guests it names (a name, domid or glob, like -d) run without the guest "
                 "module (agentless: only vm_event can probe them, with --sim-type pvh or hvm)")
        ->allow_extra_args(false);
  };
  add_common(app);
  app.add_option("--btf", o.btf,
                 "the guest kernel's BTF (/sys/kernel/btf/vmlinux copied from the guest, or an ELF with .BTF) "
                 "for casts, fields, comm, pid, tid (default: read from the guest's memory when the program "
                 "needs it)")
      ->check(CLI::ExistingFile);
  app.add_option("-f,--format", o.format, "output: text (default) or json (NDJSON records)")
      ->check(CLI::IsMember({"text", "json"}));
  app.add_option("-c,--count", o.hit_limit, "stop after this many probe hits (every kprobe/kretprobe action run)");
  app.add_flag("--check", o.check_only,
               "parse and check the program (with --btf's types), attach nothing, exit 0 if it is valid");
  app.add_option("--maxactive", o.maxactive,
                 "calls of one kretprobe's function tracked at once (default 64; a deeper recursion or more "
                 "concurrent calls are counted in lost_events)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--max-map-keys", o.max_map_keys,
                 "keys one map holds per domain (default 4096); an update with a new key to a full map is "
                 "dropped and counted")
      ->check(CLI::Range(std::size_t{1}, xenprobe::kMaxMapKeysLimit));
  app.add_option("--duration", o.duration, "stop after this many seconds")->check(CLI::PositiveNumber);
  auto* list = app.add_subcommand("list", "list the functions of the guest kernel(s) that kprobe can name");
  list->add_option("pattern", o.list_pattern, "a glob of function names (default '*'); kprobe: prefix allowed");
  add_common(*list);
  auto* doctor = app.add_subcommand("doctor", "say which channel can probe each selected guest, and why not");
  add_common(*doctor);
  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    // CLI11's own codes (105 for a bad value, ...) would contradict the documented exit status.
    return app.exit(err) == 0 ? 0 : 1;
  }
  xenprobe::Tool tool(o);
  if (*list) return tool.run_list();
  if (*doctor) return tool.run_doctor();
  if (o.program_text.empty() && o.program_file.empty()) {
    std::fprintf(stderr, "xenprobe: give a program with -e 'PROGRAM' or a FILE (xenprobe --help)\n");
    return 1;
  }
  return tool.run_program();
}

// An exception that escapes (no memory, a library's own) ends the program with its message and
// status 1, not with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) { std::fprintf(stderr, "xenprobe: %s\n", e.what()); } catch (...) {
    std::fprintf(stderr, "xenprobe: an unknown exception\n");
  }
  return 1;
}

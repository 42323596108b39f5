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
#include <fnmatch.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <deque>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "async.hpp"
#include "compile.hpp"
#include "elf_symbols.hpp"
#include "kstack.hpp"
#include "lang.hpp"
#include "runtime.hpp"
#include "types.hpp"
#include "xenprobes/doctor.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/sim.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobe {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using xenprobes::DomId;

volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_signal(int sig) { g_signal = sig; }

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

struct Options {
  std::string program_text;
  std::string program_file;
  std::vector<std::string> domains;
  std::string format = "text";
  std::uint64_t hit_limit = 0;
  double duration = 0;
  std::vector<std::string> symbol_files;  // DOM=FILE
  std::string btf;
  std::string channel = "auto";
  std::string method = "trap";
  bool sim = false;
  unsigned sim_guests = 1;
  unsigned sim_vcpus = 2;
  std::uint64_t sim_iterations = 0;
  std::string sim_type = "pv";
  std::string sim_image;                   // "" = the demo guest
  std::vector<std::string> sim_no_module;  // globs of simulated guests without the guest module
  std::vector<std::string> sim_destroy;    // NAME@HITS
  unsigned sim_ring_order = 0;             // 0 = the simulated module's default
  std::string list_pattern = "*";
  bool check_only = false;
  unsigned maxactive = 64;
  std::size_t max_map_keys = xenprobe::kDefaultMaxMapKeys;
};

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "xenprobe: %s\n", msg.c_str());
  std::exit(1);
}

// Does `spec` (-d or the DOMAIN of --symbols: a name, a domid or a glob of names) name it?
bool names_domain(const std::string& spec, const std::string& name, DomId id) {
  return spec == name || spec == std::to_string(id.value) || fnmatch(spec.c_str(), name.c_str(), 0) == 0;
}

// A domain the user selected, with what xenprobe keeps for it.
struct Target {
  DomId id;
  std::string name;
  std::unique_ptr<Instance> instance;
  std::vector<xenprobes::Probe> probes;
  bool gone = false;
  bool halted = false;  // simulated guest that finished its workload
  std::uint64_t lost = 0;
  std::uint64_t hits = 0;                        // hits and records handled for this domain (--sim-destroy counts them)
  std::uint64_t ring_lost_base = 0;              // --method async: drops + missed before the run
  std::uint64_t ring_lost = 0;                   // and since
  bool ring_lost_final = false;                  // counted when the run stopped
  std::vector<Clock::time_point> next_interval;  // per block (time_point::max() if none)
};

// Where probe names come from: the library's symbols of each domain (a System.map given with
// --symbols, the demo guest's on the simulated Xen, or whatever the library loads by default).
// An interface, so that another source can stand in for it.
class SymbolSource {
 public:
  virtual ~SymbolSource() = default;
  virtual xenprobes::Result<std::vector<xenprobes::SymbolInfo>> functions(DomId, std::string_view glob) = 0;
  virtual xenprobes::Result<xenprobes::Gva> resolve(DomId, std::string_view expr) = 0;
};

class SessionSymbols final : public SymbolSource {
 public:
  explicit SessionSymbols(xenprobes::Session& s) : s_(s) {}
  xenprobes::Result<std::vector<xenprobes::SymbolInfo>> functions(DomId d, std::string_view glob) override {
    auto all = s_.find_symbols(d, glob);
    if (!all) return all;
    std::erase_if(*all, [](const xenprobes::SymbolInfo& s) { return !s.function; });
    return all;
  }
  xenprobes::Result<xenprobes::Gva> resolve(DomId d, std::string_view expr) override { return s_.resolve(d, expr); }

 private:
  xenprobes::Session& s_;
};

// A file of our own in the temporary directory, removed with the object.
struct TempFile {
  std::string path;
  TempFile() = default;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (!path.empty()) ::unlink(path.c_str());
  }
  void write(const std::string& text) {
    const char* dir = secure_getenv("TMPDIR");
    std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/xenprobe-symbols-XXXXXX";
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) throw std::runtime_error("cannot create a file in " + tmpl + ": " + std::strerror(errno));
    path = tmpl;
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n <= 0) {
        ::close(fd);
        throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
      }
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
  }
};

class Tool {
 public:
  explicit Tool(Options o)
      : o_(std::move(o)),
        method_(o_.method == "jump"      ? xenprobes::ProbeMethod::Jump
                : o_.method == "fastest" ? xenprobes::ProbeMethod::Fastest
                                         : xenprobes::ProbeMethod::Trap),
        async_(o_.method == "async") {}

  int run_program() {
    std::string source = o_.program_text;
    std::string file = "-e";
    if (!o_.program_file.empty()) {
      std::ifstream in(o_.program_file);
      if (!in) die("cannot read " + o_.program_file + ": " + std::strerror(errno));
      std::stringstream ss;
      ss << in.rdbuf();
      source = ss.str();
      file = o_.program_file;
    }
    load_types();
    // Checked before anything touches Xen. A program that needs the guest kernel's types and
    // got no --btf is checked again below with the guest's own BTF, read from its memory.
    bool guest_types = false;
    try {
      compiled_ = compile(parse(source), types_.get());
      if (async_) plans_ = plan_async(compiled_);
    } catch (const ProgramError& e) {
      if (!e.needs_types || o_.check_only) {
        std::fputs(format_error(e, source, file).c_str(), stderr);
        return 1;
      }
      guest_types = true;
    }
    if (o_.check_only) return 0;
    // From here on ^C and SIGTERM end the run through the same path as exit(): whatever was
    // attached is detached and the maps are printed, even if the signal comes while attaching.
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    open_session();
    select_domains();
    if (guest_types) {
      types_ = types_from_guests();
      try {
        compiled_ = compile(parse(source), types_.get());
        if (async_) plans_ = plan_async(compiled_);
      } catch (const ProgramError& e) {
        std::fputs(format_error(e, source, file).c_str(), stderr);
        return 1;
      }
    }
    out_ = std::make_unique<Output>(o_.format == "json" ? OutputFormat::Json : OutputFormat::Text, stdout,
                                    targets_.size() > 1);
    attach();
    begin();
    loop();
    finish();
    return failed_ ? 1 : 0;
  }

  // The library's doctor for each selected domain: which channel can probe it, and why not.
  int run_doctor() {
    open_session();
    select_domains(false);  // the doctor needs no symbols: it must work where they cannot be read
    Output out(OutputFormat::Text, stdout, targets_.size() > 1);
    for (Target& t : targets_) {
      auto rep = xenprobes::doctor(session_->hypervisor(), t.id);
      if (!rep) die("domain " + t.name + ": " + rep.error().what);
      std::string text = xenprobes::format(*rep);
      if (!text.ends_with('\n')) text += '\n';
      out.text(t.name, text);
    }
    out.flush();
    return 0;
  }

  int run_list() {
    open_session();
    select_domains();
    std::string pat = o_.list_pattern;
    for (const char* prefix : {"kprobe:", "kretprobe:", "k:", "kr:"})
      if (pat.starts_with(prefix)) pat = pat.substr(std::strlen(prefix));
    Output out(OutputFormat::Text, stdout, targets_.size() > 1);
    for (Target& t : targets_) {
      auto fs = symbols_->functions(t.id, pat);
      if (!fs) die("domain " + t.name + ": " + fs.error().what);
      std::string text;
      // A loaded module's function as /proc/kallsyms shows it: "func [module]" (the library names
      // it "module:func"; kprobe:func probes it, or kprobe:module:func when several modules have it).
      for (const auto& f : *fs) {
        const auto colon = f.name.find(':');
        text += colon == std::string::npos
                    ? "kprobe:" + f.name + "\n"
                    : "kprobe:" + f.name.substr(colon + 1) + " [" + f.name.substr(0, colon) + "]\n";
      }
      out.text(t.name, text);
    }
    out.flush();
    return 0;
  }

 private:
  void load_types() {
    if (o_.btf.empty()) return;
    try {
      types_ = open_btf_file(o_.btf);
    } catch (const std::exception& e) { die(e.what()); }
    types_->set_missing_type_hint(
        "--btf gives the kernel's types only: without it, xenprobe reads the guest kernel's BTF and its loaded "
        "modules' from its memory");
  }

  bool use_sim() const {
    if (o_.sim) return true;
    const char* b = secure_getenv("XENPROBES_BACKEND");
    return b && std::string_view(b) == "sim";
  }

  void open_session() {
    auto channel = xenprobes::parse_channel_kind(o_.channel);
    if (!channel) die("--channel: " + channel.error().what);
    xenprobes::SessionOptions so{*channel};
    if (use_sim()) {
      if (o_.sim_guests < 1 || o_.sim_guests > 16) die("--sim-guests: give 1 ... 16 guests");
      if (o_.sim_vcpus < 1 || o_.sim_vcpus > 8) die("--sim-vcpus: give 1 ... 8 vCPUs");
      if (o_.sim_ring_order &&
          (o_.sim_ring_order < XENPROBES_RING_MIN_ORDER || o_.sim_ring_order > XENPROBES_RING_MAX_ORDER))
        die("--sim-ring-order: give " + std::to_string(XENPROBES_RING_MIN_ORDER) + " ... " +
            std::to_string(XENPROBES_RING_MAX_ORDER));
      // The simulated guest module measures its waits for Dom0 on a clock that stands still:
      // a hit never times out because this machine is busy, so counts are exact.
      xenprobes::hv::sim::SimOptions opts;
      opts.manual_clock = true;
      try {  // libxenprobes loads its simulation (libxenprobes-sim) now: it may be missing
        host_ = xenprobes::hv::sim::SimHost::create(opts);
      } catch (const std::exception& e) { die(std::string("--sim: ") + e.what()); }
      for (unsigned i = 1; i <= o_.sim_guests; ++i) {
        xenprobes::hv::sim::DomainConfig c;
        c.name = "sim-" + std::to_string(i);
        c.vcpus = o_.sim_vcpus;
        c.iterations = o_.sim_iterations;
        c.start_paused = true;  // started once the probes are in place
        c.image = o_.sim_image;
        if (o_.sim_ring_order) c.module_ring_order = o_.sim_ring_order;
        c.publish_module = std::none_of(o_.sim_no_module.begin(), o_.sim_no_module.end(),
                                        [&](const std::string& g) { return names_domain(g, c.name, DomId{i}); });
        if (o_.sim_type == "hvm" || o_.sim_type == "pvh") c.type = xenprobes::hv::GuestType::Hvm;
        else if (o_.sim_type != "pv") die("--sim-type: pv, pvh or hvm");
        auto id = host_->create_domain(c);
        if (!id) die("cannot create simulated guest " + c.name + ": " + id.error().what);
        sim_paused_.push_back(*id);
      }
      std::fprintf(stderr, "xenprobe: the SIMULATED Xen (--sim): %u demo guest(s) sim-1..sim-%u\n", o_.sim_guests,
                   o_.sim_guests);
      auto s = xenprobes::Session::open(host_->open(), so);
      if (!s) die("cannot open a session on the simulated Xen: " + s.error().what);
      session_ = std::move(*s);
    } else {
      if (access("/dev/xen/privcmd", F_OK) != 0 && access("/proc/xen/privcmd", F_OK) != 0)
        die("no Xen here (no /dev/xen/privcmd): run xenprobe in a Xen Dom0, or try it on the simulated Xen "
            "with --sim");
      auto s = xenprobes::Session::open(so);
      if (!s) die("cannot open a session: " + s.error().what);
      session_ = std::move(*s);
    }
    symbols_ = std::make_unique<SessionSymbols>(*session_);
  }

  // The domains -d names (or the only guest), with their kernels' symbols unless `symbols` is
  // false.
  void select_domains(bool symbols = true) {
    std::set<std::uint32_t> given_symbols;  // domains --symbols gave a file for
    auto doms = session_->hypervisor().list_domains();
    if (!doms) die("cannot list the domains: " + doms.error().what);
    std::vector<xenprobes::hv::DomainInfo> guests;
    for (auto& d : *doms)
      if (d.domid.value != 0 && !d.dying) guests.push_back(d);
    auto name_of = [](const xenprobes::hv::DomainInfo& d) {
      return d.name.empty() ? "domain-" + std::to_string(d.domid.value) : d.name;
    };
    std::string names;
    for (auto& g : guests)
      names += (names.empty() ? "" : ", ") + name_of(g) + " (" + std::to_string(g.domid.value) + ")";
    std::vector<xenprobes::hv::DomainInfo> chosen;
    if (o_.domains.empty()) {
      if (guests.size() != 1)
        die(guests.empty() ? "there is no guest domain to probe"
                           : "there are several guests (" + names + "): choose with -d NAME, -d ID or -d 'GLOB'");
      chosen = guests;
    }
    for (const std::string& want : o_.domains) {
      bool any = false;
      for (auto& g : guests) {
        const std::string n = name_of(g);
        if (names_domain(want, n, g.domid)) {
          any = true;
          if (std::none_of(chosen.begin(), chosen.end(), [&](auto& c) { return c.domid == g.domid; }))
            chosen.push_back(g);
        }
      }
      if (!any) die("-d " + want + ": no such guest (guests: " + (names.empty() ? "none" : names) + ")");
    }
    for (auto& c : chosen) {
      Target t;
      t.id = c.domid;
      t.name = name_of(c);
      targets_.push_back(std::move(t));
    }
    for (const std::string& spec : o_.symbol_files) {
      auto eq = spec.find('=');
      if (eq == std::string::npos) die("--symbols " + spec + ": write DOMAIN=FILE");
      std::string dom = spec.substr(0, eq), file = spec.substr(eq + 1);
      // A vmlinux: its .symtab becomes a System.map the library loads as any other.
      TempFile map;
      if (is_elf_file(file)) {
        try {
          map.write(system_map_from_elf(file));
        } catch (const std::exception& e) { die("--symbols " + spec + ": " + e.what()); }
      }
      bool any = false;
      for (Target& t : targets_)
        if (names_domain(dom, t.name, t.id)) {
          any = true;
          if (auto r = session_->load_symbols(t.id, map.path.empty() ? file : map.path); !r)
            die("--symbols " + spec + ": " + r.error().what);
          given_symbols.insert(t.id.value);
        }
      if (!any) die("--symbols " + spec + ": " + dom + " is not one of the selected domains");
    }
    // The others: the kernel's own kallsyms, found and decoded in the guest's memory (KASLR
    // included: the tables hold running addresses). The simulated Xen's demo guest comes with
    // its System.map, which the library loads by itself; a guest booted from --sim-image is
    // read as a real one is.
    if (!symbols || (session_->hypervisor().name() == "sim" && o_.sim_image.empty())) return;
    for (Target& t : targets_) {
      if (given_symbols.contains(t.id.value)) continue;
      if (auto r = session_->load_symbols_from_guest(t.id); !r)
        die("domain " + t.name + ": " + r.error().what +
            " (or give its System.map, a /proc/kallsyms copy or its vmlinux with --symbols " + t.name + "=FILE)");
    }
  }

  // The guest kernel's BTF, read from each selected domain's memory (its __start_BTF ..
  // __stop_BTF). One compiled program serves every domain, so they must run the same kernel.
  // With it, the BTF of the modules loaded now: read once, as bpftrace reads its types when it
  // loads a program, so a module loaded later adds no types to a running xenprobe. Modules
  // whose types cannot be used are said after a "no struct" error (missing_type_hint).
  std::unique_ptr<TypeSource> types_from_guests() {
    std::vector<std::byte> first;
    std::string first_name;
    // Loaded modules' BTF: a module's types are used when every domain has it with the same BTF.
    std::map<std::string, std::vector<std::byte>> modules;
    std::set<std::string> dropped;
    std::vector<std::string> left_out;
    bool first_target = true;
    for (Target& t : targets_) {
      auto b = session_->kernel_btf(t.id);
      if (!b)
        die("domain " + t.name + ": cannot read its kernel's BTF from its memory: " + b.error().what +
            " (give it with --btf FILE: the guest's /sys/kernel/btf/vmlinux)");
      if (first_name.empty()) {
        first = std::move(*b);
        first_name = t.name;
      } else if (*b != first) {
        die("domains " + first_name + " and " + t.name +
            " run different kernels (their BTF differs): one program "
            "reads both through one kernel's types; run one xenprobe per kernel");
      }
      std::map<std::string, std::vector<std::byte>> mine;
      if (auto mb = session_->module_btf(t.id); !mb) {
        left_out.push_back("every module of " + t.name + ": its module list cannot be read: " + mb.error().what);
      } else {
        for (auto& m : *mb) {
          if (m.why.empty()) mine[m.module] = std::move(m.btf);
          else if (first_target) left_out.push_back("module " + m.module + ": " + m.why);
        }
      }
      if (first_target) {
        modules = std::move(mine);
        first_target = false;
        continue;
      }
      for (auto it = modules.begin(); it != modules.end();) {
        auto o = mine.find(it->first);
        if (o == mine.end() || o->second != it->second) {
          dropped.insert(it->first);
          it = modules.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& d : dropped)
      left_out.push_back("module " + d + ": not loaded with the same BTF in every selected domain");
    std::vector<ModuleTypes> mods;
    for (auto& [name, blob] : modules) mods.push_back(ModuleTypes{name, std::move(blob)});
    std::vector<std::string> refused;
    std::unique_ptr<TypeSource> types;
    try {
      types = open_btf_bytes(first, "the BTF of " + first_name + "'s kernel (read from its memory)", mods, &refused);
    } catch (const std::exception& e) { die("domain " + first_name + ": " + e.what()); }
    for (const std::string& r : refused) left_out.push_back("module " + r);
    std::string hint =
        "a module's types are read with the kernel's when xenprobe starts, from the modules loaded then (as "
        "bpftrace reads them when it loads a program): if the type is a module's, load that module in the "
        "guest, then start xenprobe";
    constexpr std::size_t kShown = 8;  // a guest may have a hundred modules without BTF
    if (!left_out.empty()) hint += "\ntypes left out:";
    for (std::size_t i = 0; i < left_out.size() && i < kShown; ++i) hint += "\n  " + left_out[i];
    if (left_out.size() > kShown) hint += "\n  and " + std::to_string(left_out.size() - kShown) + " more";
    types->set_missing_type_hint(std::move(hint));
    return types;
  }

  void attach() {
    // Jump and async probes need every kernel function decoded once per domain: done now, with
    // the guest running, not inside the batch (whose first probe may pause the domain). A
    // failure here is the first jump probe's to report.
    if (method_ != xenprobes::ProbeMethod::Trap || async_)
      for (Target& t : targets_)
        if (auto r = session_->prepare_jump_probes(t.id); !r)
          std::fprintf(stderr, "xenprobe: domain %s: preparing jump probes: %s\n", t.name.c_str(),
                       r.error().what.c_str());
    if (auto r = session_->begin_batch(); !r) die("cannot begin registering: " + r.error().what);
    for (Target& t : targets_) {
      std::vector<std::int64_t> kaddrs;
      for (const std::string& sym : compiled_.kaddrs) {
        auto a = symbols_->resolve(t.id, sym);
        if (!a) fail_attach(t, "kaddr(\"" + sym + "\"): " + a.error().what);
        kaddrs.push_back(static_cast<std::int64_t>(a->value));
      }
      t.instance = std::make_unique<Instance>(compiled_, *out_, t.name, std::move(kaddrs),
                                              xenprobe::Limits{.max_map_keys = o_.max_map_keys});
      if (compiled_.uses_kstack) prepare_kstack(t);
      t.next_interval.assign(compiled_.program.blocks.size(), Clock::time_point::max());
      std::size_t skipped = 0;
      std::string first_skip;
      for (std::size_t b = 0; b < compiled_.program.blocks.size(); ++b) {
        for (const ProbeSpec& spec : compiled_.program.blocks[b].specs) {
          if (spec.kind != ProbeKind::Kprobe && spec.kind != ProbeKind::Kretprobe) continue;
          std::vector<std::string> points;
          if (spec.wildcard) {
            auto fs = symbols_->functions(t.id, spec.function);
            if (!fs) fail_attach(t, spec.text + ": " + fs.error().what);
            for (auto& f : *fs) points.push_back(f.name);
            if (points.empty())
              fail_attach(t, spec.text + " matches no function (see: xenprobe list -d " + t.name + " '" +
                                 spec.function + "')" + module_note(spec.function));
          } else {
            points.push_back(spec.function);
          }
          for (const std::string& fn : points) {
            std::string where = spec.offset ? fn + "+0x" + hex(spec.offset) : fn;
            const std::string kind = spec.kind == ProbeKind::Kprobe ? "kprobe:" : "kretprobe:";
            sites_.push_back(ProbeSite{fn, kind + where});
            const ProbeSite* site = &sites_.back();
            Instance* inst = t.instance.get();
            const int block = static_cast<int>(b);
            xenprobes::Result<xenprobes::Probe> p;
            if (spec.kind == ProbeKind::Kprobe && async_) {
              p = session_->probe_async(
                  t.id, std::string_view(where),
                  [this, inst, block, site](const xenprobes::AsyncHit& h) { on_record(*inst, block, *site, h); },
                  xenprobes::AsyncOptions{plans_[b].captures});
            } else if (spec.kind == ProbeKind::Kprobe) {
              p = session_->probe(
                  t.id, std::string_view(where),
                  [this, inst, block, site](xenprobes::HitContext& c) {
                    on_hit(*inst, block, *site, c);
                    return 0;
                  },
                  {}, xenprobes::ProbeOptions{method_});
            } else {
              p = session_->ret_probe(
                  t.id, std::string_view(fn), {},
                  [this, inst, block, site](xenprobes::HitContext& c, std::span<std::byte>) {
                    on_hit(*inst, block, *site, c);
                  },
                  xenprobes::RetProbeOptions{.maxactive = static_cast<int>(o_.maxactive)});
            }
            if (!p) {
              if (!spec.wildcard)
                fail_attach(t, site->probe + ": " + p.error().what +
                                   (p.error().code == xenprobes::Errc::NotFound ? not_found_note(t, fn) : ""));
              if (!skipped++) first_skip = site->probe + ": " + p.error().what;
              continue;
            }
            t.probes.push_back(std::move(*p));
          }
        }
      }
      if (skipped)
        std::fprintf(
            stderr,
            "xenprobe: %s: %zu function(s) of a wildcard could not be probed and were left out; the first: %s\n",
            t.name.c_str(), skipped, first_skip.c_str());
    }
    if (auto r = session_->end_batch(); !r) die("cannot register the probes: " + r.error().what);
    if (async_)
      for (Target& t : targets_) t.ring_lost_base = ring_lost(t);  // the module's counts are since it loaded
    for (Target& t : targets_) {
      const std::size_t n = t.probes.size();
      if (out_->format() == OutputFormat::Json) {
        out_->record(t.name, "attached_probes", "{\"probes\": " + std::to_string(n) + "}");
      } else {
        auto ch = n ? session_->channel_name(t.id) : xenprobes::Result<std::string>(std::string("none"));
        out_->text(t.name, "Attaching " + std::to_string(n) + " probe" + (n == 1 ? "" : "s") + " to " + t.name +
                               " (domain " + std::to_string(t.id.value) + ", channel " + (ch ? *ch : "?") + ")...\n");
      }
    }
  }

  // kstack: the guest kernel's unwind tables and its function names, read before any probe is
  // in place; a hit then walks its stack while its vCPU waits.
  // The names follow the guest's modules as they come and go (StackNamer).
  void prepare_kstack(Target& t) {
    auto namer = std::make_shared<StackNamer>(*session_, t.id);
    if (auto r = namer->prepare(); !r) fail_attach(t, "kstack: " + r.error().what);
    t.instance->set_stack_source(
        [namer](xenprobes::HitContext& c, unsigned frames, std::string& out) { return namer->stack(c, frames, out); });
  }

  static std::string hex(std::uint64_t v) {
    char b[32];
    std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
    return b;
  }

  // After "no such function" for MODULE:FUNC: the module list is the one read at the start.
  static std::string module_note(const std::string& function) {
    const auto colon = function.find(':');
    if (colon == std::string::npos) return {};
    return "; a module's functions are those of the modules loaded when xenprobe starts: if " +
           function.substr(0, colon) + " is not loaded, load it in the guest, then start xenprobe";
  }

  // After "no symbol" for FUNC: where to look for the name (or, for MODULE:FUNC, module_note).
  static std::string not_found_note(const Target& t, const std::string& function) {
    if (function.find(':') != std::string::npos) return module_note(function);
    return " (the functions whose names contain it: xenprobe list -d " + t.name + " '*" + function + "*')";
  }

  [[noreturn]] void fail_attach(const Target& t, const std::string& what) {
    std::string also;
    if (auto e = session_->end_batch(); !e)
      also = " (ending the registration batch failed too: " + e.error().what + ")";
    die("domain " + t.name + ": " + what + also);
  }

  void on_hit(Instance& inst, int block, const ProbeSite& site, xenprobes::HitContext& c) {
    if (stopping_ || (o_.hit_limit && hits_ >= o_.hit_limit)) {
      c.stop();
      return;
    }
    ++hits_;
    count_hit(inst);
    inst.run(block, site, &c);
    if (inst.exit_requested() || (o_.hit_limit && hits_ >= o_.hit_limit)) {
      stopping_ = true;
      c.stop();
    }
  }

  // An async record (--method async): the block runs from it, as from a hit, after the fact.
  // Once exit() or -c stopped the run, the records still in the rings are dropped.
  void on_record(Instance& inst, int block, const ProbeSite& site, const xenprobes::AsyncHit& h) {
    if (stopping_ || (o_.hit_limit && hits_ >= o_.hit_limit)) return;
    ++hits_;
    count_hit(inst);
    RecordContext ctx(h, plans_[static_cast<std::size_t>(block)].captures);
    inst.run(block, site, &ctx, static_cast<std::int64_t>(h.time_ns));
    if (inst.exit_requested() || (o_.hit_limit && hits_ >= o_.hit_limit)) {
      stopping_ = true;
      // The losses are those until now: the guests go on hitting until the probes are out,
      // and what they drop after the stop is no loss of this run.
      count_ring_losses();
    }
  }

  void count_ring_losses() {
    for (Target& t : targets_) {
      if (t.gone || t.ring_lost_final) continue;
      const std::uint64_t now = ring_lost(t);
      t.ring_lost = now > t.ring_lost_base ? now - t.ring_lost_base : 0;
      t.ring_lost_final = true;
    }
  }

  // The hits of `t` its async rings had no room for (drops) or that Dom0 never read (missed,
  // by the records' sequence numbers), as of now. Reading the stats drains the rings: their
  // records' blocks run first.
  std::uint64_t ring_lost(const Target& t) {
    auto st = session_->ring_stats(t.id);
    if (!st) {
      std::fprintf(stderr, "xenprobe: %s: cannot read its async rings: %s\n", t.name.c_str(), st.error().what.c_str());
      return 0;
    }
    return st->drops + st->missed;
  }

  void run_blocks(Target& t, ProbeKind kind) {
    static const ProbeSite kBegin{"", "BEGIN"}, kEnd{"", "END"};
    for (std::size_t b = 0; b < compiled_.program.blocks.size(); ++b)
      for (const ProbeSpec& s : compiled_.program.blocks[b].specs)
        if (s.kind == kind) t.instance->run(static_cast<int>(b), kind == ProbeKind::Begin ? kBegin : kEnd, nullptr);
  }

  void begin() {
    for (Target& t : targets_) {
      run_blocks(t, ProbeKind::Begin);
      if (t.instance->exit_requested()) stopping_ = true;
    }
    const auto now = Clock::now();
    for (Target& t : targets_)
      for (std::size_t b = 0; b < compiled_.program.blocks.size(); ++b)
        for (const ProbeSpec& s : compiled_.program.blocks[b].specs)
          if (s.kind == ProbeKind::Interval) {
            interval_sites_.push_back(ProbeSite{"", s.text});
            t.next_interval[b] = now + std::chrono::nanoseconds(s.interval_ns);
          }
    for (const std::string& d : o_.sim_destroy) {
      auto at = d.rfind('@');
      if (at == std::string::npos) die("--sim-destroy " + d + ": write NAME@HITS");
      destroy_.push_back({d.substr(0, at), std::stoull(d.substr(at + 1)), false});
    }
    // The simulated guests were created paused: the probes are in place, let them run.
    for (DomId d : sim_paused_)
      if (auto r = session_->hypervisor().unpause(d); !r) die("cannot start simulated guest: " + r.error().what);
    started_ = Clock::now();
  }

  std::uint64_t interval_ns(std::size_t block) const {
    for (const ProbeSpec& s : compiled_.program.blocks[block].specs)
      if (s.kind == ProbeKind::Interval) return s.interval_ns;
    return 0;
  }

  void loop() {
    const auto deadline =
        o_.duration > 0
            ? started_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.duration))
            : Clock::time_point::max();
    while (!stopping_ && !g_signal) {
      auto now = Clock::now();
      if (now >= deadline) break;
      // Interval probes, in Dom0.
      auto next = deadline;
      for (Target& t : targets_) {
        if (t.gone) continue;
        for (std::size_t b = 0; b < t.next_interval.size(); ++b) {
          if (t.next_interval[b] == Clock::time_point::max()) continue;
          if (now >= t.next_interval[b]) {
            static const ProbeSite kInterval{"", "interval"};
            t.instance->run(static_cast<int>(b), kInterval, nullptr);
            if (t.instance->exit_requested()) stopping_ = true;
            t.next_interval[b] += std::chrono::nanoseconds(interval_ns(b));
          }
          next = std::min(next, t.next_interval[b]);
        }
      }
      if (stopping_) break;
      int wait_ms = 20;
      if (next != Clock::time_point::max())
        wait_ms = static_cast<int>(std::clamp<long long>(
            std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count(), 0, 20));
      auto r = session_->run_once(wait_ms);
      if (!r) {
        std::fprintf(stderr, "xenprobe: the session failed: %s; detaching\n", r.error().what.c_str());
        failed_ = true;
        break;
      }
      check_domains();
      if (std::all_of(targets_.begin(), targets_.end(), [](const Target& t) { return t.gone || t.halted; })) break;
    }
    if (g_signal) std::fprintf(stderr, "xenprobe: %s: detaching\n", g_signal == SIGINT ? "interrupted" : "terminated");
  }

  void count_hit(const Instance& inst) {
    for (Target& t : targets_)
      if (t.instance.get() == &inst) ++t.hits;
  }

  void check_domains() {
    for (auto& d : destroy_) {
      if (d.done || !host_) continue;
      for (Target& t : targets_)
        if (t.name == d.name && t.hits >= d.hits) {
          d.done = true;
          if (auto r = host_->destroy_domain(t.id); !r)
            std::fprintf(stderr, "xenprobe: --sim-destroy %s: %s\n", d.name.c_str(), r.error().what.c_str());
        }
    }
    for (Target& t : targets_) {
      if (t.gone || t.halted) continue;
      auto info = session_->hypervisor().domain_info(t.id);
      std::string why;
      if (!info) why = info.error().code == xenprobes::Errc::NoSuchDomain ? "it was destroyed" : info.error().what;
      else if (info->dying) why = "it is dying";
      else if (info->crashed) why = "it crashed";
      else if (info->shutdown) why = "it shut down";
      if (!why.empty()) {
        t.gone = true;
        collect_lost(t);
        // Let the session take in the domain's release (its @releaseDomain watch) first: a
        // probe of a domain the session has dropped unregisters with nothing to restore.
        if (auto r = session_->run_once(0); !r) failed_ = true;
        t.probes.clear();
        std::size_t left = std::count_if(targets_.begin(), targets_.end(), [](const Target& x) { return !x.gone; });
        std::fprintf(
            stderr, "xenprobe: domain %s (%u) is gone (%s); its probes went with it, %s\n", t.name.c_str(), t.id.value,
            why.c_str(),
            left ? ("going on with " + std::to_string(left) + " other domain(s)").c_str() : "no domain is left");
        continue;
      }
      if (host_ && o_.sim_iterations && host_->wait_halted(t.id, 0ms)) t.halted = true;
    }
  }

  void collect_lost(Target& t) {
    for (const xenprobes::Probe& p : t.probes) {
      auto st = p.stats();
      t.lost += st.unhandled + st.untracked_calls;
    }
  }

  void finish() {
    // Async records still in the rings: their blocks run before END (unless exit() or -c ended
    // the run: then on_record drops them), and what the rings lost is counted.
    if (async_) count_ring_losses();
    for (Target& t : targets_) run_blocks(t, ProbeKind::End);
    // Detach first, as bpftrace does: the guests run free while the maps are printed.
    for (Target& t : targets_) {
      if (!t.gone) collect_lost(t);
      for (xenprobes::Probe& p : t.probes)
        if (auto r = p.unregister(); !r)
          std::fprintf(stderr, "xenprobe: %s: cannot remove a probe: %s\n", t.name.c_str(), r.error().what.c_str());
      t.probes.clear();
    }
    if (out_->format() == OutputFormat::Text) out_->flush();
    for (Target& t : targets_) {
      if (out_->format() == OutputFormat::Text && !compiled_.maps.empty()) out_->text(t.name, "\n");
      t.instance->print_all_maps();
      if (t.lost || t.ring_lost) {
        if (out_->format() == OutputFormat::Json)
          out_->record(t.name, "lost_events", "{\"events\": " + std::to_string(t.lost + t.ring_lost) + "}");
        if (out_->format() == OutputFormat::Text && t.lost)
          std::fprintf(stderr, "xenprobe: %s: lost %llu events (hits the guest went through without a handler)\n",
                       t.name.c_str(), static_cast<unsigned long long>(t.lost));
        if (out_->format() == OutputFormat::Text && t.ring_lost)
          std::fprintf(stderr, "xenprobe: %s: Lost %llu events (async hits its rings had no room for)\n",
                       t.name.c_str(), static_cast<unsigned long long>(t.ring_lost));
      }
      for (std::size_t m = 0; m < compiled_.maps.size(); ++m)
        if (auto n = t.instance->updates_dropped(static_cast<int>(m)))
          std::fprintf(stderr, "xenprobe: %s: map %s was full (%zu keys): %llu updates with new keys dropped\n",
                       t.name.c_str(), compiled_.maps[m].name.c_str(), o_.max_map_keys,
                       static_cast<unsigned long long>(n));
      if (t.instance->read_errors())
        std::fprintf(stderr, "xenprobe: %s: %llu guest memory reads failed and gave 0 or \"\"\n", t.name.c_str(),
                     static_cast<unsigned long long>(t.instance->read_errors()));
    }
    out_->flush();
  }

  struct Destroy {
    std::string name;
    std::uint64_t hits;
    bool done;
  };

  Options o_;
  xenprobes::ProbeMethod method_;  // --method, for kprobes (kretprobes are trap probes)
  bool async_ = false;             // --method async: kprobes are async probes
  std::vector<AsyncPlan> plans_;   // per block, with async_
  std::unique_ptr<TypeSource> types_;
  Compiled compiled_;
  std::shared_ptr<xenprobes::hv::sim::SimHost> host_;
  std::vector<DomId> sim_paused_;
  std::unique_ptr<xenprobes::Session> session_;
  std::unique_ptr<SymbolSource> symbols_;
  std::unique_ptr<Output> out_;
  std::vector<Target> targets_;
  std::deque<ProbeSite> sites_;  // stable addresses: the handlers point at them
  std::deque<ProbeSite> interval_sites_;
  std::vector<Destroy> destroy_;
  std::uint64_t hits_ = 0;
  bool stopping_ = false;
  bool failed_ = false;  // the session's loop failed: the maps are printed, the exit status says so
  Clock::time_point started_;
};

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

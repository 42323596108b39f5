// xenprobe: the session (the simulated Xen's set-up or the real one), the domains -d selects with
// their symbols and types, and the list and doctor commands.
#include "main_internal.hpp"

namespace xenprobe {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "xenprobe: %s\n", msg.c_str());
  std::exit(1);
}

namespace {

// Does `spec` (-d or the DOMAIN of --symbols: a name, a domid or a glob of names) name it?
bool names_domain(const std::string& spec, const std::string& name, DomId id) {
  return spec == name || spec == std::to_string(id.value) || fnmatch(spec.c_str(), name.c_str(), 0) == 0;
}

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

}  // namespace

// The library's doctor for each selected domain: which channel can probe it, and why not.
int Tool::run_doctor() {
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

int Tool::run_list() {
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

void Tool::load_types() {
  if (o_.btf.empty()) return;
  try {
    types_ = open_btf_file(o_.btf);
  } catch (const std::exception& e) { die(e.what()); }
  types_->set_missing_type_hint(
      "--btf gives the kernel's types only: without it, xenprobe reads the guest kernel's BTF and its loaded "
      "modules' from its memory");
}

bool Tool::use_sim() const {
  if (o_.sim) return true;
  const char* b = secure_getenv("XENPROBES_BACKEND");
  return b && std::string_view(b) == "sim";
}

void Tool::open_session() {
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
void Tool::select_domains(bool symbols) {
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
  for (auto& g : guests) names += (names.empty() ? "" : ", ") + name_of(g) + " (" + std::to_string(g.domid.value) + ")";
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
std::unique_ptr<TypeSource> Tool::types_from_guests() {
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

}  // namespace xenprobe

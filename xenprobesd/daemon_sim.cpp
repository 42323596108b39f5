// The simulated Xen's guests (--sim): created paused (the demo guest, or an image given with
// --sim-image and its System.map with --sim-symbols) and started once the daemon has had its
// look at them, the cues that create more as the hits come in, and the note that every
// workload finished. (The cues that destroy or crash a guest inside a hit: Daemon::on_hit.)
#include <algorithm>
#include <cctype>

#include "daemon_internal.hpp"

namespace xenprobesd {

using namespace std::chrono_literals;
using nlohmann::ordered_json;
using xenprobes::DomId;

Daemon::SimCue Daemon::parse_cue(const std::string& spec, const char* option) {
  auto at = spec.rfind('@');
  if (at == std::string::npos || at == 0 || at + 1 >= spec.size() ||
      !std::all_of(spec.begin() + static_cast<long>(at) + 1, spec.end(), ::isdigit) || spec.size() - at > 19)
    throw std::runtime_error(std::string(option) + " " + spec + ": write NAME@HITS");
  return SimCue{spec.substr(0, at), std::stoull(spec.substr(at + 1)), false};
}

// --sim-write NAME@HITS:ADDR=HEX: ADDR in hex (0x optional), HEX the bytes in memory order.
Daemon::SimCue Daemon::parse_write_cue(const std::string& spec) {
  const auto colon = spec.find(':'), eq = spec.find('=');
  const auto bad = [&] { return std::runtime_error("--sim-write " + spec + ": write NAME@HITS:ADDR=HEXBYTES"); };
  if (colon == std::string::npos || eq == std::string::npos || eq < colon) throw bad();
  SimCue cue = parse_cue(spec.substr(0, colon), "--sim-write");
  std::string addr = spec.substr(colon + 1, eq - colon - 1), hex = spec.substr(eq + 1);
  if (addr.starts_with("0x")) addr = addr.substr(2);
  if (addr.empty() || addr.size() > 16 || !std::all_of(addr.begin(), addr.end(), ::isxdigit)) throw bad();
  if (hex.empty() || hex.size() % 2 || hex.size() > 8192 || !std::all_of(hex.begin(), hex.end(), ::isxdigit))
    throw bad();
  cue.address = std::stoull(addr, nullptr, 16);
  for (std::size_t i = 0; i < hex.size(); i += 2)
    cue.bytes.push_back(static_cast<std::byte>(std::stoul(hex.substr(i, 2), nullptr, 16)));
  return cue;
}

// The FILE of the NAME=FILE `specs` (--sim-image, --sim-symbols) that name this guest, "" for none.
static std::string sim_file_for(const std::vector<std::string>& specs, const std::string& name, const char* option) {
  std::string file;
  for (const std::string& s : specs) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
      throw std::runtime_error(std::string(option) + " " + s + ": write NAME=FILE");
    if (s.substr(0, eq) == name) file = s.substr(eq + 1);
  }
  return file;
}

void Daemon::sim_create(const std::string& name) {
  xenprobes::hv::sim::DomainConfig c;
  c.image = sim_file_for(sim_.images, name, "--sim-image");  // "" = the demo guest
  c.name = name;
  c.vcpus = sim_.vcpus;
  c.iterations = sim_.iterations;
  c.start_paused = true;  // like xl create -p: started once the daemon has had its look at it
  if (sim_.ring_order) c.module_ring_order = sim_.ring_order;
  if (sim_.type == "hvm" || sim_.type == "pvh") c.type = xenprobes::hv::GuestType::Hvm;
  else if (sim_.type != "pv") throw std::runtime_error("--sim-type: pv, pvh or hvm");
  auto id = host_->create_domain(c);
  if (!id) throw std::runtime_error("cannot create simulated guest " + name + ": " + id.error().what);
  // Its System.map, for a guest that boots its own image (the demo guest's is the library's default).
  if (const std::string map = sim_file_for(sim_.symbols, name, "--sim-symbols"); !map.empty())
    if (auto r = session_->load_symbols(*id, map); !r)
      throw std::runtime_error("--sim-symbols " + name + "=" + map + ": " + r.error().what);
  for (const std::string& l : sim_.labels) {
    auto colon = l.find(':'), eq = l.find('=');
    if (colon == std::string::npos || eq == std::string::npos || eq < colon)
      throw std::runtime_error("--sim-label " + l + ": write NAME:KEY=VALUE");
    if (l.substr(0, colon) != name) continue;
    const std::string path = "/local/domain/" + std::to_string(id->value) + "/" + l.substr(colon + 1, eq - colon - 1);
    if (auto r = watcher_->xs_write(path, l.substr(eq + 1)); !r)
      throw std::runtime_error("--sim-label " + l + ": " + r.error().what);
  }
  sim_paused_.push_back(*id);
  sim_domids_.insert(id->value);
}

void Daemon::sim_step() {
  if (!host_) return;
  for (SimCue& cue : creates_)
    if (!cue.done && hits_ >= cue.hits) {
      cue.done = true;
      sim_create(cue.name);
    }
  if (sim_.iterations == 0 || sim_idle_logged_) return;
  if (std::any_of(creates_.begin(), creates_.end(), [](const SimCue& c) { return !c.done; })) return;
  if (!sim_paused_.empty()) return;
  for (std::uint32_t id : sim_domids_) {
    auto info = watcher_->domain_info(DomId{id});
    if (!info || info->crashed || info->dying) continue;  // destroyed, or halted for good
    if (!host_->wait_halted(DomId{id}, 0ms)) return;
  }
  sim_idle_logged_ = true;
  log_.write("sim_idle", "INFO", ordered_json{{"body", "every simulated guest has finished its workload"}});
  notify_("STATUS=every simulated guest has finished its workload");
}

void Daemon::start_paused_guests() {
  for (DomId d : sim_paused_)
    if (auto r = watcher_->unpause(d); !r)
      std::fprintf(stderr, "xenprobesd: cannot start simulated guest %u: %s\n", d.value, r.error().what.c_str());
  sim_paused_.clear();
}

}  // namespace xenprobesd

// Which domains a program serves: the selectors, the scan of the domains (attach to the new
// and selected ones, retried after a failure; detach from the ones no longer selected), and a
// domain's end.
#include <fnmatch.h>

#include <cstdio>

#include "daemon_internal.hpp"

namespace xenprobesd {

using nlohmann::ordered_json;

namespace {

std::string domain_name(const xenprobes::hv::DomainInfo& d) {
  return d.name.empty() ? "domain-" + std::to_string(d.domid.value) : d.name;
}

}  // namespace

bool Daemon::matches(const ProgramConfig& p, const xenprobes::hv::DomainInfo& d, const std::string& name) {
  for (const Selector& s : p.domains) {
    switch (s.kind) {
      case Selector::Kind::Name:
        if (s.text == name) return true;
        break;
      case Selector::Kind::Domid:
        if (s.domid == d.domid.value) return true;
        break;
      case Selector::Kind::Glob:
        if (fnmatch(s.text.c_str(), name.c_str(), 0) == 0) return true;
        break;
      case Selector::Kind::Xenstore: {
        // The guest may write this key itself: it is only compared, bounded by xenstored's
        // own limit on a value's size, never parsed.
        auto v = watcher_->xs_read("/local/domain/" + std::to_string(d.domid.value) + "/" + s.text);
        if (v && v->find('\0') == std::string::npos && fnmatch(s.value.c_str(), v->c_str(), 0) == 0) return true;
        break;
      }
    }
  }
  return false;
}

void Daemon::domain_gone(const DomainKey& key, const std::string& why) {
  // Let the session take in the domain's release first (its own @releaseDomain watch): a
  // probe of a domain the session has dropped unregisters with nothing to restore.
  if (auto r = session_->run_once(0); !r)
    log_.write("error", "ERROR", ordered_json{{"body", "the session: " + r.error().what}});
  symbols_loaded_.erase(key);
  types_.erase(key);
  bool any = false;
  for (auto& p : programs_) {
    p->failed.erase(key);
    auto it = p->attached.find(key);
    if (it == p->attached.end()) continue;
    any = true;
    detach(*it->second, "the domain is gone (" + why + ")");
    p->attached.erase(it);
  }
  if (any) {
    auto n = names_.find(key);
    std::fprintf(stderr, "xenprobesd: domain %s (%u) is gone (%s); its probes went with it\n",
                 n != names_.end() ? n->second.c_str() : "?", key.domid, why.c_str());
  }
  names_.erase(key);
  domain_hits_.erase(key);
  ring_loss_.erase(key);
}

void Daemon::scan(const char* why) {
  (void)why;
  last_scan_ = Clock::now();
  auto doms = session_->hypervisor().list_domains();
  if (!doms) {
    log_.write("error", "ERROR", ordered_json{{"body", "cannot list the domains: " + doms.error().what}});
    return;
  }
  std::map<DomainKey, const xenprobes::hv::DomainInfo*> live;
  std::map<DomainKey, std::string> ending;
  for (const auto& d : *doms) {
    if (d.domid.value == 0) continue;  // Dom0 is never a target
    if (d.dying) ending[key_of(d)] = "it is dying";
    else if (d.crashed) ending[key_of(d)] = "it crashed";
    else if (d.shutdown) ending[key_of(d)] = "it shut down";
    else live[key_of(d)] = &d;
  }
  std::set<DomainKey> gone;
  for (auto& p : programs_) {
    for (auto& [k, a] : p->attached)
      if (!live.contains(k)) gone.insert(k);
    for (auto& [k, f] : p->failed)
      if (!live.contains(k)) gone.insert(k);
  }
  for (const DomainKey& k : gone) {
    auto e = ending.find(k);
    domain_gone(k, e != ending.end() ? e->second : "it was destroyed");
  }
  for (auto& [k, d] : live) {
    const std::string name = domain_name(*d);
    for (auto& p : programs_) {
      const bool want = matches(p->cfg, *d, name);
      auto it = p->attached.find(k);
      if (it != p->attached.end()) {
        if (!want) {
          detach(*it->second, "the domain is no longer selected");
          p->attached.erase(it);
        }
      } else if (want) {
        auto f = p->failed.find(k);
        if (f == p->failed.end() || Clock::now() >= f->second.retry_at) attach(*p, *d, name);
      } else {
        p->failed.erase(k);  // no longer selected: nothing to try again
      }
    }
  }
}

}  // namespace xenprobesd

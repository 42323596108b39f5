// SimXenHandle: the Hypervisor interface over the simulated host, with Xen 4.17 semantics.
#include <sys/mman.h>

#include <cstring>

#include "hv/sim/sim_host_impl.hpp"
#include "hv/sim/sim_xen_internal.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::hv::sim {
namespace {

bool valid_path(const std::string& p) {
  if (p.empty() || p.size() > 3072) return false;
  if (p[0] == '@') return p == "@introduceDomain" || p == "@releaseDomain";
  if (p[0] != '/') return false;
  return p.find("//") == std::string::npos && (p.size() == 1 || p.back() != '/');
}

}  // namespace

SimHost* sim_host_of(Hypervisor& h) {
  auto* s = dynamic_cast<SimXenHandle*>(&h);
  return s ? &s->host() : nullptr;
}

SimXenHandle::SimXenHandle(std::shared_ptr<SimHostImpl> host) : host_(std::move(host)) {}

SimXenHandle::~SimXenHandle() {
  std::lock_guard lk(host_->mu_);
  host_->watches_.remove_if([this](const SimHostImpl::Watch& w) { return w.handle == this; });
  for (unsigned i = 0; i < kNrVirqs; ++i)
    if (host_->virq_binder_[i] == this) host_->virq_binder_[i] = nullptr;
  for (auto& [id, d] : host_->domains_) {
    if (d->monitor_owner == this) d->monitor_owner = nullptr;
    for (auto& [port, gp] : d->guest_ports)
      if (gp.peer == this) gp.peer = nullptr;
  }
}

Result<std::string> SimXenHandle::version() {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::Version));
  return host_->opts_.xen_version;
}

Result<Capabilities> SimXenHandle::capabilities() {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::Capabilities));
  return Capabilities{host_->opts_.gdbsx, true};
}

DomainInfo SimXenHandle::info_locked(const Domain& d) const {
  DomainInfo i;
  i.domid = d.id;
  i.handle = d.handle;
  i.type = d.cfg.type;
  i.guest_width = 8;
  i.vcpus = static_cast<unsigned>(d.vcpus.size());
  i.online_vcpus = i.vcpus;
  i.paused = d.pause_count > 0;
  i.dying = d.dying;
  i.shutdown = d.crashed;
  i.crashed = d.crashed;
  i.debugged = d.debugging;
  i.name = d.cfg.name;
  return i;
}

Result<std::vector<DomainInfo>> SimXenHandle::list_domains() {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::ListDomains));
  std::vector<DomainInfo> out;
  DomainInfo dom0;
  dom0.domid = DomId{0};
  dom0.name = "Domain-0";
  dom0.vcpus = dom0.online_vcpus = 1;
  out.push_back(dom0);
  for (auto& [id, d] : host_->domains_) out.push_back(info_locked(*d));
  return out;
}

Result<DomainInfo> SimXenHandle::domain_info(DomId id) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::DomainInfo));
  auto it = host_->domains_.find(id);
  if (it == host_->domains_.end()) return fail(Errc::NoSuchDomain, "no domain " + dstr(id));
  return info_locked(*it->second);
}

Result<void> SimXenHandle::pause(DomId id) {
  std::unique_lock lk(host_->mu_);
  XP_TRY(host_->check(Op::Pause));
  Domain* d = XP_TRY(host_->dom(id));
  if (d->pause_count >= 255) return fail(Errc::Busy, "domain " + dstr(id) + " pause count at its limit (255)");
  d->pause_count++;
  // XEN_DOMCTL_pausedomain is synchronous: no vCPU runs once it returns.
  for (auto& v : d->vcpus) v->grace = false;
  for (auto& v : d->vcpus) {
    if (d->running_vcpu == static_cast<int>(v->id)) {
      host_->stop_vcpu_locked(lk, *d, *v);
      host_->resume_vcpu_locked(*v);
    }
  }
  return {};
}

Result<void> SimXenHandle::unpause(DomId id) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::Unpause));
  Domain* d = XP_TRY(host_->dom(id));
  if (d->pause_count == 0)
    return fail(Errc::InvalidArgument, "domain " + dstr(id) + " is not paused (unpause without a pause)");
  d->pause_count--;
  host_->cv_.notify_all();
  return {};
}

Result<VcpuRegs> SimXenHandle::get_vcpu_regs(DomId id, VcpuId vid) {
  std::unique_lock lk(host_->mu_);
  XP_TRY(host_->check(Op::GetRegs));
  Domain* d = XP_TRY(host_->dom(id));
  Vcpu* v = XP_TRY(host_->vcpu(*d, vid));
  host_->stop_vcpu_locked(lk, *d, *v);
  VcpuRegs r = host_->read_regs(*d, *v);
  host_->resume_vcpu_locked(*v);
  return r;
}

Result<void> SimXenHandle::set_vcpu_regs(DomId id, VcpuId vid, const VcpuRegs& r) {
  std::unique_lock lk(host_->mu_);
  XP_TRY(host_->check(Op::SetRegs));
  Domain* d = XP_TRY(host_->dom(id));
  Vcpu* v = XP_TRY(host_->vcpu(*d, vid));
  host_->stop_vcpu_locked(lk, *d, *v);
  host_->write_regs(*v, r, true);
  // HVM/PVH: which half of the top-level table pair cr3 names (see Vcpu::pti_user_half).
  if (d->cfg.type != GuestType::Pv) v->pti_user_half = (r.cr3 & 0x1000) != 0;
  host_->resume_vcpu_locked(*v);
  return {};
}

Result<ForeignMapping> SimXenHandle::map_frames(DomId id, std::span<const Frame> frames, MapAccess access) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::MapFrames));
  Domain* d = XP_TRY(host_->dom(id));
  if (frames.empty()) return fail(Errc::InvalidArgument, "map_frames: no frames");
  std::vector<std::uint64_t> gfns;
  for (Frame f : frames) {
    // PV guests name machine frames; only this domain's own frames can be mapped.
    if (f.value < d->mfn_base || f.value - d->mfn_base >= d->frame_count())
      return fail(Errc::Fault,
                  "domain " + dstr(id) + ": frame 0x" + std::to_string(f.value) + " is not a frame of this domain");
    gfns.push_back(f.value - d->mfn_base);
  }
  std::size_t len = frames.size() * kPageSize;
  int prot = access == MapAccess::ReadWrite ? PROT_READ | PROT_WRITE : PROT_READ;
  void* base = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return fail_errno(errno, "sim: map_frames reserve");
  for (std::size_t i = 0; i < gfns.size(); ++i) {
    void* p = mmap(static_cast<std::uint8_t*>(base) + i * kPageSize, kPageSize, prot, MAP_SHARED | MAP_FIXED,
                   d->ram->fd, static_cast<off_t>(gfns[i] * kPageSize));
    if (p == MAP_FAILED) {
      int e = errno;
      munmap(base, len);
      return fail_errno(e, "sim: map_frames");
    }
  }
  if (access == MapAccess::ReadWrite) {
    for (std::uint64_t g : gfns) {
      auto [it, fresh] = d->wframes.try_emplace(g);
      // A frame still listed (refs 0, not yet checked by the scheduler) keeps its shadow: a
      // fresh snapshot would hide a write made through the mapping just dropped.
      if (fresh) std::memcpy(it->second.shadow.data(), d->ram->base + g * kPageSize, kPageSize);
      it->second.refs++;
    }
  }
  // The unmapper keeps the host alive and drops the writable-frame references, so the
  // scheduler checks those frames for code changes one last time before forgetting them.
  auto host = host_;
  DomId dom_id = id;
  bool writable = access == MapAccess::ReadWrite;
  return ForeignMapping(static_cast<std::byte*>(base), frames.size(),
                        [host, dom_id, writable, gfns](std::byte* p, std::size_t pages) {
                          munmap(p, pages * kPageSize);
                          if (!writable) return;
                          std::lock_guard lk(host->mu_);
                          auto it = host->domains_.find(dom_id);
                          if (it == host->domains_.end()) return;
                          for (std::uint64_t g : gfns) {
                            auto w = it->second->wframes.find(g);
                            if (w != it->second->wframes.end() && w->second.refs > 0) w->second.refs--;
                          }
                        });
}

// ---- xenstore ----

Result<std::string> SimXenHandle::xs_read(const std::string& path) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::XsRead));
  auto it = host_->store_.find(path);
  if (it == host_->store_.end()) return fail(Errc::NotFound, "xenstore: no node " + path);
  return it->second;
}

Result<void> SimXenHandle::xs_write(const std::string& path, const std::string& value) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::XsWrite));
  if (!valid_path(path) || path[0] == '@') return fail(Errc::InvalidArgument, "xenstore: bad path '" + path + "'");
  host_->store_[path] = value;
  host_->fire_watches_locked(path, false);
  // The simulated guest module watches its oea-request key.
  for (auto& [id, d] : host_->domains_) {
    if (!d->cfg.publish_module || d->dying) continue;
    if (path == "/local/domain/" + std::to_string(id.value) + "/" XENPROBES_XS_DIR "/" XENPROBES_XS_OEA_REQUEST)
      host_->module_oea_request_locked(*d, value);
    if (path == "/local/domain/" + std::to_string(id.value) + "/" XENPROBES_XS_DIR "/" XENPROBES_XS_QUIESCE_REQUEST)
      host_->module_quiesce_request_locked(*d, value);
  }
  return {};
}

Result<void> SimXenHandle::xs_rm(const std::string& path) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::XsRm));
  bool any = false;
  for (auto it = host_->store_.begin(); it != host_->store_.end();) {
    if (it->first == path || it->first.starts_with(path + "/")) {
      it = host_->store_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  if (!any) return fail(Errc::NotFound, "xenstore: no node " + path);
  host_->fire_watches_locked(path, true);
  return {};
}

Result<std::vector<std::string>> SimXenHandle::xs_directory(const std::string& path) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::XsDirectory));
  std::vector<std::string> out;
  std::string prefix = path == "/" ? "/" : path + "/";
  bool exists = false;
  for (auto& [k, v] : host_->store_) {
    if (k == path) exists = true;
    if (!k.starts_with(prefix)) continue;
    exists = true;
    std::string child = k.substr(prefix.size());
    child = child.substr(0, child.find('/'));
    if (out.empty() || out.back() != child) out.push_back(child);
  }
  if (!exists) return fail(Errc::NotFound, "xenstore: no node " + path);
  return out;
}

Result<void> SimXenHandle::xs_grant_read(const std::string& path, DomId) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::XsGrantRead));
  if (!host_->store_.contains(path)) return fail(Errc::NotFound, "xenstore: no node " + path);
  return {};  // permissions are not modelled: Dom0 may read and write everything anyway
}

Result<void> SimXenHandle::xs_watch(const std::string& path, const std::string& token) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::XsWatch));
  if (!valid_path(path)) return fail(Errc::InvalidArgument, "xenstore: bad watch path '" + path + "'");
  for (auto& w : host_->watches_)
    if (w.handle == this && w.path == path && w.token == token)
      return fail(Errc::Exists, "xenstore: watch on " + path + " with this token exists");
  host_->watches_.push_back({this, path, token});
  queue_watch({path, token});  // xenstored fires every new watch once
  return {};
}

Result<void> SimXenHandle::xs_unwatch(const std::string& path, const std::string& token) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::XsUnwatch));
  auto n = host_->watches_.size();
  host_->watches_.remove_if(
      [&](const SimHostImpl::Watch& w) { return w.handle == this && w.path == path && w.token == token; });
  if (n == host_->watches_.size()) return fail(Errc::NotFound, "xenstore: no watch on " + path);
  return {};
}

void SimXenHandle::queue_watch(WatchEvent e) {
  watch_queue_.push_back(std::move(e));
  xs_fd_.signal();
}

Result<std::vector<WatchEvent>> SimXenHandle::xs_read_watches() {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::XsReadWatches));
  xs_fd_.drain();
  std::vector<WatchEvent> out(watch_queue_.begin(), watch_queue_.end());
  watch_queue_.clear();
  return out;
}

// ---- event channels ----

void SimXenHandle::raise_port(EvtchnPort p) {
  auto it = ports_.find(p);
  if (it == ports_.end()) return;
  Port& port = it->second;
  if (port.pending) return;  // one pending bit: further events coalesce
  port.pending = true;
  if (!port.masked) {
    port.masked = true;  // reported to userspace: masked until evtchn_unmask
    pending_queue_.push_back(p);
    ev_fd_.signal();
  }
}

void SimXenHandle::peer_gone(EvtchnPort p) {
  auto it = ports_.find(p);
  if (it != ports_.end()) it->second.dead = true;
}

Result<EvtchnPort> SimXenHandle::evtchn_bind_virq(unsigned virq) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::EvtchnBindVirq));
  if (virq >= kNrVirqs) return fail(Errc::InvalidArgument, "evtchn: no VIRQ " + std::to_string(virq));
  if (host_->virq_binder_[virq])
    return fail(Errc::Exists, "evtchn: global VIRQ " + std::to_string(virq) +
                                  " is already bound by another process on this host (one binder per host)");
  EvtchnPort p = next_port_++;
  ports_[p] = Port{Port::Kind::Virq, virq, DomId{0}, 0};
  host_->virq_binder_[virq] = this;
  host_->virq_port_[virq] = p;
  return p;
}

Result<EvtchnPort> SimXenHandle::evtchn_bind_interdomain(DomId id, std::uint32_t remote) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::EvtchnBindInterdomain));
  Domain* d = XP_TRY(host_->dom(id));
  auto it = d->guest_ports.find(remote);
  if (it == d->guest_ports.end())
    return fail(Errc::InvalidArgument, "evtchn: domain " + dstr(id) + " has no port " + std::to_string(remote));
  if (it->second.peer) return fail(Errc::Busy, "evtchn: port " + std::to_string(remote) + " is already bound");
  EvtchnPort p = next_port_++;
  ports_[p] = Port{Port::Kind::Interdomain, 0, id, remote};
  it->second.peer = this;
  it->second.peer_port = p;
  return p;
}

Result<void> SimXenHandle::evtchn_unbind(EvtchnPort p) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::EvtchnUnbind));
  auto it = ports_.find(p);
  if (it == ports_.end()) return fail(Errc::InvalidArgument, "evtchn: port " + std::to_string(p) + " not bound");
  if (it->second.kind == Port::Kind::Virq) {
    host_->virq_binder_[it->second.virq] = nullptr;
  } else if (auto d = host_->domains_.find(it->second.dom); d != host_->domains_.end()) {
    auto gp = d->second->guest_ports.find(it->second.remote);
    if (gp != d->second->guest_ports.end() && gp->second.peer == this) gp->second.peer = nullptr;
  }
  ports_.erase(it);
  std::erase(pending_queue_, p);
  return {};
}

Result<void> SimXenHandle::evtchn_notify(EvtchnPort p) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::EvtchnNotify));
  auto it = ports_.find(p);
  if (it == ports_.end()) return fail(Errc::InvalidArgument, "evtchn: port " + std::to_string(p) + " not bound");
  if (it->second.kind != Port::Kind::Interdomain)
    return fail(Errc::InvalidArgument, "evtchn: cannot notify a VIRQ port");
  auto d = host_->domains_.find(it->second.dom);
  if (it->second.dead || d == host_->domains_.end() || d->second->dying)
    return fail(Errc::NoSuchDomain, "evtchn: the remote domain " + dstr(it->second.dom) + " is gone");
  d->second->guest_ports[it->second.remote].notifications++;
  host_->cv_.notify_all();  // a guest vCPU may be polling this port (the guest module's hook)
  return {};
}

Result<std::optional<EvtchnPort>> SimXenHandle::evtchn_pending() {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::EvtchnPending));
  if (pending_queue_.empty()) {
    ev_fd_.drain();
    return std::optional<EvtchnPort>{};
  }
  EvtchnPort p = pending_queue_.front();
  pending_queue_.pop_front();
  if (pending_queue_.empty()) ev_fd_.drain();
  auto it = ports_.find(p);
  if (it != ports_.end()) it->second.pending = false;
  return std::optional<EvtchnPort>{p};
}

Result<void> SimXenHandle::evtchn_unmask(EvtchnPort p) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::EvtchnUnmask));
  auto it = ports_.find(p);
  if (it == ports_.end()) return fail(Errc::InvalidArgument, "evtchn: port " + std::to_string(p) + " not bound");
  it->second.masked = false;
  if (it->second.pending) {  // an event arrived while masked: deliver it now
    it->second.masked = true;
    pending_queue_.push_back(p);
    ev_fd_.signal();
  }
  return {};
}

// ---- debugging mode ----

Result<void> SimXenHandle::set_debugging(DomId id, bool on) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::SetDebugging));
  Domain* d = XP_TRY(host_->dom(id));
  // Succeeds with or without GDBSX, exactly as XEN_DOMCTL_setdebugging does.
  d->debugging = on;
  return {};
}

Result<GdbsxStatus> SimXenHandle::gdbsx_domstatus(DomId id) {
  std::lock_guard lk(host_->mu_);
  XP_TRY(host_->check(Op::GdbsxDomstatus));
  if (!host_->opts_.gdbsx)
    return fail(Errc::NoSys, "XEN_DOMCTL_gdbsx_domstatus: hypervisor built without CONFIG_GDBSX");
  Domain* d = XP_TRY(host_->dom(id));
  GdbsxStatus s;
  s.paused = d->pause_count > 0;
  if (!s.paused) return s;  // Xen reports vCPU events only while controller-paused
  for (auto& v : d->vcpus) {
    if (v->gdbsx_event) {
      s.vcpu = v->id;
      s.event = v->gdbsx_event;
      v->gdbsx_event = 0;
      break;
    }
  }
  return s;
}

// ---- guest side of event channels (SimHost API) ----

Result<std::uint32_t> SimHostImpl::guest_evtchn_alloc_unbound(DomId id) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  std::uint32_t p = d->next_guest_port++;
  d->guest_ports[p] = GuestPort{};
  return p;
}

Result<void> SimHostImpl::guest_evtchn_notify(DomId id, std::uint32_t port) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  auto it = d->guest_ports.find(port);
  if (it == d->guest_ports.end()) return fail(Errc::InvalidArgument, "guest has no port " + std::to_string(port));
  if (it->second.peer) it->second.peer->raise_port(it->second.peer_port);
  return {};
}

Result<SimHost::ModuleNotifications> SimHostImpl::module_notifications(DomId id) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  return ModuleNotifications{d->module.notified, d->module.unnotified};
}

Result<void> SimHostImpl::hold_module_hits(DomId id, VcpuId vid, bool hold) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  Vcpu* v = XP_TRY(vcpu(*d, vid));
  v->module_hold = hold;
  if (!hold && v->module_held) {
    v->module_held = false;
    if (d->module.dom0_gone || d->module.detaching || module_over_budget_locked(*d, *v))
      module_fallback_locked(*d, *v, v->module_entry, v->module_regs);
    else module_publish_hit_locked(*d, *v, v->module_entry, v->module_regs, 0);
    cv_.notify_all();
  }
  return {};
}

Result<bool> SimHostImpl::module_hit_held(DomId id, VcpuId vid) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  return XP_TRY(vcpu(*d, vid))->module_held;
}

Result<unsigned> SimHostImpl::module_state(DomId id, const std::string& name, std::uint64_t text_base, bool going) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  ModuleState& m = d->module;
  const std::uint32_t mid = xenprobes_module_id(name.c_str(), name.size(), text_base);
  if (!going) {
    xp_gone_coming(&m.gone, mid);
  } else if (m.present) {
    std::uint8_t* ctl = d->ram->base + m.ctl_gpa;
    const std::uint32_t nr = std::atomic_ref<std::uint32_t>(
                                 *reinterpret_cast<std::uint32_t*>(ctl + offsetof(xenprobes_ctl_header, nr_traps)))
                                 .load(std::memory_order_acquire);
    xp_gone_going(&m.gone, mid, reinterpret_cast<const xenprobes_trap*>(ctl + m.trap_offset), nr, m.trap_capacity);
  }
  return std::min<unsigned>(m.gone.n, XP_GONE_MAX);
}

Result<std::uint64_t> SimHostImpl::guest_evtchn_notifications(DomId id, std::uint32_t port) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  auto it = d->guest_ports.find(port);
  if (it == d->guest_ports.end()) return fail(Errc::InvalidArgument, "guest has no port " + std::to_string(port));
  return it->second.notifications;
}

}  // namespace xenprobes::hv::sim

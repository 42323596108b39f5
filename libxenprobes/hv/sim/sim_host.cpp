// The simulated Xen host: domains, vCPU scheduling, traps, the vm_event ring, event channels
// and xenstore. See sim.hpp for what is modelled and sim_internal.hpp for the state. Here: the
// small pieces, fault injection, the public host API and xenstore's watches; domain creation
// is in sim_host_domain.cpp, the scheduler (Unicorn hooks, traps, emulation, registers) in
// sim_host_sched.cpp.
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <filesystem>

#include "hv/sim/sim_host_impl.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::hv::sim {

// ---------------------------------------------------------------------------------------
// Small pieces

EventFd::EventFd() { fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }
EventFd::~EventFd() {
  if (fd_ >= 0) close(fd_);
}
void EventFd::signal() {
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = write(fd_, &one, sizeof one);
}
void EventFd::drain() {
  std::uint64_t v;
  [[maybe_unused]] auto n = read(fd_, &v, sizeof v);
}

GuestRam::~GuestRam() {
  if (base) munmap(base, size);
  if (fd >= 0) close(fd);
}

const char* op_name(Op op) {
  static const char* names[] = {"version",
                                "capabilities",
                                "list_domains",
                                "domain_info",
                                "pause",
                                "unpause",
                                "get_vcpu_regs",
                                "set_vcpu_regs",
                                "map_frames",
                                "xs_read",
                                "xs_write",
                                "xs_rm",
                                "xs_directory",
                                "xs_grant_read",
                                "xs_watch",
                                "xs_unwatch",
                                "xs_read_watches",
                                "evtchn_bind_virq",
                                "evtchn_bind_interdomain",
                                "evtchn_unbind",
                                "evtchn_notify",
                                "evtchn_pending",
                                "evtchn_unmask",
                                "set_debugging",
                                "gdbsx_domstatus",
                                "monitor_enable",
                                "monitor_disable",
                                "monitor_software_breakpoint",
                                "monitor_debug_exceptions",
                                "inject_event",
                                "ring_get_request",
                                "ring_put_response",
                                "ring_notify"};
  static_assert(sizeof names / sizeof names[0] == static_cast<unsigned>(Op::Count_));
  return names[static_cast<unsigned>(op)];
}

// Unicorn 2.0.1 engines are not safe to use concurrently from several threads, even when
// they are distinct instances: reading or writing the registers of one engine while another
// emulates corrupted vCPU registers (two domains probed at once: a vCPU resumed with a wild
// RIP about one run in 15). Every Unicorn call in the process is serialised by this lock
// (recursive: trap handling reads registers while holding it). The sim is not a performance
// model; the machines it runs on have few cores anyway.
std::recursive_mutex& emulation_mutex() {
  static std::recursive_mutex m;
  return m;
}

// ---------------------------------------------------------------------------------------
// Host

// NOLINTNEXTLINE(performance-unnecessary-value-param): the public signature takes it by value.
std::shared_ptr<SimHost> SimHost::create(SimOptions o) { return std::make_shared<SimHostImpl>(o); }

SimHostImpl::SimHostImpl(SimOptions o) : opts_(std::move(o)) {
  if (opts_.manual_clock) clock_ = std::make_unique<ManualClock>();
  else clock_ = std::make_unique<RealClock>();
  store_["/local/domain/0/name"] = "Domain-0";
  store_["/local/domain/0/domid"] = "0";
}

SimHostImpl::~SimHostImpl() {
  std::vector<DomId> ids;
  {
    std::lock_guard lk(mu_);
    for (auto& [id, d] : domains_) ids.push_back(id);
  }
  for (DomId id : ids) best_effort(destroy_domain(id), "sim: destroying a domain at exit");
}

Result<void> SimHostImpl::check(Op op) {
  // Called with mu_ held.
  std::uint64_t n = total_calls_++;
  counts_[static_cast<unsigned>(op)]++;
  if (from_fault_ && n >= from_fault_->first)
    return fail(from_fault_->second,
                std::string("sim: injected fault in ") + op_name(op) + " (every call from here on)");
  if (nth_fault_ && nth_fault_->first == n) {
    Errc c = nth_fault_->second;
    nth_fault_.reset();
    return fail(c, std::string("sim: injected fault in ") + op_name(op));
  }
  for (auto it = faults_.begin(); it != faults_.end(); ++it) {
    if (it->op != op) continue;
    if (it->skip > 0) {
      --it->skip;
      continue;
    }
    Errc c = it->code;
    if (--it->count == 0) faults_.erase(it);
    return fail(c, std::string("sim: injected fault in ") + op_name(op));
  }
  return {};
}

void SimHostImpl::fail_op(Op op, Errc code, unsigned skip, unsigned count) {
  std::lock_guard lk(mu_);
  if (count) faults_.push_back({op, code, skip, count});
}
void SimHostImpl::fail_nth_call(std::uint64_t n, Errc code) {
  std::lock_guard lk(mu_);
  nth_fault_ = {total_calls_ + n, code};
}
void SimHostImpl::fail_from_call(std::uint64_t n, Errc code) {
  std::lock_guard lk(mu_);
  from_fault_ = {total_calls_ + n, code};
}
void SimHostImpl::clear_faults() {
  std::lock_guard lk(mu_);
  faults_.clear();
  nth_fault_.reset();
  from_fault_.reset();
}
std::uint64_t SimHostImpl::op_count(Op op) const {
  std::lock_guard lk(mu_);
  return counts_[static_cast<unsigned>(op)];
}
std::uint64_t SimHostImpl::total_calls() const {
  std::lock_guard lk(mu_);
  return total_calls_;
}
void SimHostImpl::reset_counts() {
  std::lock_guard lk(mu_);
  counts_.fill(0);
}

Result<Domain*> SimHostImpl::dom(DomId id) {
  auto it = domains_.find(id);
  if (it == domains_.end() || it->second->dying)
    return fail(Errc::NoSuchDomain, "no domain " + std::to_string(id.value));
  return it->second.get();
}

Result<Vcpu*> SimHostImpl::vcpu(Domain& d, VcpuId v) {
  if (v.value >= d.vcpus.size())
    return fail(Errc::InvalidArgument,
                "domain " + std::to_string(d.id.value) + " has no vCPU " + std::to_string(v.value));
  return d.vcpus[v.value].get();
}

// ---------------------------------------------------------------------------------------
// Public host API

Result<void> SimHostImpl::crash_domain(DomId id, const std::string& why) {
  std::unique_lock lk(mu_);
  auto it = domains_.find(id);
  if (it == domains_.end() || it->second->dying)
    return fail(Errc::NoSuchDomain, "no domain " + std::to_string(id.value));
  crash(*it->second, why);
  return {};
}

Result<void> SimHostImpl::destroy_domain(DomId id) {
  std::unique_ptr<Domain> d;
  {
    std::unique_lock lk(mu_);
    auto it = domains_.find(id);
    if (it == domains_.end()) return fail(Errc::NoSuchDomain, "no domain " + std::to_string(id.value));
    Domain& dom = *it->second;
    if (dom.dying) return fail(Errc::NoSuchDomain, "domain " + std::to_string(id.value) + " is dying");
    dom.dying = true;
    for (auto& v : dom.vcpus) {
      v->stop_requested = true;
      uc_emu_stop(v->uc);
    }
    cv_.notify_all();
  }
  Domain* raw;
  {
    std::lock_guard lk(mu_);
    raw = domains_[id].get();
  }
  if (raw->thread.joinable()) raw->thread.join();
  std::lock_guard lk(mu_);
  d = std::move(domains_[id]);
  domains_.erase(id);
  {
    std::lock_guard emu(emulation_mutex());
    for (auto& v : d->vcpus) uc_close(v->uc);
  }
  std::string home = "/local/domain/" + std::to_string(id.value);
  for (auto it = store_.begin(); it != store_.end();) {
    if (it->first == home || it->first.starts_with(home + "/")) it = store_.erase(it);
    else ++it;
  }
  if (d->monitor_owner) d->monitor_owner->ring_signal();
  for (auto& [port, gp] : d->guest_ports)
    if (gp.peer) gp.peer->peer_gone(gp.peer_port);
  fire_watches_locked("@releaseDomain", false);
  return {};
}

std::unique_ptr<Hypervisor> SimHostImpl::open() {
  return std::make_unique<SimXenHandle>(std::static_pointer_cast<SimHostImpl>(shared_from_this()));
}

Result<GuestLayout> SimHostImpl::layout(DomId id) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  return d->layout;
}

Result<std::uint64_t> SimHostImpl::symbol(DomId id, const std::string& name) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  auto it = d->image.symbols.find(name);
  if (it == d->image.symbols.end()) return fail(Errc::NotFound, "sim: no symbol " + name);
  return it->second;
}

Result<void> SimHostImpl::peek(DomId id, std::uint64_t va, std::span<std::byte> out) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  for (const Alias& a : d->aliases) {
    if (va >= a.va && va - a.va < a.len && out.size() <= a.len - (va - a.va)) {
      std::memcpy(out.data(), d->ram->base + a.gpa + (va - a.va), out.size());
      return {};
    }
  }
  return fail(Errc::Fault, "sim: peek outside the guest's mappings");
}

Result<unsigned> SimHostImpl::writable_mappings(DomId id, std::uint64_t va) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  for (const Alias& a : d->aliases) {
    if (va < a.va || va - a.va >= a.len) continue;
    auto it = d->wframes.find((a.gpa + (va - a.va)) / kPageSize);
    return it == d->wframes.end() ? 0u : it->second.refs;
  }
  return fail(Errc::Fault, "sim: writable_mappings outside the guest's mappings");
}

std::string SimHostImpl::console(DomId id) {
  std::lock_guard lk(mu_);
  auto it = domains_.find(id);
  return it == domains_.end() ? "" : it->second->console;
}

std::string SimHostImpl::crash_reason(DomId id) {
  std::lock_guard lk(mu_);
  auto it = domains_.find(id);
  return it == domains_.end() ? "" : it->second->crash_reason;
}

bool SimHostImpl::wait_halted(DomId id, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto it = domains_.find(id);
    if (it == domains_.end() || it->second->dying || it->second->crashed) return false;
    bool all = std::all_of(it->second->vcpus.begin(), it->second->vcpus.end(), [](const auto& v) { return v->halted; });
    if (all) return true;
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && std::chrono::steady_clock::now() >= deadline)
      return false;
  }
}

Result<std::uint64_t> SimHostImpl::executions(DomId id, std::uint64_t va) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  auto it = d->executions.find(va);
  if (it == d->executions.end()) return fail(Errc::NotFound, "sim: executions at this address are not counted");
  return it->second;
}

Result<void> SimHostImpl::advance_clock(std::chrono::milliseconds by) {
  std::unique_lock lk(mu_);
  if (!clock_->manual()) return fail(Errc::InvalidArgument, "sim: advance_clock needs SimOptions::manual_clock");
  if (by.count() < 0) return fail(Errc::InvalidArgument, "sim: the clock does not go back");
  clock_->advance(by);
  const std::uint64_t gen = ++clock_advances_;
  cv_.notify_all();
  // Every live domain's scheduler runs module_poll_locked at the top of its loop: between two
  // quanta, or at once when it waits with nothing to run (the notification above).
  const bool polled = cv_.wait_for(lk, std::chrono::seconds(30), [&] {
    return std::all_of(domains_.begin(), domains_.end(),
                       [&](const auto& e) { return e.second->dying || e.second->clock_seen >= gen; });
  });
  if (!polled) return fail(Errc::TimedOut, "sim: a domain's scheduler did not look at the advanced clock within 30 s");
  return {};
}

Result<unsigned> SimHostImpl::pause_count(DomId id) {
  std::lock_guard lk(mu_);
  Domain* d = XP_TRY(dom(id));
  return d->pause_count;
}

// ---------------------------------------------------------------------------------------
// Xenstore

// The guest module's side of the growth protocol (protocol.h): Dom0 wrote oea-request.
void SimHostImpl::module_oea_request_locked(Domain& d, const std::string& value) {
  std::string dir = "/local/domain/" + std::to_string(d.id.value) + "/" XENPROBES_XS_DIR "/";
  char* end = nullptr;
  unsigned long long want = std::strtoull(value.c_str(), &end, 10);
  auto refuse = [&](const std::string& why) {
    store_[dir + XENPROBES_XS_OEA_ERROR] = why;
    fire_watches_locked(dir + XENPROBES_XS_OEA_ERROR, false);
  };
  if (value.empty() || *end || want == 0) return refuse("bad request '" + value + "'");
  if (want > d.cfg.oea_size) return refuse("an area holds at most " + std::to_string(d.cfg.oea_size) + " bytes");
  if (d.oea_reserve.empty()) return refuse("no memory for another area");
  std::uint64_t va = d.oea_reserve.front();
  d.oea_reserve.erase(d.oea_reserve.begin());
  unsigned n = d.oea_published++;
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%" PRIx64, va);
  store_[dir + "oea/" + std::to_string(n) + "/addr"] = hex;
  store_[dir + "oea/" + std::to_string(n) + "/size"] = std::to_string(d.cfg.oea_size);
  store_[dir + XENPROBES_XS_OEA_COUNT] = std::to_string(n + 1);  // last: the area is complete
  fire_watches_locked(dir + XENPROBES_XS_OEA_COUNT, false);
}

namespace {
bool watch_matches(const std::string& watch, const std::string& changed, bool removal) {
  if (watch == changed) return true;
  if (changed.starts_with(watch) && changed.size() > watch.size() && changed[watch.size()] == '/') return true;
  // Removing a node also removes (and so fires watches on) everything below it.
  return removal && watch.starts_with(changed) && watch.size() > changed.size() && watch[changed.size()] == '/';
}
}  // namespace

void SimHostImpl::fire_watches_locked(const std::string& path, bool removal) {
  for (auto& w : watches_)
    if (watch_matches(w.path, path, removal)) w.handle->queue_watch({path, w.token});
}

// ---------------------------------------------------------------------------------------

std::string default_guest_dir() {
  namespace fs = std::filesystem;
#ifdef XENPROBES_INSTALL_GUEST_DIR
  if (fs::exists(fs::path(XENPROBES_INSTALL_GUEST_DIR) / "vmlinux")) return XENPROBES_INSTALL_GUEST_DIR;
#endif
#ifdef XENPROBES_BUILD_GUEST_DIR
  if (fs::exists(fs::path(XENPROBES_BUILD_GUEST_DIR) / "vmlinux")) return XENPROBES_BUILD_GUEST_DIR;
  return XENPROBES_BUILD_GUEST_DIR;
#else
  return "/usr/share/xenprobes/demo-guest";
#endif
}

}  // namespace xenprobes::hv::sim

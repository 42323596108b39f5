// The simulated Xen host: domains, vCPU scheduling, traps, the vm_event ring, event channels
// and xenstore. See sim.hpp for what is modelled and sim_internal.hpp for the state.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <random>

#include "common/log.hpp"
#include "hv/sim/page_table_builder.hpp"
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

// As xl gives every domain a fresh UUID: random bits drawn once per process, and a counter,
// so that no two domains this process creates share a handle (a reused domid included).
static DomainHandle new_domain_handle() {
  static const std::array<std::uint32_t, 2> seed = [] {
    std::random_device rd;
    return std::array<std::uint32_t, 2>{rd(), rd()};
  }();
  static std::atomic<std::uint64_t> made{0};
  const std::uint64_t n = ++made;
  DomainHandle h{};
  std::memcpy(h.data(), seed.data(), 8);
  std::memcpy(h.data() + 8, &n, 8);
  h[6] = static_cast<std::uint8_t>((h[6] & 0x0f) | 0x40);  // UUID version 4
  h[8] = static_cast<std::uint8_t>((h[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return h;
}

GuestRam::~GuestRam() {
  if (base) munmap(base, size);
  if (fd >= 0) close(fd);
}

const char* op_name(Op op) {
  static const char* names[] = {
      "version", "capabilities", "list_domains", "domain_info", "pause", "unpause",
      "get_vcpu_regs", "set_vcpu_regs", "map_frames", "xs_read", "xs_write", "xs_rm",
      "xs_directory", "xs_grant_read", "xs_watch", "xs_unwatch", "xs_read_watches",
      "evtchn_bind_virq", "evtchn_bind_interdomain", "evtchn_unbind", "evtchn_notify",
      "evtchn_pending", "evtchn_unmask", "set_debugging", "gdbsx_domstatus", "monitor_enable",
      "monitor_disable", "monitor_software_breakpoint", "monitor_debug_exceptions",
      "inject_event", "ring_get_request", "ring_put_response", "ring_notify"};
  static_assert(sizeof names / sizeof names[0] == static_cast<unsigned>(Op::Count_));
  return names[static_cast<unsigned>(op)];
}

namespace {

constexpr std::uint64_t kKernelMapBase = 0xffffffff80000000ull;  // Linux __START_KERNEL_map
constexpr std::uint64_t kPhysmapBase = 0xffff888000000000ull;    // Linux direct map
constexpr std::uint64_t kOeaVa = 0xffffffffa0000000ull;          // Linux module area
constexpr std::uint64_t kTablesGpa = 0x100000, kTablesLimit = 0x400000;
constexpr std::uint64_t kTf = 0x100;

thread_local Vcpu* t_current = nullptr;  // the vCPU this scheduler thread is running

}  // namespace

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

namespace {

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace

// ---------------------------------------------------------------------------------------
// Host

std::shared_ptr<SimHost> SimHost::create(SimOptions o) { return std::make_shared<SimHostImpl>(o); }

SimHostImpl::SimHostImpl(SimOptions o) : opts_(std::move(o)) {
  if (opts_.manual_clock)
    clock_ = std::make_unique<ManualClock>();
  else
    clock_ = std::make_unique<RealClock>();
  store_["/local/domain/0/name"] = "Domain-0";
  store_["/local/domain/0/domid"] = "0";
}

SimHostImpl::~SimHostImpl() {
  std::vector<DomId> ids;
  {
    std::lock_guard lk(mu_);
    for (auto& [id, d] : domains_) ids.push_back(id);
  }
  for (DomId id : ids) (void)destroy_domain(id);
}

Result<void> SimHostImpl::check(Op op) {
  // Called with mu_ held.
  std::uint64_t n = total_calls_++;
  counts_[static_cast<unsigned>(op)]++;
  if (from_fault_ && n >= from_fault_->first)
    return fail(from_fault_->second, std::string("sim: injected fault in ") + op_name(op) + " (every call from here on)");
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
    return fail(Errc::InvalidArgument, "domain " + std::to_string(d.id.value) + " has no vCPU " +
                                           std::to_string(v.value));
  return d.vcpus[v.value].get();
}

// ---------------------------------------------------------------------------------------
// Domain creation

Result<DomId> SimHostImpl::create_domain(const DomainConfig& cfg_in) {
  DomainConfig cfg = cfg_in;
  if (cfg.vcpus == 0 || cfg.vcpus > 64) return fail(Errc::InvalidArgument, "sim: vcpus must be 1..64");
  if (cfg.ram_mb < 32 || cfg.ram_mb > 4096) return fail(Errc::InvalidArgument, "sim: ram_mb must be 32..4096");
  if (cfg.oea_size == 0 || cfg.oea_size % 4096 || cfg.oea_size > (8u << 20))
    return fail(Errc::InvalidArgument, "sim: oea_size must be a multiple of 4096, at most 8 MiB");
  if (cfg.image.empty()) cfg.image = default_guest_dir() + "/vmlinux";
  ElfImage img = XP_TRY(load_elf(cfg.image));

  auto d = std::make_unique<Domain>();
  d->cfg = cfg;
  d->image = std::move(img);

  // Guest RAM.
  auto ram = std::make_shared<GuestRam>();
  ram->size = cfg.ram_mb << 20;
  ram->fd = memfd_create("xenprobes-sim-ram", MFD_CLOEXEC);
  if (ram->fd < 0) return fail_errno(errno, "sim: memfd_create");
  if (ftruncate(ram->fd, static_cast<off_t>(ram->size)) != 0) return fail_errno(errno, "sim: ftruncate");
  void* p = mmap(nullptr, ram->size, PROT_READ | PROT_WRITE, MAP_SHARED, ram->fd, 0);
  if (p == MAP_FAILED) return fail_errno(errno, "sim: mmap guest RAM");
  ram->base = static_cast<std::uint8_t*>(p);
  d->ram = ram;

  {
    std::lock_guard lk(mu_);
    if (cfg.domid == 0) {
      d->id = DomId{next_domid_++};
    } else {
      if (cfg.domid >= 0x7ff0) return fail(Errc::InvalidArgument, "sim: domid must be 1..0x7fef");
      if (domains_.contains(DomId{cfg.domid}))
        return fail(Errc::Exists, "sim: domain " + std::to_string(cfg.domid) + " exists");
      d->id = DomId{cfg.domid};
    }
    d->handle = new_domain_handle();
  }
  d->mfn_base = cfg.type == GuestType::Pv ? 0x100000ull * d->id.value : 0;

  // Load the image at GPA = VA - __START_KERNEL_map, as Linux places _text at 16 MiB.
  std::uint64_t img_lo = ~0ull, img_hi = 0;
  for (const auto& s : d->image.segments) {
    if (s.vaddr < kKernelMapBase + kTablesLimit || s.vaddr + s.memsz < s.vaddr)
      return fail(Errc::InvalidArgument, cfg.image + ": segment at 0x" + std::to_string(s.vaddr) +
                                             " is not in the kernel mapping (0xffffffff80400000 and up)");
    std::uint64_t gpa = s.vaddr - kKernelMapBase;
    if (gpa + s.memsz > ram->size / 2)
      return fail(Errc::InvalidArgument, cfg.image + ": image does not fit in half of guest RAM");
    std::memcpy(ram->base + gpa, s.bytes.data(), s.bytes.size());
    img_lo = std::min<std::uint64_t>(img_lo, s.vaddr & ~0xfffull);
    img_hi = std::max<std::uint64_t>(img_hi, round_up(s.vaddr + s.memsz, 4096));
  }
  std::uint64_t img_gpa = img_lo - kKernelMapBase;
  std::uint64_t oea_gpa = round_up(ram->size / 2, 2ull << 20);
  if (oea_gpa + (cfg.oea_reserve_areas + 1ull) * cfg.oea_size > ram->size)
    return fail(Errc::InvalidArgument, "sim: the OEA and its reserve do not fit in the upper half of guest RAM");

  // Page tables: the image (4 KiB pages, text read-only), the OEA in the module area, and a
  // direct map of all RAM with 2 MiB pages.
  Domain* dp = d.get();
  PageTableBuilder pt({ram->base, ram->size}, kTablesGpa, kTablesLimit,
                      [dp](std::uint64_t gfn) { return dp->entry_frame(gfn); });
  d->root_gpa = pt.root_gpa();
  for (const auto& s : d->image.segments) {
    std::uint64_t va = s.vaddr & ~0xfffull;
    std::uint64_t len = round_up(s.vaddr + s.memsz, 4096) - va;
    std::uint64_t flags = PageTableBuilder::kGlobal | (s.writable ? PageTableBuilder::kWrite : 0) |
                          (s.executable ? 0 : PageTableBuilder::kNx);
    XP_TRY(pt.map_4k(va, va - kKernelMapBase, len, flags));
  }
  XP_TRY(pt.map_4k(kOeaVa, oea_gpa, cfg.oea_size, PageTableBuilder::kGlobal | PageTableBuilder::kWrite));
  XP_TRY(pt.map_2m(kPhysmapBase, 0, ram->size,
                   PageTableBuilder::kGlobal | PageTableBuilder::kWrite | PageTableBuilder::kNx));

  d->aliases.push_back({img_lo, img_gpa, img_hi - img_lo});
  d->aliases.push_back({kOeaVa, oea_gpa, cfg.oea_size});
  // Reserve areas, 16 MiB apart in the module area, mapped now and published on request.
  for (unsigned k = 1; k <= cfg.oea_reserve_areas; ++k) {
    std::uint64_t va = kOeaVa + k * (16ull << 20), gpa = oea_gpa + k * cfg.oea_size;
    XP_TRY(pt.map_4k(va, gpa, cfg.oea_size, PageTableBuilder::kGlobal | PageTableBuilder::kWrite));
    d->aliases.push_back({va, gpa, cfg.oea_size});
    d->oea_reserve.push_back(va);
  }
  // The guest module's control area (the guest channel), in RAM after the reserve areas.
  if (cfg.publish_module) {
    const std::uint64_t ctl_gpa = oea_gpa + (cfg.oea_reserve_areas + 1ull) * cfg.oea_size;
    XP_TRY(module_create_control(*d, pt, ctl_gpa));
    // Its fixup slots: in its text right after the OEA pool, past the largest control area.
    if (cfg.module_fixup_slots)
      XP_TRY(module_create_fixup_slots(*d, pt, kOeaVa + cfg.oea_size, ctl_gpa + XENPROBES_CTL_MAX_PAGES * 4096ull));
  }
  d->aliases.push_back({kPhysmapBase, 0, ram->size});

  auto sym = [&](const char* n, std::uint64_t dflt) {
    auto it = d->image.symbols.find(n);
    return it == d->image.symbols.end() ? dflt : it->second;
  };
  d->layout.text_start = sym("_text", img_lo);
  d->layout.text_end = sym("_etext", img_hi);
  d->layout.image_end = sym("_end", img_hi);
  d->layout.oea_addr = kOeaVa;
  d->layout.oea_size = cfg.oea_size;
  d->layout.physmap_base = kPhysmapBase;
  d->layout.fixup_slots = d->module.fixup_va;
  d->layout.fixup_table = d->module.fixup_table_va;
  d->layout.fixup_count = d->module.fixup_count;
  d->layout.entry = sym("demo_vcpu_entry", d->image.entry);

  // vCPUs.
  for (unsigned i = 0; i < cfg.vcpus; ++i) {
    auto v = std::make_unique<Vcpu>();
    v->id = i;
    XP_TRY(setup_engine(*d, *v));
    std::lock_guard emu(emulation_mutex());
    std::uint64_t rip = d->layout.entry, rdi = i, rsi = cfg.iterations, rfl = 0x2;
    uc_reg_write(v->uc, UC_X86_REG_RIP, &rip);
    uc_reg_write(v->uc, UC_X86_REG_RDI, &rdi);
    uc_reg_write(v->uc, UC_X86_REG_RSI, &rsi);
    uc_reg_write(v->uc, UC_X86_REG_EFLAGS, &rfl);
    d->vcpus.push_back(std::move(v));
  }
  if (cfg.start_paused) d->pause_count = 1;

  std::lock_guard lk(mu_);
  DomId id = d->id;
  std::string home = "/local/domain/" + std::to_string(id.value);
  store_[home + "/name"] = cfg.name;
  store_[home + "/domid"] = std::to_string(id.value);
  if (cfg.publish_module) {
    // What the guest module publishes (include/xenprobes/protocol.h), state last.
    std::string dir = home + "/" XENPROBES_XS_DIR "/";
    char hex[32];
    store_[dir + XENPROBES_XS_VERSION] = std::to_string(XENPROBES_PROTOCOL_VERSION);
    std::snprintf(hex, sizeof hex, "0x%" PRIx64, d->layout.text_start);
    store_[dir + XENPROBES_XS_KERNEL_TEXT] = hex;
    store_[dir + XENPROBES_XS_RELEASE] = "6.1.0-sim";
    store_[dir + XENPROBES_XS_NR_CPUS] = std::to_string(cfg.vcpus);
    store_[dir + XENPROBES_XS_OEA_COUNT] = "1";
    std::snprintf(hex, sizeof hex, "0x%" PRIx64, d->layout.oea_addr);
    store_[dir + "oea/0/addr"] = hex;
    store_[dir + "oea/0/size"] = std::to_string(cfg.oea_size);
    module_publish_locked(*d, dir);
    store_[dir + XENPROBES_XS_STATE] = XENPROBES_XS_STATE_READY;
  }
  Domain& ref = *d;
  domains_[id] = std::move(d);
  ref.thread = std::thread([this, &ref] { run_domain(ref); });
  fire_watches_locked("@introduceDomain", false);
  fire_watches_locked(home, false);
  return id;
}

Result<void> SimHostImpl::setup_engine(Domain& d, Vcpu& v) {
  std::lock_guard emu(emulation_mutex());
  uc_err e = uc_open(UC_ARCH_X86, UC_MODE_64, &v.uc);
  if (e != UC_ERR_OK) return fail(Errc::NoMemory, std::string("sim: uc_open: ") + uc_strerror(e));
#ifdef uc_ctl_tlb_mode
  // Unicorn 2.1 (Debian 13) walks the guest's page tables once CR3 is written; the sim maps
  // virtual addresses directly (the aliases below), as Unicorn 2.0 always did.
  e = uc_ctl_tlb_mode(v.uc, UC_TLB_VIRTUAL);
  if (e != UC_ERR_OK) return fail(Errc::NoMemory, std::string("sim: uc_ctl_tlb_mode: ") + uc_strerror(e));
#endif
  for (const Alias& a : d.aliases) {
    e = uc_mem_map_ptr(v.uc, a.va, a.len, UC_PROT_ALL, d.ram->base + a.gpa);
    if (e != UC_ERR_OK) return fail(Errc::NoMemory, std::string("sim: uc_mem_map_ptr: ") + uc_strerror(e));
  }
  uc_hook h;
  uc_hook_add(v.uc, &h, UC_HOOK_INTR, reinterpret_cast<void*>(&SimHostImpl::hook_intr), &v, 1, 0);
  uc_hook_add(v.uc, &h, UC_HOOK_BLOCK, reinterpret_cast<void*>(&SimHostImpl::hook_block), this, 1, 0);
  uc_hook_add(v.uc, &h, UC_HOOK_INSN, reinterpret_cast<void*>(&SimHostImpl::hook_out), &v, 1, 0,
              UC_X86_INS_OUT);
  if (!d.cfg.count_executions.empty()) {
    for (std::uint64_t va : d.cfg.count_executions) d.executions.try_emplace(va, 0);
    v.executions = &d.executions;
    uc_hook_add(v.uc, &h, UC_HOOK_CODE, reinterpret_cast<void*>(&SimHostImpl::hook_code), &v, 1, 0);
  }
  // Unicorn's CR3 only stores the value (paging stays off); keep it consistent anyway.
  std::uint64_t cr3 = d.root_gpa;
  uc_reg_write(v.uc, UC_X86_REG_CR3, &cr3);
  return {};
}

// ---------------------------------------------------------------------------------------
// Unicorn hooks (scheduler thread, host lock NOT held)

void SimHostImpl::hook_intr(uc_engine* uc, std::uint32_t intno, void* ud) {
  auto* v = static_cast<Vcpu*>(ud);
  v->exit_intno = static_cast<int>(intno);
  uc_emu_stop(uc);
}

void SimHostImpl::hook_block(uc_engine* uc, std::uint64_t, std::uint32_t, void* ud) {
  auto* self = static_cast<SimHostImpl*>(ud);
  // The running vCPU is found through the per-thread pointer the scheduler sets.
  Vcpu* v = t_current;
  if (!v) return;
  if (++v->blocks >= self->opts_.quantum_blocks || v->stop_requested.load(std::memory_order_relaxed)) {
    v->quantum_expired = true;
    uc_emu_stop(uc);
  }
}

void SimHostImpl::hook_code(uc_engine*, std::uint64_t addr, std::uint32_t, void* ud) {
  // Only the domain's scheduler thread runs its engines: no lock needed for the counter.
  // The hook fires again for the same instruction on each repetition of a rep string
  // instruction and when a quantum ends just before it: those are not new executions.
  auto* v = static_cast<Vcpu*>(ud);
  if (addr == v->last_code) return;
  v->last_code = addr;
  auto it = v->executions->find(addr);
  if (it != v->executions->end()) it->second++;
}

void SimHostImpl::hook_out(uc_engine*, std::uint32_t port, int, std::uint32_t value, void* ud) {
  auto* v = static_cast<Vcpu*>(ud);
  if (port == 0xe9) v->console.push_back(static_cast<char>(value & 0xff));
  if (port == 0xf4) v->done_port = true;
}


// ---------------------------------------------------------------------------------------
// Scheduler

bool SimHostImpl::runnable(const Domain& d, const Vcpu& v) const {
  if (d.dying || d.crashed || v.halted || v.vm_pause || v.sync_pause || v.ring_wait || v.module_wait) return false;
  return d.pause_count == 0 || v.grace;
}

void SimHostImpl::run_domain(Domain& d) {
  std::unique_lock lk(mu_);
  while (!d.dying) {
    module_poll_locked(d);
    if (d.clock_seen != clock_advances_) {  // advance_clock waits for this
      d.clock_seen = clock_advances_;
      cv_.notify_all();
    }
    Vcpu* next = nullptr;
    for (unsigned k = 0; k < d.vcpus.size(); ++k) {
      Vcpu& c = *d.vcpus[(d.rr_next + k) % d.vcpus.size()];
      if (runnable(d, c)) {
        next = &c;
        break;
      }
    }
    if (!next) {
      if (auto deadline = module_deadline_locked(d))  // a vCPU waits for Dom0, with a timeout
        clock_->wait_until(cv_, lk, *deadline);
      else
        cv_.wait(lk);
      continue;
    }
    d.rr_next = (next->id + 1) % d.vcpus.size();
    sync_code_writes(d);
    if (next->pending_emulate) {
      emulate_one(d, *next);
      continue;
    }
    next->grace = false;
    next->exit_intno = -1;
    next->quantum_expired = false;
    next->blocks = 0;
    d.running_vcpu = static_cast<int>(next->id);
    std::uint64_t rip;
    {
      std::lock_guard emu(emulation_mutex());
      uc_reg_read(next->uc, UC_X86_REG_RIP, &rip);
    }
    lk.unlock();
    t_current = next;
    uc_err err;
    {
      std::lock_guard emu(emulation_mutex());
      err = uc_emu_start(next->uc, rip, 0, 0, 0);
    }
    t_current = nullptr;
    lk.lock();
    d.running_vcpu = -1;
    next->stop_requested = false;
    handle_exit(d, *next, err);
    if (!next->console.empty()) {
      d.console += next->console;
      if (std::getenv("XENPROBES_SIM_CONSOLE")) std::fputs(next->console.c_str(), stderr);
      next->console.clear();
    }
    cv_.notify_all();
  }
}

void SimHostImpl::handle_exit(Domain& d, Vcpu& v, uc_err err) {
  std::lock_guard emu(emulation_mutex());
  std::uint64_t rip;
  uc_reg_read(v.uc, UC_X86_REG_RIP, &rip);
  char buf[160];
  if (err == UC_ERR_INSN_INVALID) {
    std::uint8_t b = 0;
    uc_mem_read(v.uc, rip, &b, 1);
    if (b == 0xf1) {  // ICEBP: a trap-class #DB, RIP after the instruction
      rip += 1;
      uc_reg_write(v.uc, UC_X86_REG_RIP, &rip);
      trap(d, v, TrapKind::Icebp, rip);
      return;
    }
    std::snprintf(buf, sizeof buf, "vcpu %u: invalid opcode (#UD) at 0x%" PRIx64, v.id, rip);
    return crash(d, buf);
  }
  if (err != UC_ERR_OK) {
    std::snprintf(buf, sizeof buf, "vcpu %u: %s at rip 0x%" PRIx64, v.id, uc_strerror(err), rip);
    return crash(d, buf);
  }
  if (v.exit_intno == 3) return trap(d, v, TrapKind::Int3, rip);
  if (v.exit_intno == 1) return trap(d, v, TrapKind::SingleStep, rip);
  if (v.exit_intno >= 0) {
    std::snprintf(buf, sizeof buf, "vcpu %u: exception %d at rip 0x%" PRIx64, v.id, v.exit_intno, rip);
    return crash(d, buf);
  }
  if (v.quantum_expired) return;
  std::uint8_t prev = 0;
  if (uc_mem_read(v.uc, rip - 1, &prev, 1) == UC_ERR_OK && prev == 0xf4) {
    v.halted = true;  // hlt: the vCPU blocks (a PV kernel's hlt becomes SCHEDOP_block)
    return;
  }
}

void SimHostImpl::crash(Domain& d, const std::string& why) {
  if (d.crashed) return;
  d.crashed = true;
  d.crash_reason = why;
  d.console += "sim: domain crashed: " + why + "\n";
  XP_LOG(Warn, "sim: domain %u crashed: %s", d.id.value, why.c_str());
  fire_watches_locked("@releaseDomain", false);
}

void SimHostImpl::trap(Domain& d, Vcpu& v, TrapKind kind, std::uint64_t rip) {
  char buf[160];
  // Every trap here is taken in guest kernel mode (the demo guest has no user mode).
  if (d.debugging) {
    if (!opts_.gdbsx) return;  // Xen 4.17 without CONFIG_GDBSX: swallowed, vCPU goes on at rip
    if (kind == TrapKind::SingleStep) v.dr6 |= 0x4000;  // DR6.BS
    if (kind == TrapKind::Int3) v.gdbsx_event = 3;
    bool was_running = d.pause_count == 0;
    d.pause_count++;  // domain_pause_by_systemcontroller_nosync
    if (was_running) {
      // nosync: the other vCPUs are only descheduled "soon" — let each run once more.
      for (auto& o : d.vcpus)
        if (o.get() != &v) o->grace = true;
    }
    if (kind != TrapKind::Int3 && v.gdbsx_event == 0) raise_virq_locked(kVirqDebugger);
    return;
  }
  if (d.cfg.type == GuestType::Hvm && d.monitor) {
    VmEventRequest req;
    req.vcpu = v.id;
    req.flags = kVmEventFlagVcpuPaused;
    if (kind == TrapKind::Int3 && d.mon_sw_bp) {
      req.reason = VmEventReason::SoftwareBreakpoint;
      req.type = 6;
      req.insn_length = 1;
      rip -= 1;  // Xen reports (and leaves) RIP at the int3 itself
    } else if (kind != TrapKind::Int3 && d.mon_debug) {
      req.reason = VmEventReason::DebugException;
      if (kind == TrapKind::Icebp) {
        req.type = 5;
        req.insn_length = 1;
        rip -= 1;  // observed on real Xen: RIP = the ICEBP address
      } else {
        req.type = 3;
        req.pending_dbg = 0x4000;
        v.dr6 |= 0x4000;
      }
    } else {
      goto inject;
    }
    uc_reg_write(v.uc, UC_X86_REG_RIP, &rip);
    req.regs = read_regs(d, v);
    req.gfn = guest_gfn_of_va(d, rip);
    v.vm_pause = 1;
    post_request_locked(d, v, req);
    return;
  }
inject:
  // Delivered to the guest. The guest module hooks int3 (the guest channel, sim_module.cpp):
  // its traps and those Dom0 already restored end there.
  if (kind == TrapKind::Int3 && module_int3_locked(d, v, rip)) return;
  // Otherwise the demo kernel has no IDT, so this is the oops a real kernel would take on an
  // int3/#DB it does not own.
  std::snprintf(buf, sizeof buf, "vcpu %u: unhandled %s at 0x%" PRIx64, v.id,
                kind == TrapKind::Int3 ? "#BP (int3)" : kind == TrapKind::Icebp ? "#DB (icebp)" : "#DB (single step)",
                kind == TrapKind::SingleStep ? rip : rip - 1);
  crash(d, buf);
}

std::uint64_t SimHostImpl::guest_gfn_of_va(const Domain& d, std::uint64_t va) const {
  for (const Alias& a : d.aliases)
    if (va >= a.va && va - a.va < a.len) return (a.gpa + (va - a.va)) >> 12;
  return ~0ull;
}

void SimHostImpl::post_request_locked(Domain& d, Vcpu& v, const VmEventRequest& req) {
  if (d.outstanding >= opts_.ring_slots) {
    v.ring_wait = true;
    v.waiting_req = req;
    d.ring_waiters.push_back(v.id);
    return;
  }
  d.outstanding++;
  d.requests.push_back(req);
  if (d.monitor_owner) d.monitor_owner->ring_signal();
}

void SimHostImpl::emulate_one(Domain& d, Vcpu& v) {
  // Xen's emulator runs one instruction at RIP from the supplied bytes instead of memory.
  // Here: put the bytes at RIP, single-step with TF in this engine only (no other vCPU runs:
  // this is the domain's only scheduler thread), then restore memory.
  v.pending_emulate = false;
  std::lock_guard emu(emulation_mutex());
  std::uint64_t rip, rfl;
  uc_reg_read(v.uc, UC_X86_REG_RIP, &rip);
  uc_reg_read(v.uc, UC_X86_REG_EFLAGS, &rfl);
  std::array<std::uint8_t, 16> saved{};
  if (uc_mem_read(v.uc, rip, saved.data(), saved.size()) != UC_ERR_OK ||
      uc_mem_write(v.uc, rip, v.emul.data(), v.emul.size()) != UC_ERR_OK) {
    crash(d, "vcpu " + std::to_string(v.id) + ": emulation failed (#UD injected)");
    return;
  }
  uc_ctl_remove_cache(v.uc, rip, rip + 16);
  std::uint64_t stepping = rfl | kTf;
  uc_reg_write(v.uc, UC_X86_REG_EFLAGS, &stepping);
  v.exit_intno = -1;
  v.quantum_expired = false;
  v.blocks = 0;
  t_current = &v;
  uc_err err;
  {
    std::lock_guard emu(emulation_mutex());
    err = uc_emu_start(v.uc, rip, 0, 0, 0);
  }
  t_current = nullptr;
  uc_mem_write(v.uc, rip, saved.data(), saved.size());
  uc_ctl_remove_cache(v.uc, rip, rip + 16);
  uc_reg_read(v.uc, UC_X86_REG_EFLAGS, &stepping);
  stepping = (stepping & ~kTf) | (rfl & kTf);
  uc_reg_write(v.uc, UC_X86_REG_EFLAGS, &stepping);
  if (err != UC_ERR_OK || v.exit_intno != 1) {
    std::uint64_t now;
    uc_reg_read(v.uc, UC_X86_REG_RIP, &now);
    char buf[160];
    std::snprintf(buf, sizeof buf, "vcpu %u: emulation of the instruction at 0x%" PRIx64 " failed (#UD injected)",
                  v.id, rip);
    crash(d, buf);
  }
}

void SimHostImpl::sync_code_writes(Domain& d) {
  std::lock_guard emu(emulation_mutex());
  for (auto it = d.wframes.begin(); it != d.wframes.end();) {
    std::uint8_t* page = d.ram->base + it->first * 4096;
    if (std::memcmp(page, it->second.shadow.data(), 4096) != 0) {
      std::uint64_t gpa = it->first * 4096;
      for (const Alias& a : d.aliases) {
        if (gpa < a.gpa || gpa - a.gpa >= a.len) continue;
        std::uint64_t va = a.va + (gpa - a.gpa);
        for (auto& v : d.vcpus) uc_ctl_remove_cache(v->uc, va, va + 4096);
      }
      std::memcpy(it->second.shadow.data(), page, 4096);
    }
    if (it->second.refs == 0)
      it = d.wframes.erase(it);
    else
      ++it;
  }
}

// Waits (mu_ held through lk) until vCPU v is not executing, keeping it from being scheduled.
void SimHostImpl::stop_vcpu_locked(std::unique_lock<std::mutex>& lk, Domain& d, Vcpu& v) {
  v.sync_pause++;
  while (d.running_vcpu == static_cast<int>(v.id)) {
    // Only the vCPU's own thread stops its engine, at the next block (hook_block). Calling
    // uc_emu_stop from this thread while the engine runs corrupted guest state in Unicorn
    // 2.0.1: under a storm of domain pauses with no probe at all, the demo guest's
    // checksums went wrong and a `ret` landed on a smashed stack (the sim pause-storm test).
    v.stop_requested = true;
    cv_.wait_for(lk, std::chrono::milliseconds(1));
  }
}

void SimHostImpl::resume_vcpu_locked(Vcpu& v) {
  v.sync_pause--;
  cv_.notify_all();
}

VcpuRegs SimHostImpl::read_regs(const Domain& d, const Vcpu& v) const {
  static const int ids[] = {UC_X86_REG_RAX, UC_X86_REG_RBX, UC_X86_REG_RCX, UC_X86_REG_RDX,
                            UC_X86_REG_RSI, UC_X86_REG_RDI, UC_X86_REG_RBP, UC_X86_REG_RSP,
                            UC_X86_REG_R8,  UC_X86_REG_R9,  UC_X86_REG_R10, UC_X86_REG_R11,
                            UC_X86_REG_R12, UC_X86_REG_R13, UC_X86_REG_R14, UC_X86_REG_R15,
                            UC_X86_REG_RIP, UC_X86_REG_EFLAGS};
  VcpuRegs r;
  std::uint64_t* dst[] = {&r.rax, &r.rbx, &r.rcx, &r.rdx, &r.rsi, &r.rdi, &r.rbp, &r.rsp, &r.r8,
                          &r.r9,  &r.r10, &r.r11, &r.r12, &r.r13, &r.r14, &r.r15, &r.rip, &r.rflags};
  void* ptrs[18];
  for (int i = 0; i < 18; ++i) ptrs[i] = dst[i];
  {
    std::lock_guard emu(emulation_mutex());
    uc_reg_read_batch(v.uc, const_cast<int*>(ids), ptrs, 18);
  }
  r.cr0 = v.cr0;
  r.cr2 = v.cr2;
  r.cr3 = (d.root_gpa >> 12) + d.mfn_base;
  r.cr3 <<= 12;
  if (v.pti_user_half) r.cr3 |= 0x1000;
  r.cr4 = v.cr4;
  r.efer = v.efer;
  r.dr6 = v.dr6;
  r.dr7 = v.dr7;
  r.cs = d.cfg.type == GuestType::Pv ? 0xe033 : 0x10;  // FLAT_KERNEL_CS64 / __KERNEL_CS
  r.ss = d.cfg.type == GuestType::Pv ? 0xe02b : 0x18;
  r.kernel_mode = true;
  return r;
}

void SimHostImpl::write_regs(Vcpu& v, const VcpuRegs& r, bool debugregs) {
  static const int ids[] = {UC_X86_REG_RAX, UC_X86_REG_RBX, UC_X86_REG_RCX, UC_X86_REG_RDX,
                            UC_X86_REG_RSI, UC_X86_REG_RDI, UC_X86_REG_RBP, UC_X86_REG_RSP,
                            UC_X86_REG_R8,  UC_X86_REG_R9,  UC_X86_REG_R10, UC_X86_REG_R11,
                            UC_X86_REG_R12, UC_X86_REG_R13, UC_X86_REG_R14, UC_X86_REG_R15,
                            UC_X86_REG_RIP, UC_X86_REG_EFLAGS};
  const std::uint64_t* src[] = {&r.rax, &r.rbx, &r.rcx, &r.rdx, &r.rsi, &r.rdi, &r.rbp, &r.rsp, &r.r8,
                                &r.r9,  &r.r10, &r.r11, &r.r12, &r.r13, &r.r14, &r.r15, &r.rip, &r.rflags};
  void* ptrs[18];
  for (int i = 0; i < 18; ++i) ptrs[i] = const_cast<std::uint64_t*>(src[i]);
  {
    std::lock_guard emu(emulation_mutex());
    uc_reg_write_batch(v.uc, const_cast<int*>(ids), ptrs, 18);
  }
  if (debugregs) {
    v.dr6 = r.dr6;
    v.dr7 = r.dr7;
  }
}

void SimHostImpl::raise_virq_locked(unsigned virq) {
  if (virq < kNrVirqs && virq_binder_[virq]) virq_binder_[virq]->raise_port(virq_port_[virq]);
}

// ---------------------------------------------------------------------------------------
// Public host API

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
    if (it->first == home || it->first.starts_with(home + "/"))
      it = store_.erase(it);
    else
      ++it;
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
    bool all = std::all_of(it->second->vcpus.begin(), it->second->vcpus.end(),
                           [](const auto& v) { return v->halted; });
    if (all) return true;
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= deadline)
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
  if (changed.starts_with(watch) && changed.size() > watch.size() && changed[watch.size()] == '/')
    return true;
  // Removing a node also removes (and so fires watches on) everything below it.
  return removal && watch.starts_with(changed) && watch.size() > changed.size() &&
         watch[changed.size()] == '/';
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

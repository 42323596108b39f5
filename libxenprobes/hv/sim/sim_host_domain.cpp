// The simulated host's domain creation: guest RAM, the kernel image, the page tables, the OEA
// and its reserve, the guest module's areas, the vCPUs' Unicorn engines, and what the guest
// publishes in xenstore (sim_host.cpp says where the rest of the host is).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <random>

#include "hv/sim/page_table_builder.hpp"
#include "hv/sim/sim_host_impl.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::hv::sim {

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

namespace {

constexpr std::uint64_t kKernelMapBase = 0xffffffff80000000ull;  // Linux __START_KERNEL_map
constexpr std::uint64_t kPhysmapBase = 0xffff888000000000ull;    // Linux direct map
constexpr std::uint64_t kOeaVa = 0xffffffffa0000000ull;          // Linux module area
constexpr std::uint64_t kRingsVa = 0xffffc90001000000ull;        // Linux vmalloc area
constexpr std::uint64_t kTablesGpa = 0x100000, kTablesLimit = 0x400000;

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace

// ---------------------------------------------------------------------------------------
// Domain creation

Result<DomId> SimHostImpl::create_domain(const DomainConfig& cfg_in) {
  DomainConfig cfg = cfg_in;
  if (cfg.vcpus == 0 || cfg.vcpus > 64) return fail(Errc::InvalidArgument, "sim: vcpus must be 1..64");
  if (cfg.ram_mb < 32 || cfg.ram_mb > 4096) return fail(Errc::InvalidArgument, "sim: ram_mb must be 32..4096");
  if (cfg.oea_size == 0 || cfg.oea_size % 4096 || cfg.oea_size > (8u << 20))
    return fail(Errc::InvalidArgument, "sim: oea_size must be a multiple of 4096, at most 8 MiB");
  if (cfg.image.empty()) cfg.image = default_guest_dir() + "/vmlinux";
  elf::Image img = XP_TRY(elf::load(cfg.image));

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
    std::uint64_t va = kOeaVa + k * kOeaStride, gpa = oea_gpa + k * cfg.oea_size;
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
    // Its jump entry: the page after the fixup slots' two.
    if (cfg.module_jump_entry)
      XP_TRY(module_create_jump_entry(*d, pt, kOeaVa + cfg.oea_size + 2 * 4096ull,
                                      ctl_gpa + (XENPROBES_CTL_MAX_PAGES + 2) * 4096ull));
    // Its async rings: in the vmalloc area, in RAM after the jump entry's page.
    if (cfg.module_jump_entry && cfg.module_ring_order)
      XP_TRY(module_create_rings(*d, pt, kRingsVa, ctl_gpa + (XENPROBES_CTL_MAX_PAGES + 3) * 4096ull));
  }
  d->aliases.push_back({kPhysmapBase, 0, ram->size});

  auto sym = [&](const char* n, std::uint64_t dflt) {
    auto it = d->image.symbols.find(n);
    return it == d->image.symbols.end() ? dflt : it->second;
  };
  if (cfg.user_image_va) {
    // The image again, from _text's page, as a user process's read-only mapping of it.
    const std::uint64_t from = sym("_text", img_lo) & ~0xfffull;
    if (cfg.user_image_va % 4096 || cfg.user_image_va >= (1ull << 47) - (img_hi - from) || from < img_lo)
      return fail(Errc::InvalidArgument, "sim: user_image_va must be page aligned, and the image must fit below 2^47");
    XP_TRY(pt.map_4k(cfg.user_image_va, from - kKernelMapBase, img_hi - from,
                     PageTableBuilder::kUser | PageTableBuilder::kNx));
    d->aliases.push_back({cfg.user_image_va, from - kKernelMapBase, img_hi - from});
    d->layout.user_image = cfg.user_image_va;
  }
  d->layout.text_start = sym("_text", img_lo);
  d->layout.text_end = sym("_etext", img_hi);
  d->layout.image_end = sym("_end", img_hi);
  d->layout.oea_addr = kOeaVa;
  d->layout.oea_size = cfg.oea_size;
  d->layout.physmap_base = kPhysmapBase;
  d->layout.fixup_slots = d->module.fixup_va;
  d->layout.jump_entry = d->module.jump_entry;
  if (!d->module.rings.empty()) {
    d->layout.rings = d->module.rings_va;
    d->layout.ring_stride = XENPROBES_RING_DATA_OFFSET + (std::uint64_t{1} << d->module.ring_order);
  }
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
  uc_hook_add(v.uc, &h, UC_HOOK_INSN, reinterpret_cast<void*>(&SimHostImpl::hook_out), &v, 1, 0, UC_X86_INS_OUT);
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

}  // namespace xenprobes::hv::sim

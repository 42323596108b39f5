#include "guardian/journal.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "xenprobes/protocol.h"

namespace xenprobes::guardian {

// Pauses one process can hold on a domain at once, by the journal's count: a handful in
// practice (the engine's, the vm_event channel's during detach, a release that failed).
constexpr std::uint32_t kMaxHeldPauses = 255;
namespace {

// A record's sequence word: odd while its writer changes it. Release on the way out so the
// fields are in memory before the word says they are; the reader (another process, after
// the writer died) loads it with acquire.
template <typename Rec>
void begin_update(Rec* r) {
  __atomic_store_n(&r->seq, r->seq + 1, __ATOMIC_RELEASE);  // odd
  __atomic_thread_fence(__ATOMIC_RELEASE);
}
template <typename Rec>
void end_update(Rec* r) {
  __atomic_store_n(&r->seq, r->seq + 1, __ATOMIC_RELEASE);  // even
}

void store32(std::uint32_t* p, std::uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

constexpr int kJournalSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

Result<std::unique_ptr<Journal>> Journal::create(JournalLimits lim) {
  if (lim.domains == 0 || lim.patches == 0 || lim.returns == 0 || lim.domains > kJournalMaxRecords ||
      lim.patches > kJournalMaxRecords || lim.returns > kJournalMaxRecords)
    return fail(Errc::InvalidArgument, "journal: table sizes must be 1.." + std::to_string(kJournalMaxRecords));
  const std::uint64_t doff = align_up(sizeof(JournalHeader), 64);
  const std::uint64_t poff = align_up(doff + std::uint64_t{lim.domains} * sizeof(JournalDomainRec), 64);
  const std::uint64_t roff = align_up(poff + std::uint64_t{lim.patches} * sizeof(JournalPatchRec), 64);
  const std::uint64_t total = align_up(roff + std::uint64_t{lim.returns} * sizeof(JournalReturnRec), 4096);
  int fd = ::memfd_create("xenprobes-journal", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return fail_errno(errno, "memfd_create for the guardian's journal");
  if (::ftruncate(fd, static_cast<off_t>(total)) < 0) {
    int e = errno;
    ::close(fd);
    return fail_errno(e, "ftruncate of the guardian's journal");
  }
  // Its size never changes: the guardian may trust fstat (and refuses a journal without
  // these seals, check_journal_fd).
  if (::fcntl(fd, F_ADD_SEALS, kJournalSeals) < 0) {
    int e = errno;
    ::close(fd);
    return fail_errno(e, "sealing the guardian's journal");
  }
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int e = errno;
    ::close(fd);
    return fail_errno(e, "mmap of the guardian's journal");
  }
  std::unique_ptr<Journal> j(new Journal(fd, base, total));
  JournalHeader& h = j->header();  // the file is zero-filled: every record unused, seq 0
  h.version = kJournalVersion;
  h.header_size = sizeof(JournalHeader);
  h.owner_pid = static_cast<std::uint32_t>(::getpid());
  h.max_domains = lim.domains;
  h.max_patches = lim.patches;
  h.max_returns = lim.returns;
  h.domain_size = sizeof(JournalDomainRec);
  h.patch_size = sizeof(JournalPatchRec);
  h.return_size = sizeof(JournalReturnRec);
  h.domains_off = doff;
  h.patches_off = poff;
  h.returns_off = roff;
  h.total_size = total;
  __atomic_store_n(&h.magic, kJournalMagic, __ATOMIC_RELEASE);  // last: the header is complete
  j->free_domains_.reserve(lim.domains);
  j->free_patches_.reserve(lim.patches);
  j->free_returns_.reserve(lim.returns);
  for (std::uint32_t i = lim.domains; i-- > 0;) j->free_domains_.push_back(i);
  for (std::uint32_t i = lim.patches; i-- > 0;) j->free_patches_.push_back(i);
  for (std::uint32_t i = lim.returns; i-- > 0;) j->free_returns_.push_back(i);
  return j;
}

Journal::~Journal() {
  if (base_) ::munmap(base_, size_);
  if (fd_ >= 0) ::close(fd_);
}

JournalDomainRec* Journal::dom_rec(std::uint32_t i) const {
  return reinterpret_cast<JournalDomainRec*>(static_cast<std::byte*>(base_) + header().domains_off) + i;
}
JournalPatchRec* Journal::patch_rec(std::uint32_t i) const {
  return reinterpret_cast<JournalPatchRec*>(static_cast<std::byte*>(base_) + header().patches_off) + i;
}
JournalReturnRec* Journal::ret_rec(std::uint32_t i) const {
  return reinterpret_cast<JournalReturnRec*>(static_cast<std::byte*>(base_) + header().returns_off) + i;
}

void Journal::set_clean(bool clean) { store32(&header().clean, clean ? 1 : 0); }

bool Journal::empty() const {
  return domains_.empty() && patches_.empty() && free_returns_.size() == header().max_returns;
}

void Journal::refuse() { store32(&header().refused, header().refused + 1); }

std::uint32_t Journal::domain_index(DomId d) const {
  auto it = domains_.find(d.value);
  return it == domains_.end() ? ~0u : it->second;
}

Result<void> Journal::add_domain(DomId d, const hv::DomainHandle& handle, JournalChannel ch, std::uint8_t trap_byte,
                                 JournalMonitor mon, unsigned vcpus) {
  std::uint32_t i = domain_index(d);
  if (i == ~0u) {
    if (free_domains_.empty()) {
      refuse();
      return fail(Errc::NoSpace, "the guardian's journal has no room for another domain (" +
                                     std::to_string(header().max_domains) + ")");
    }
    i = free_domains_.back();
    free_domains_.pop_back();
    domains_[d.value] = i;
  }
  JournalDomainRec* r = dom_rec(i);
  begin_update(r);
  r->domid = d.value;
  std::memcpy(r->handle, handle.data(), sizeof r->handle);
  r->channel = static_cast<std::uint8_t>(ch);
  r->trap_byte = trap_byte;
  r->monitor = static_cast<std::uint8_t>(mon);
  r->vcpus = vcpus;
  r->held_pauses = 0;
  r->owed_unpauses = 0;
  r->used = 1;
  end_update(r);
  return {};
}

void Journal::remove_domain(DomId d) {
  std::uint32_t i = domain_index(d);
  if (i == ~0u) return;
  // Its patches and returns first: a record without its domain would be ignored anyway, but
  // the domain record says which channel to turn off and must outlive them.
  for (auto it = patches_.begin(); it != patches_.end();) {
    if (it->first.first == d.value) {
      JournalPatchRec* r = patch_rec(it->second);
      begin_update(r);
      r->used = 0;
      end_update(r);
      free_patches_.push_back(it->second);
      it = patches_.erase(it);
    } else {
      ++it;
    }
  }
  for (std::uint32_t k = 0; k < header().max_returns; ++k) {
    JournalReturnRec* r = ret_rec(k);
    if (r->used && r->domid == d.value) remove_return(k);
  }
  JournalDomainRec* r = dom_rec(i);
  begin_update(r);
  r->used = 0;
  end_update(r);
  free_domains_.push_back(i);
  domains_.erase(d.value);
}

void Journal::add_held_pause(DomId d) {
  if (std::uint32_t i = domain_index(d); i != ~0u) {
    const std::uint32_t n = dom_rec(i)->held_pauses;
    if (n < kMaxHeldPauses) store32(&dom_rec(i)->held_pauses, n + 1);
  }
}

void Journal::drop_held_pause(DomId d) {
  if (std::uint32_t i = domain_index(d); i != ~0u) {
    const std::uint32_t n = dom_rec(i)->held_pauses;
    if (n > 0) store32(&dom_rec(i)->held_pauses, n - 1);
  }
}

void Journal::set_owed_unpauses(DomId d, unsigned owed) {
  if (std::uint32_t i = domain_index(d); i != ~0u) store32(&dom_rec(i)->owed_unpauses, owed);
}

std::uint32_t module_hash(std::string_view name, std::uint64_t text_base) {
  return xenprobes_module_id(name.data(), name.size(), text_base);
}

bool module_reference_ok(const JournalModule& m) {
  const std::uint64_t address = m.address.value;
  if (address < 0xffff800000000000ull || address > ~std::uint64_t{0} - 0x10000) return false;
  const unsigned name_end = m.name_off + unsigned{kJournalModuleNameMax}, base_end = m.base_off + 8u;
  return name_end <= 0x10000 && base_end <= 0x10000 && (base_end <= m.name_off || name_end <= m.base_off);
}

Result<void> Journal::add_patch(DomId d, PatchKind kind, Gva gva, std::span<const std::uint8_t> written,
                                std::span<const std::uint8_t> restore, Gva resume,
                                const std::optional<JournalModule>& module) {
  if (written.empty() || written.size() > 8 || written.size() != restore.size())
    return fail(Errc::InvalidArgument, "journal: a patch is 1..8 bytes, written and restored alike");
  if (module && (kind != PatchKind::Text || !module_reference_ok(*module)))
    return fail(Errc::InvalidArgument,
                "journal: a module reference belongs to a text patch and names a struct "
                "module in the kernel's half with its name and base inside it");
  if (domain_index(d) == ~0u)
    return fail(Errc::InvalidArgument, "journal: domain " + std::to_string(d.value) + " is not journaled");
  auto key = std::make_pair(d.value, gva.value);
  std::uint32_t i;
  if (auto it = patches_.find(key); it != patches_.end()) {
    i = it->second;
  } else {
    if (free_patches_.empty()) {
      refuse();
      return fail(Errc::NoSpace, "the guardian's journal is full (" + std::to_string(header().max_patches) +
                                     " patches): refusing a patch it could not undo");
    }
    i = free_patches_.back();
    free_patches_.pop_back();
    patches_[key] = i;
  }
  JournalPatchRec* r = patch_rec(i);
  begin_update(r);
  r->domid = d.value;
  r->kind = static_cast<std::uint8_t>(kind);
  r->len = static_cast<std::uint8_t>(written.size());
  r->gva = gva.value;
  r->resume = resume.value;
  std::memset(r->written, 0, sizeof r->written);
  std::memset(r->restore, 0, sizeof r->restore);
  std::memcpy(r->written, written.data(), written.size());
  std::memcpy(r->restore, restore.data(), restore.size());
  r->module = module ? module->address.value : 0;
  r->module_hash = module ? module->hash : 0;
  r->module_name_off = module ? module->name_off : 0;
  r->module_base_off = module ? module->base_off : 0;
  r->used = 1;
  end_update(r);
  return {};
}

void Journal::remove_patch(DomId d, Gva gva) {
  auto it = patches_.find({d.value, gva.value});
  if (it == patches_.end()) return;
  JournalPatchRec* r = patch_rec(it->second);
  begin_update(r);
  r->used = 0;
  end_update(r);
  free_patches_.push_back(it->second);
  patches_.erase(it);
}

Result<std::uint32_t> Journal::add_return(DomId d, Gva slot, std::uint64_t ret, Gva trampoline) {
  if (free_returns_.empty()) {
    refuse();
    return fail(Errc::NoSpace, "the guardian's journal has no room for another return-probe instance");
  }
  std::uint32_t i = free_returns_.back();
  free_returns_.pop_back();
  JournalReturnRec* r = ret_rec(i);
  begin_update(r);
  r->domid = d.value;
  r->slot = slot.value;
  r->ret = ret;
  r->trampoline = trampoline.value;
  r->used = 1;
  end_update(r);
  return i;
}

void Journal::remove_return(std::uint32_t i) {
  if (i >= header().max_returns) return;
  JournalReturnRec* r = ret_rec(i);
  if (!r->used) return;
  begin_update(r);
  r->used = 0;
  end_update(r);
  free_returns_.push_back(i);  // capacity reserved at creation: no allocation
}

// ---- reader ---------------------------------------------------------------------------

namespace {

template <typename Rec>
bool table_ok(const JournalHeader& h, std::uint64_t off, std::uint32_t count, std::uint32_t rec_size,
              std::size_t file) {
  if (rec_size != sizeof(Rec) || count > kJournalMaxRecords || off % 8 != 0) return false;
  if (off < sizeof(JournalHeader) || off > h.total_size) return false;
  std::uint64_t bytes = std::uint64_t{count} * rec_size;  // < 2^20 * 64: no overflow
  return bytes <= h.total_size - off && h.total_size <= file;
}

bool overlap(std::uint64_t a, std::uint64_t alen, std::uint64_t b, std::uint64_t blen) {
  return a < b + blen && b < a + alen;
}

// One consistent copy of a record: nullopt when its writer was cut off in the middle.
template <typename Rec>
bool copy_record(const std::byte* at, Rec& out) {
  std::memcpy(&out, at, sizeof out);
  return out.seq % 2 == 0;
}

}  // namespace

Result<JournalSnapshot> read_journal(std::span<const std::byte> mem) {
  if (mem.size() < sizeof(JournalHeader))
    return fail(Errc::Io, "journal: " + std::to_string(mem.size()) + " bytes, shorter than its header");
  JournalHeader h;
  std::memcpy(&h, mem.data(), sizeof h);
  if (h.magic != kJournalMagic) return fail(Errc::Io, "journal: bad magic (not a xenprobes journal)");
  if (h.version != kJournalVersion)
    return fail(Errc::Io, "journal: version " + std::to_string(h.version) + ", this guardian reads version " +
                              std::to_string(kJournalVersion));
  if (h.header_size != sizeof(JournalHeader)) return fail(Errc::Io, "journal: bad header size");
  if (h.total_size > mem.size()) return fail(Errc::Io, "journal: claims more bytes than the file holds");
  if (!table_ok<JournalDomainRec>(h, h.domains_off, h.max_domains, h.domain_size, mem.size()) ||
      !table_ok<JournalPatchRec>(h, h.patches_off, h.max_patches, h.patch_size, mem.size()) ||
      !table_ok<JournalReturnRec>(h, h.returns_off, h.max_returns, h.return_size, mem.size()))
    return fail(Errc::Io, "journal: a table's size or place is out of range");
  const std::uint64_t dl = std::uint64_t{h.max_domains} * sizeof(JournalDomainRec);
  const std::uint64_t pl = std::uint64_t{h.max_patches} * sizeof(JournalPatchRec);
  const std::uint64_t rl = std::uint64_t{h.max_returns} * sizeof(JournalReturnRec);
  if (overlap(h.domains_off, dl, h.patches_off, pl) || overlap(h.domains_off, dl, h.returns_off, rl) ||
      overlap(h.patches_off, pl, h.returns_off, rl))
    return fail(Errc::Io, "journal: its tables overlap");

  JournalSnapshot s;
  s.owner_pid = h.owner_pid;
  s.clean = h.clean == 1;
  s.refused = h.refused;
  const std::byte* base = mem.data();
  std::map<std::uint32_t, std::size_t> by_dom;
  for (std::uint32_t i = 0; i < h.max_domains; ++i) {
    JournalDomainRec r;
    if (!copy_record(base + h.domains_off + std::uint64_t{i} * sizeof r, r)) {
      s.torn++;
      continue;
    }
    if (r.used == 0) continue;
    bool ok =
        r.used == 1 &&
        (r.channel == std::uint8_t(JournalChannel::Debugger) || r.channel == std::uint8_t(JournalChannel::VmEvent)) &&
        r.monitor <= std::uint8_t(JournalMonitor::SoftwareBreakpoints) && r.vcpus >= 1 && r.vcpus <= 4096 &&
        r.domid != 0 && r.domid < 0x7ff0 && r.held_pauses <= kMaxHeldPauses && r.owed_unpauses <= 255 &&
        !by_dom.contains(r.domid);
    if (!ok) {
      s.invalid++;
      continue;
    }
    by_dom[r.domid] = s.domains.size();
    JournalSnapshot::Domain d{
        DomId{r.domid}, {}, JournalChannel(r.channel), r.trap_byte, JournalMonitor(r.monitor), r.vcpus, r.held_pauses,
        r.owed_unpauses};
    std::memcpy(d.handle.data(), r.handle, d.handle.size());
    s.domains.push_back(d);
  }
  for (std::uint32_t i = 0; i < h.max_patches; ++i) {
    JournalPatchRec r;
    if (!copy_record(base + h.patches_off + std::uint64_t{i} * sizeof r, r)) {
      s.torn++;
      continue;
    }
    if (r.used == 0) continue;
    bool ok = r.used == 1 && r.kind >= std::uint8_t(PatchKind::Text) && r.kind <= std::uint8_t(PatchKind::Trampoline) &&
              r.len >= 1 && r.len <= 8 && by_dom.contains(r.domid) && r.gva <= ~std::uint64_t{0} - 8;
    // A module reference must be usable; one on another kind of patch, or junk in the words
    // older writers left zero, makes the record impossible (nothing is done for it).
    if (r.module != 0)
      ok = ok && r.kind == std::uint8_t(PatchKind::Text) &&
           module_reference_ok(JournalModule{Gva{r.module}, r.module_hash, r.module_name_off, r.module_base_off});
    else ok = ok && r.module_hash == 0 && r.module_name_off == 0 && r.module_base_off == 0;
    if (!ok) {
      s.invalid++;
      continue;
    }
    JournalSnapshot::Patch p{DomId{r.domid},
                             PatchKind(r.kind),
                             Gva{r.gva},
                             Gva{r.resume},
                             std::vector<std::uint8_t>(r.written, r.written + r.len),
                             std::vector<std::uint8_t>(r.restore, r.restore + r.len)};
    if (r.module) p.module = JournalModule{Gva{r.module}, r.module_hash, r.module_name_off, r.module_base_off};
    s.patches.push_back(std::move(p));
  }
  for (std::uint32_t i = 0; i < h.max_returns; ++i) {
    JournalReturnRec r;
    if (!copy_record(base + h.returns_off + std::uint64_t{i} * sizeof r, r)) {
      s.torn++;
      continue;
    }
    if (r.used == 0) continue;
    bool ok = r.used == 1 && by_dom.contains(r.domid) && r.slot % 8 == 0 && r.ret != r.trampoline;
    if (!ok) {
      s.invalid++;
      continue;
    }
    s.returns.push_back({DomId{r.domid}, Gva{r.slot}, r.ret, Gva{r.trampoline}});
  }
  return s;
}

Result<void> check_journal_fd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) < 0) return fail_errno(errno, "fstat of the journal");
  if (!S_ISREG(st.st_mode)) return fail(Errc::InvalidArgument, "the journal is not a memfd (not even a regular file)");
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return fail(Errc::InvalidArgument,
                "the journal is not a memfd (it takes no seals: " + std::string(std::strerror(errno)) + ")");
  if ((seals & kJournalSeals) != kJournalSeals)
    return fail(Errc::InvalidArgument,
                "the journal is not sealed against resizing (F_SEAL_SHRINK, F_SEAL_GROW, "
                "F_SEAL_SEAL): its size cannot be trusted");
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) == O_WRONLY) return fail(Errc::InvalidArgument, "the journal is not open for reading");
  return {};
}

Result<JournalSnapshot> read_journal_fd(int fd) {
  XP_TRY(check_journal_fd(fd));
  struct stat st {};
  if (::fstat(fd, &st) < 0) return fail_errno(errno, "fstat of the journal");
  if (st.st_size < static_cast<off_t>(sizeof(JournalHeader)) || st.st_size > (off_t{1} << 30))
    return fail(Errc::Io, "journal: implausible size " + std::to_string(st.st_size));
  std::size_t size = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail_errno(errno, "mmap of the journal");
  auto r = read_journal({static_cast<const std::byte*>(p), size});
  ::munmap(p, size);
  return r;
}

}  // namespace xenprobes::guardian

// Fuzz target: the guardian's journal (guardian/journal.cpp) and the recovery that acts on it
// (guardian/recovery.cpp). The guardian reads a file a process that died wrote: it may be torn,
// stale or corrupt, and recovery writes guest memory on its word.
//
// Input, first byte even: the reader. 64 bytes of environment (which journaled domains exist,
// their vCPUs' rip/rsp, what guest memory holds at each patch and return slot, pauses held),
// then the journal image. read_journal() must refuse it or give a snapshot whose every record
// obeys the rules; recover() then runs over a fake hypervisor with real page tables, and must
// write guest memory only at journaled patches (turning exactly their `written` bytes into
// `restore`) and journaled return slots (trampoline -> ret), move a vCPU only to where the
// journal says it would have gone, and never release a pause the domain does not hold; a
// domain whose handle is not the journaled one (its domid reused) is not touched at all.
//
// First byte odd: the writer. A sequence of Journal operations against a model; after each
// one the reader must read back exactly the model (torn records, when the input tears one,
// ignored and counted).
#include "fuzz/fuzz_common.hpp"
#include "guardian/journal.hpp"
#include "guardian/recovery.hpp"

using namespace xenprobes;
using namespace xenprobes::guardian;
using fuzz::Input;

namespace {

constexpr std::uint64_t kText = 0xffffffff81000000ull, kTextPages = 4;
constexpr std::uint64_t kStack = 0xffffc90000010000ull;
constexpr std::uint64_t kOea = 0xffffffffa0000000ull;
constexpr unsigned kMaxDoms = 4;  // journaled domains given a guest; the others are gone

// Domain k's frames: its page tables at 0x100 + 0x10k, its text, stack and OEA at
// 0x1000 + 0x10k (4 pages), +4, +5.
constexpr std::uint64_t tables_of(unsigned k) { return 0x100 + 0x10 * k; }
constexpr std::uint64_t text_of(unsigned k) { return 0x1000 + 0x10 * k; }

// The physical address of a journaled gva in domain k's guest, or nullopt.
std::optional<std::uint64_t> phys(unsigned k, std::uint64_t va) {
  if (va - kText < kTextPages * kPageSize) return (text_of(k) << 12) + (va - kText);
  if (va - kStack < kPageSize) return ((text_of(k) + 4) << 12) + (va - kStack);
  if (va - kOea < kPageSize) return ((text_of(k) + 5) << 12) + (va - kOea);
  return std::nullopt;
}

void check_snapshot(const JournalSnapshot& s) {
  std::set<std::uint32_t> doms;
  for (const auto& d : s.domains) {
    FUZZ_CHECK(doms.insert(d.domid.value).second, "a domain twice");
    FUZZ_CHECK(d.domid.value != 0 && d.domid.value < 0x7ff0 && d.vcpus >= 1 && d.vcpus <= 4096);
    FUZZ_CHECK(d.channel == JournalChannel::Debugger || d.channel == JournalChannel::VmEvent);
    FUZZ_CHECK(d.held_pauses <= 255 && d.owed_unpauses <= 255);
  }
  for (const auto& p : s.patches) {
    FUZZ_CHECK(doms.contains(p.domid.value), "a patch of a domain not journaled");
    FUZZ_CHECK(p.written.size() >= 1 && p.written.size() <= 8 && p.written.size() == p.restore.size());
    FUZZ_CHECK(p.kind == PatchKind::Text || p.kind == PatchKind::SlotTrap || p.kind == PatchKind::Trampoline);
    if (p.module)
      FUZZ_CHECK(p.kind == PatchKind::Text && p.module->address.value >= 0xffff800000000000ull &&
                     p.module->name_off + kJournalModuleNameMax <= 0x10000 && p.module->base_off + 8u <= 0x10000,
                 "a module reference the guardian cannot use");
  }
  for (const auto& r : s.returns) {
    FUZZ_CHECK(doms.contains(r.domid.value), "a return of a domain not journaled");
    FUZZ_CHECK(r.slot.value % 8 == 0 && r.ret != r.trampoline.value);
  }
}

void reader(Input& in) {
  auto env = in.bytes(64);
  Input e(env);
  const auto img_span = in.rest();
  // An exact-size copy: the reader must stay inside it.
  std::unique_ptr<std::byte[]> img(new std::byte[img_span.size() + 1]);
  std::memcpy(img.get(), img_span.data(), img_span.size());
  auto snap = read_journal(std::span(img.get(), img_span.size()));
  if (!snap) {
    FUZZ_CHECK(snap.error().code == Errc::Io && fuzz::printable(snap.error().what), snap.error().what);
    return;
  }
  check_snapshot(*snap);
  FUZZ_TRACE("journal: %zu domains, %zu patches, %zu returns, %u torn, %u invalid", snap->domains.size(),
             snap->patches.size(), snap->returns.size(), snap->torn, snap->invalid);

  // The guests: each of the first kMaxDoms journaled domains that the environment says exists
  // has its own page tables and memory; the others are gone.
  fuzz::FakeHv hv;
  std::map<std::uint32_t, unsigned> index;  // domid -> k
  std::vector<std::unique_ptr<fuzz::PageTables>> tables;
  std::map<std::uint32_t, int> initial_pauses;
  std::set<std::uint32_t> reused;  // domids another domain holds now (another handle)
  for (const auto& d : snap->domains) {
    const std::uint8_t b = e.u8();
    if (b % 8 == 0 || index.size() == kMaxDoms) continue;  // gone
    const unsigned k = static_cast<unsigned>(index.size());
    index[d.domid.value] = k;
    tables.push_back(std::make_unique<fuzz::PageTables>(hv, tables_of(k), 8));
    auto& pt = *tables.back();
    hv.add_region(text_of(k), kTextPages, 0x90);
    hv.add_region(text_of(k) + 4, 1);
    hv.add_region(text_of(k) + 5, 1, 0xcc);
    for (std::uint64_t p = 0; p < kTextPages; ++p) pt.map(kText + p * kPageSize, text_of(k) + p, 1);  // read-only text
    pt.map(kStack, text_of(k) + 4, 3 | fuzz::PageTables::kNx);
    pt.map(kOea, text_of(k) + 5, 1);
    auto& info = hv.add_domain(d.domid, b & 8 ? hv::GuestType::Hvm : hv::GuestType::Pv, 1 + (b >> 4) % 4);
    info.dying = b % 16 == 1;
    info.handle = d.handle;
    if (b % 16 == 3) {
      info.handle[0] ^= 0xff;
      reused.insert(d.domid.value);
    }
    hv.pause_count[d.domid.value] = initial_pauses[d.domid.value] = e.u8() % 4;
    for (unsigned v = 0; v < info.vcpus; ++v) {
      auto& r = hv.regs(d.domid, v) = fuzz::long_mode_regs(pt.cr3());
      const std::uint8_t c = e.u8();
      const auto& ps = snap->patches;
      const auto& rs = snap->returns;
      switch (c % 5) {
        case 0: r.rip = e.u64(); break;
        case 1:
          if (!ps.empty()) r.rip = ps[c / 5 % ps.size()].gva.value;
          break;
        case 2:
          if (!ps.empty()) r.rip = ps[c / 5 % ps.size()].gva.value + 1;
          break;
        case 3:
          if (!ps.empty() && !rs.empty()) {
            r.rip = ps[c / 5 % ps.size()].gva.value;
            r.rsp = rs[c / 5 % rs.size()].slot.value + 8;
          }
          break;
        default: r.rip = kText + e.u8(); break;
      }
    }
    if (d.channel == JournalChannel::Debugger && e.flag()) hv.gdbsx.push_back(hv::GdbsxStatus{true, e.u8() % 5, 3});
  }
  // What the dead process left in memory: per patch, its written bytes, its restore bytes, or
  // something else; per return slot, the trampoline or not.
  for (const auto& p : snap->patches) {
    const std::uint8_t state = e.u8() % 3;
    auto k = index.find(p.domid.value);
    if (k == index.end()) continue;
    const auto at = phys(k->second, p.gva.value);
    if (!at || ((*at + p.written.size() - 1) >> 12) != (*at >> 12)) continue;
    if (state == 0) hv.write_phys(*at, p.written);
    if (state == 1) hv.write_phys(*at, p.restore);
  }
  for (const auto& r : snap->returns) {
    const bool tramp = e.flag();
    auto k = index.find(r.domid.value);
    if (k == index.end()) continue;
    if (const auto at = phys(k->second, r.slot.value); at && tramp) hv.write_u64_phys(*at, r.trampoline.value);
  }

  // Frame numbers in the order all_frames() lists them (ascending), to locate changed bytes.
  std::vector<std::uint64_t> frames;
  for (unsigned k = 0; k < index.size(); ++k)
    for (std::uint64_t f = tables_of(k); f < tables_of(k) + 8; ++f) frames.push_back(f);
  for (unsigned k = 0; k < index.size(); ++k)
    for (std::uint64_t f = text_of(k); f < text_of(k) + 6; ++f) frames.push_back(f);
  std::sort(frames.begin(), frames.end());
  auto image_offset = [&](std::uint64_t pa) -> std::optional<std::size_t> {
    auto it = std::lower_bound(frames.begin(), frames.end(), pa >> 12);
    if (it == frames.end() || *it != pa >> 12) return std::nullopt;
    return static_cast<std::size_t>(it - frames.begin()) * kPageSize + (pa & 0xfff);
  };

  const auto before = hv.all_frames();
  FUZZ_CHECK(before.size() == frames.size() * kPageSize);
  std::map<std::pair<std::uint32_t, unsigned>, std::uint64_t> rips;
  for (const auto& [dom, k] : index)
    if (auto i = hv.domain_info(DomId{dom}))
      for (unsigned v = 0; v < i->vcpus; ++v) rips[{dom, v}] = hv.regs(DomId{dom}, v).rip;

  std::vector<std::string> lines;
  const RecoveryReport rep = recover(hv, *snap, [&](log::Level, const std::string& l) { lines.push_back(l); });
  for (const auto& l : lines) FUZZ_CHECK(!l.empty());
  FUZZ_TRACE(
      "recover: %u domains, %u reused, %u restored, %u already, %u left alone, %u moved, %u returns, %u unpaused, "
      "%u failures",
      rep.domains, rep.reused, rep.restored, rep.already, rep.left_alone, rep.vcpus_moved, rep.returns_restored,
      rep.unpaused, rep.failures);
  const auto after = hv.all_frames();
  if (snap->clean) {
    FUZZ_CHECK(rep.domains == 0 && rep.restored == 0 && rep.vcpus_moved == 0, "a clean journal was acted on");
    FUZZ_CHECK(after == before);
    return;
  }
  FUZZ_CHECK(rep.reused == reused.size(), "every domain under another handle refused, and only those");
  for (std::uint32_t dom : reused) {
    FUZZ_CHECK(hv.pause_count[dom] == initial_pauses[dom], "a pause of a reused domid's domain changed");
    for (const auto& [key, rip] : rips)
      if (key.first == dom) FUZZ_CHECK(hv.regs(DomId{dom}, key.second).rip == rip, "a reused domid's vCPU moved");
  }

  // Memory: only journaled bytes changed, each patch's from exactly its `written` bytes.
  std::set<std::uint64_t> allowed;  // physical addresses
  for (const auto& p : snap->patches) {
    auto k = index.find(p.domid.value);
    if (p.kind == PatchKind::Trampoline || k == index.end() || reused.contains(p.domid.value)) continue;
    if (auto at = phys(k->second, p.gva.value))
      for (std::size_t n = 0; n < p.written.size(); ++n) allowed.insert(*at + n);
  }
  for (const auto& r : snap->returns) {
    auto k = index.find(r.domid.value);
    if (k == index.end() || reused.contains(r.domid.value)) continue;
    if (auto at = phys(k->second, r.slot.value))
      for (unsigned n = 0; n < 8; ++n) allowed.insert(*at + n);
  }
  for (std::size_t i = 0; i < after.size(); ++i) {
    if (after[i] == before[i]) continue;
    const std::uint64_t pa = (frames[i / kPageSize] << 12) + i % kPageSize;
    FUZZ_CHECK(allowed.contains(pa), "recovery wrote " + fuzz::hexs(pa) + ", which no journal record names");
  }
  for (const auto& p : snap->patches) {
    auto k = index.find(p.domid.value);
    if (p.kind == PatchKind::Trampoline || k == index.end()) continue;
    auto at = phys(k->second, p.gva.value);
    if (!at) continue;
    auto i = image_offset(*at);
    if (!i || *i + p.written.size() > after.size() || ((*at + p.written.size() - 1) >> 12) != (*at >> 12)) continue;
    const auto b = before.begin() + static_cast<std::ptrdiff_t>(*i);
    const auto a = after.begin() + static_cast<std::ptrdiff_t>(*i);
    const auto n = static_cast<std::ptrdiff_t>(p.written.size());
    // A record alone on its bytes (no other patch or return slot of its domain within reach)
    // changes only from its `written` bytes to its `restore` bytes.
    const bool alone =
        std::count_if(snap->patches.begin(), snap->patches.end(),
                      [&](const auto& q) { return q.domid == p.domid && q.gva.value - p.gva.value + 8 < 16; }) == 1 &&
        std::none_of(snap->returns.begin(), snap->returns.end(),
                     [&](const auto& r) { return r.domid == p.domid && r.slot.value - p.gva.value + 8 < 16; });
    if (alone && !std::equal(b, b + n, a))
      FUZZ_CHECK(
          std::equal(p.written.begin(), p.written.end(), b) && std::equal(p.restore.begin(), p.restore.end(), a),
          "recovery changed " + fuzz::hexs(p.gva.value) + " from other than `written` or to other than `restore`");
  }

  // vCPUs: moved only to a journaled destination (a gdbsx rewind may follow: one byte back).
  std::set<std::uint64_t> dests;
  for (const auto& p : snap->patches) dests.insert({p.gva.value, p.resume.value});
  for (const auto& r : snap->returns) dests.insert(r.ret);
  for (const auto& [key, rip] : rips) {
    const std::uint64_t now = hv.regs(DomId{key.first}, key.second).rip;
    if (now != rip)
      FUZZ_CHECK(dests.contains(now) || dests.contains(now + 1) || now + 1 == rip,
                 "a vCPU moved to " + fuzz::hexs(now) + ", no journaled place");
  }
  for (const auto& [dom, n] : initial_pauses)
    FUZZ_CHECK(hv.pause_count[dom] <= n, "recovery left a pause of its own on domain " + std::to_string(dom));
}

// ---- the writer against a model -----------------------------------------------------------

struct ModelPatch {
  PatchKind kind;
  std::vector<std::uint8_t> written, restore;
  std::uint64_t resume;
};

void writer(Input& in) {
  JournalLimits lim{static_cast<std::uint32_t>(1 + in.u8() % 4), static_cast<std::uint32_t>(1 + in.u8() % 8),
                    static_cast<std::uint32_t>(1 + in.u8() % 8)};
  auto jr = Journal::create(lim);
  FUZZ_CHECK(jr.has_value());
  Journal& j = **jr;
  struct Dom {
    JournalChannel ch;
    std::uint8_t trap;
    unsigned vcpus, held = 0, owed = 0;
  };
  // A handle per domid and trap byte, so that a domain added again may come with another.
  auto handle_of = [](std::uint32_t d, std::uint8_t trap) {
    hv::DomainHandle h{};
    h[0] = static_cast<std::uint8_t>(d);
    h[1] = static_cast<std::uint8_t>(d >> 8);
    h[15] = trap;
    return h;
  };
  std::map<std::uint32_t, Dom> doms;
  std::map<std::pair<std::uint32_t, std::uint64_t>, ModelPatch> patches;
  std::map<std::uint32_t, std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, std::uint64_t>>
      rets;  // index -> dom, slot, ret, tramp
  bool clean = false;
  const std::uint32_t domids[] = {1, 2, 3, 0x7fef};
  const std::uint64_t gvas[] = {kText, kText + 0x10, kOea, kOea + 0x20};

  for (unsigned ops = 0; ops < 64 && !in.empty(); ++ops) {
    const std::uint32_t d = in.pick(domids);
    switch (in.u8() % 10) {
      case 0: {
        const Dom m{in.flag() ? JournalChannel::Debugger : JournalChannel::VmEvent, in.u8(),
                    static_cast<unsigned>(in.range(1, 4096))};
        auto r = j.add_domain(DomId{d}, handle_of(d, m.trap), m.ch, m.trap, JournalMonitor::None, m.vcpus);
        FUZZ_CHECK(r.has_value() == (doms.contains(d) || doms.size() < lim.domains));
        if (r) doms[d] = m;
        break;
      }
      case 1:  // (a domain never added: nothing happens, not even to returns naming it)
        j.remove_domain(DomId{d});
        if (doms.erase(d)) {
          std::erase_if(patches, [&](const auto& p) { return p.first.first == d; });
          std::erase_if(rets, [&](const auto& r) { return std::get<0>(r.second) == d; });
        }
        break;
      case 2: {
        const std::size_t n = in.range(0, 9);
        ModelPatch p{static_cast<PatchKind>(1 + in.u8() % 3), {}, {}, in.u64()};
        for (std::size_t k = 0; k < n; ++k) p.written.push_back(in.u8()), p.restore.push_back(in.u8());
        if (in.u8() == 7 && !p.restore.empty()) p.restore.pop_back();
        const std::uint64_t gva = in.pick(gvas);
        auto r = j.add_patch(DomId{d}, p.kind, Gva{gva}, p.written, p.restore, Gva{p.resume});
        const bool fits = patches.contains({d, gva}) || patches.size() < lim.patches;
        const bool good = n >= 1 && n <= 8 && p.written.size() == p.restore.size() && doms.contains(d);
        FUZZ_CHECK(r.has_value() == (good && fits), "add_patch: " + (r ? std::string("accepted") : r.error().what));
        if (r) patches[{d, gva}] = p;
        break;
      }
      case 3: {
        const std::uint64_t gva = in.pick(gvas);
        j.remove_patch(DomId{d}, Gva{gva});
        patches.erase({d, gva});
        break;
      }
      case 4: {
        const std::uint64_t slot = kStack + 8 * in.range(0, 8), ret = in.u64(), tramp = kOea + in.u8();
        auto r = j.add_return(DomId{d}, Gva{slot}, ret, Gva{tramp});
        FUZZ_CHECK(r.has_value() == (rets.size() < lim.returns));
        if (r) {
          FUZZ_CHECK(*r < lim.returns && !rets.contains(*r));
          rets[*r] = {d, slot, ret, tramp};
        }
        break;
      }
      case 5: {
        const std::uint32_t i = static_cast<std::uint32_t>(in.range(0, lim.returns));
        j.remove_return(i);
        rets.erase(i);
        break;
      }
      case 6: {
        if (in.flag()) {
          j.add_held_pause(DomId{d});
          if (doms.contains(d) && doms[d].held < 255) doms[d].held++;
        } else {
          j.drop_held_pause(DomId{d});
          if (doms.contains(d) && doms[d].held > 0) doms[d].held--;
        }
        break;
      }
      case 7: {
        const unsigned owed = in.u8();
        j.set_owed_unpauses(DomId{d}, owed);
        if (doms.contains(d)) doms[d].owed = owed;
        break;
      }
      case 8:
        clean = in.flag();
        j.set_clean(clean);
        break;
      case 9: {  // a writer killed mid-update: one record's seq left odd, read from a copy
        std::vector<std::byte> img(j.bytes().begin(), j.bytes().end());
        JournalHeader h;
        std::memcpy(&h, img.data(), sizeof h);
        const std::uint64_t off = h.patches_off + std::uint64_t{in.u8() % h.max_patches} * sizeof(JournalPatchRec);
        std::uint32_t seq;
        std::memcpy(&seq, img.data() + off, 4);
        seq |= 1;
        std::memcpy(img.data() + off, &seq, 4);
        auto s = read_journal(img);
        FUZZ_CHECK(s && s->torn == 1, "a torn record is counted once");
        check_snapshot(*s);
        break;
      }
    }
    // The reader sees the model. (A return whose domain is gone is invalid to the reader.)
    auto s = read_journal(j.bytes());
    FUZZ_CHECK(s.has_value(), s.error().what);
    check_snapshot(*s);
    FUZZ_CHECK(s->clean == clean && s->torn == 0);
    const auto live_doms = std::count_if(doms.begin(), doms.end(), [](const auto& d) { return d.second.owed <= 255; });
    FUZZ_CHECK(s->domains.size() == static_cast<std::size_t>(live_doms),
               "domains read " + std::to_string(s->domains.size()) + ", model " + std::to_string(live_doms));
    for (const auto& sd : s->domains) {
      auto it = doms.find(sd.domid.value);
      FUZZ_CHECK(it != doms.end() && it->second.ch == sd.channel && it->second.trap == sd.trap_byte &&
                 it->second.vcpus == sd.vcpus && it->second.held == sd.held_pauses &&
                 handle_of(sd.domid.value, it->second.trap) == sd.handle);
      if (it->second.owed <= 255) FUZZ_CHECK(it->second.owed == sd.owed_unpauses);
    }
    for (const auto& sp : s->patches) {
      auto it = patches.find({sp.domid.value, sp.gva.value});
      FUZZ_CHECK(it != patches.end() && it->second.written == sp.written && it->second.restore == sp.restore &&
                     it->second.kind == sp.kind && it->second.resume == sp.resume.value,
                 "a patch the writer does not have");
    }
    FUZZ_CHECK(s->patches.size() == static_cast<std::size_t>(std::count_if(patches.begin(), patches.end(),
                                                                           [&](const auto& p) {
                                                                             auto d2 = doms.find(p.first.first);
                                                                             return d2 != doms.end() &&
                                                                                    d2->second.owed <= 255;
                                                                           })),
               "patches read " + std::to_string(s->patches.size()) + ", model " + std::to_string(patches.size()));
    const auto expected_rets = std::count_if(rets.begin(), rets.end(), [&](const auto& r) {
      auto d2 = doms.find(std::get<0>(r.second));
      return d2 != doms.end() && d2->second.owed <= 255 && std::get<2>(r.second) != std::get<3>(r.second);
    });
    FUZZ_CHECK(s->returns.size() == static_cast<std::size_t>(expected_rets),
               "returns read " + std::to_string(s->returns.size()));
    FUZZ_CHECK(j.empty() == (doms.empty() && patches.empty() && rets.empty()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::quiet_logs();
  if (size > 16384) return 0;
  Input in(data, size);
  if (in.u8() & 1) writer(in);
  else reader(in);
  return 0;
}

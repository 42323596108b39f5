// What every fuzz target shares: a reader over the fuzzer's bytes, an invariant check that
// aborts (libFuzzer keeps the input), and a fake hypervisor whose xenstore, vCPUs, frames,
// event channels and vm_event ring the target fills from its input.
//
// Everything here must also build with g++ -Werror: the same targets run as plain programs
// over their corpora in the normal test suite (replay_main.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/log.hpp"
#include "common/result.hpp"
#include "hv/hypervisor.hpp"

namespace xenprobes::fuzz {

// ---- invariants -------------------------------------------------------------------------

[[noreturn]] inline void invariant_failed(const char* file, int line, const char* cond, const std::string& detail) {
  std::fprintf(stderr, "\n==== fuzz invariant violated at %s:%d: %s\n     %s\n", file, line, cond, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

// FUZZ_CHECK(cond) or FUZZ_CHECK(cond, "detail " + x): aborts with the detail when cond fails.
#define FUZZ_CHECK(cond, ...)                                                                              \
  do {                                                                                                     \
    if (!(cond)) ::xenprobes::fuzz::invariant_failed(__FILE__, __LINE__, #cond, std::string{__VA_ARGS__}); \
  } while (0)

// Logs off unless XENPROBES_LOG asks for them: hostile inputs make the library warn a lot.
inline void quiet_logs() {
  static const bool once = [] {
    if (!std::getenv("XENPROBES_LOG")) log::set_level(log::Level::Off);
    return true;
  }();
  (void)once;
}

// Every byte printable ASCII: what the library says it does to hostile text in its messages.
inline bool printable(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

// XP_FUZZ_TRACE=1: the targets say what they do (to check that a seed goes where it should).
inline bool tracing() {
  static const bool on = std::getenv("XP_FUZZ_TRACE") != nullptr;
  return on;
}
#define FUZZ_TRACE(...)                            \
  do {                                             \
    if (::xenprobes::fuzz::tracing()) {            \
      std::fprintf(stderr, "trace: " __VA_ARGS__); \
      std::fputc('\n', stderr);                    \
    }                                              \
  } while (0)

inline std::string hexs(std::uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// ---- the fuzzer's bytes ------------------------------------------------------------------

// Reads front to back; past the end every read yields zeros, so a short input is simply one
// whose later choices are all 0.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : d_(data), n_(size) {}
  explicit Input(std::span<const std::uint8_t> s) : d_(s.data()), n_(s.size()) {}

  bool empty() const { return pos_ >= n_; }
  std::size_t left() const { return pos_ < n_ ? n_ - pos_ : 0; }

  std::uint8_t u8() { return pos_ < n_ ? d_[pos_++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (std::uint16_t{u8()} << 8)); }
  std::uint32_t u32() { return u16() | (std::uint32_t{u16()} << 16); }
  std::uint64_t u64() { return u32() | (std::uint64_t{u32()} << 32); }
  bool flag() { return u8() & 1; }
  // lo..hi inclusive.
  std::uint64_t range(std::uint64_t lo, std::uint64_t hi) {
    const std::uint64_t span = hi - lo;
    const std::uint64_t v = span < 0xff ? u8() : span < 0xffff ? u16() : span < 0xffffffff ? u32() : u64();
    return span == ~std::uint64_t{0} ? v : lo + v % (span + 1);
  }
  template <typename T, std::size_t N>
  T pick(const T (&a)[N]) {
    return a[range(0, N - 1)];
  }
  // Up to n bytes (fewer at the end).
  std::span<const std::uint8_t> bytes(std::size_t n) {
    n = std::min(n, left());
    std::span<const std::uint8_t> s(d_ + pos_, n);
    pos_ += n;
    return s;
  }
  // A u8 length, then that many bytes.
  std::string str() {
    auto b = bytes(u8());
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  std::span<const std::uint8_t> rest() { return bytes(left()); }

 private:
  const std::uint8_t* d_;
  std::size_t n_;
  std::size_t pos_ = 0;
};

// ---- a fake hypervisor -------------------------------------------------------------------

inline std::unexpected<Error> fake_error(Errc c, std::string what) {
  return std::unexpected(Error{c, std::move(what)});
}

// Guest frames live in regions: one heap allocation per region, so AddressSanitizer sees any
// access past a region's end. A map of frames that are consecutive in one region is a window
// into it (writes alias, as on Xen); any other map is a copy, written back on unmap when
// writable, and checked unchanged on unmap when read-only (Dom0 must never write through a
// read-only mapping).
class FakeHv final : public hv::Hypervisor {
 public:
  struct Region {
    std::uint64_t first = 0;
    std::size_t pages = 0;
    std::unique_ptr<std::byte[]> data;
  };

  // ---- setup ----
  std::byte* add_region(std::uint64_t first_frame, std::size_t pages, std::uint8_t fill = 0) {
    auto r = std::make_unique<Region>();
    r->first = first_frame;
    r->pages = pages;
    r->data.reset(new std::byte[pages * kPageSize]);
    std::memset(r->data.get(), fill, pages * kPageSize);
    std::byte* p = r->data.get();
    for (std::size_t i = 0; i < pages; ++i) frames_[first_frame + i] = {r.get(), i};
    regions_.push_back(std::move(r));
    return p;
  }
  std::byte* frame_ptr(std::uint64_t f) {
    auto it = frames_.find(f);
    return it == frames_.end() ? nullptr : it->second.first->data.get() + it->second.second * kPageSize;
  }
  bool has_frame(std::uint64_t f) const { return frames_.contains(f); }
  void write_phys(std::uint64_t pa, std::span<const std::uint8_t> b) {
    for (std::size_t i = 0; i < b.size(); ++i)
      if (std::byte* p = frame_ptr((pa + i) >> kPageShift)) p[(pa + i) & (kPageSize - 1)] = std::byte{b[i]};
  }
  void write_u64_phys(std::uint64_t pa, std::uint64_t v) {
    std::uint8_t b[8];
    std::memcpy(b, &v, 8);
    write_phys(pa, b);
  }
  std::vector<std::uint8_t> all_frames() const {  // every frame's bytes, in frame order
    std::vector<std::uint8_t> out;
    for (const auto& [f, where] : frames_) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(where.first->data.get() + where.second * kPageSize);
      out.insert(out.end(), p, p + kPageSize);
    }
    return out;
  }

  hv::DomainInfo& add_domain(DomId d, hv::GuestType type, unsigned vcpus) {
    hv::DomainInfo& i = domains_[d.value];
    i.domid = d;
    i.type = type;
    i.vcpus = vcpus;
    i.online_vcpus = vcpus;
    i.guest_width = 8;
    i.name = "fuzz";
    return i;
  }
  hv::VcpuRegs& regs(DomId d, unsigned vcpu) { return regs_[{d.value, vcpu}]; }

  std::map<std::string, std::string> xs;          // xenstore
  std::map<std::string, Errc> xs_read_fails;      // xs_read of these paths fails
  std::set<std::uint64_t> map_fails;              // maps touching these frames fail
  std::size_t fail_maps_after = ~std::size_t{0};  // every map after this many fails (Io)
  std::size_t maps = 0;
  hv::Capabilities caps{};
  std::optional<Errc> bind_fails;
  std::optional<Errc> notify_fails;
  std::optional<Errc> inject_fails;
  std::deque<hv::EvtchnPort> pending;  // what evtchn_pending hands out
  std::function<Result<std::unique_ptr<hv::VmEventRing>>(DomId)> ring_factory;
  std::deque<hv::GdbsxStatus> gdbsx;  // gdbsx_domstatus answers (then NoSys)

  // ---- what happened ----
  std::map<std::uint32_t, int> pause_count;
  std::set<hv::EvtchnPort> bound;
  unsigned notifies = 0, injects = 0, regs_set = 0;
  bool debugging_off = false, monitor_recovered = false;
  std::size_t live_mappings() const { return *live_; }

  // ---- hv::Hypervisor ----
  std::string name() const override { return "fuzz"; }
  Result<std::string> version() override { return std::string("4.17-fuzz"); }
  Result<hv::Capabilities> capabilities() override { return caps; }
  Result<std::vector<hv::DomainInfo>> list_domains() override {
    std::vector<hv::DomainInfo> v;
    for (auto& [id, i] : domains_) v.push_back(info_of(id));
    return v;
  }
  Result<hv::DomainInfo> domain_info(DomId d) override {
    if (!domains_.contains(d.value)) return fake_error(Errc::NoSuchDomain, "no domain " + std::to_string(d.value));
    return info_of(d.value);
  }
  Result<void> pause(DomId d) override {
    if (!domains_.contains(d.value)) return fake_error(Errc::NoSuchDomain, "no such domain");
    ++pause_count[d.value];
    return {};
  }
  Result<void> unpause(DomId d) override {
    if (!domains_.contains(d.value)) return fake_error(Errc::NoSuchDomain, "no such domain");
    if (pause_count[d.value] == 0) return fake_error(Errc::InvalidArgument, "unpause of a domain not paused");
    --pause_count[d.value];
    return {};
  }
  Result<hv::VcpuRegs> get_vcpu_regs(DomId d, VcpuId v) override {
    auto it = domains_.find(d.value);
    if (it == domains_.end()) return fake_error(Errc::NoSuchDomain, "no such domain");
    if (v.value >= it->second.vcpus) return fake_error(Errc::InvalidArgument, "no such vCPU");
    return regs_[{d.value, v.value}];
  }
  Result<void> set_vcpu_regs(DomId d, VcpuId v, const hv::VcpuRegs& r) override {
    auto it = domains_.find(d.value);
    if (it == domains_.end()) return fake_error(Errc::NoSuchDomain, "no such domain");
    if (v.value >= it->second.vcpus) return fake_error(Errc::InvalidArgument, "no such vCPU");
    hv::VcpuRegs& cur = regs_[{d.value, v.value}];
    const hv::VcpuRegs old = cur;
    cur = r;
    cur.cr0 = old.cr0, cur.cr2 = old.cr2, cur.cr3 = old.cr3, cur.cr4 = old.cr4, cur.efer = old.efer;
    ++regs_set;
    return {};
  }

  Result<hv::ForeignMapping> map_frames(DomId d, std::span<const Frame> fs, hv::MapAccess access) override {
    if (!domains_.contains(d.value)) return fake_error(Errc::NoSuchDomain, "no such domain");
    if (fs.empty()) return fake_error(Errc::InvalidArgument, "map of no frame");
    if (maps++ >= fail_maps_after) return fake_error(Errc::Io, "injected map failure");
    for (Frame f : fs) {
      if (!frames_.contains(f.value)) return fake_error(Errc::Fault, "frame " + hexs(f.value) + " is not guest RAM");
      if (map_fails.contains(f.value)) return fake_error(Errc::Io, "injected failure mapping " + hexs(f.value));
    }
    const auto first = frames_.at(fs[0].value);
    bool window = access == hv::MapAccess::ReadWrite;
    for (std::size_t i = 0; window && i < fs.size(); ++i) {
      const auto& w = frames_.at(fs[i].value);
      window = w.first == first.first && w.second == first.second + i;
    }
    ++*live_;
    if (window)
      return hv::ForeignMapping(first.first->data.get() + first.second * kPageSize, fs.size(),
                                [live = live_](std::byte*, std::size_t) { --*live; });
    // A copy: exactly the pages asked for, so any access past them is an ASan report.
    auto* copy = new std::byte[fs.size() * kPageSize];
    for (std::size_t i = 0; i < fs.size(); ++i) std::memcpy(copy + i * kPageSize, frame_ptr(fs[i].value), kPageSize);
    auto* orig = new std::byte[fs.size() * kPageSize];
    std::memcpy(orig, copy, fs.size() * kPageSize);
    std::vector<std::byte*> targets;
    for (Frame f : fs) targets.push_back(frame_ptr(f.value));
    const bool rw = access == hv::MapAccess::ReadWrite;
    return hv::ForeignMapping(copy, fs.size(), [live = live_, orig, targets, rw](std::byte* p, std::size_t n) {
      if (rw) {
        for (std::size_t i = 0; i < n; ++i) std::memcpy(targets[i], p + i * kPageSize, kPageSize);
      } else if (std::memcmp(p, orig, n * kPageSize) != 0) {
        invariant_failed(__FILE__, __LINE__, "read-only mapping unchanged", "Dom0 wrote through a read-only mapping");
      }
      delete[] p;
      delete[] orig;
      --*live;
    });
  }

  Result<std::string> xs_read(const std::string& path) override {
    if (auto f = xs_read_fails.find(path); f != xs_read_fails.end())
      return fake_error(f->second, "injected xs_read failure");
    auto it = xs.find(path);
    if (it == xs.end()) return fake_error(Errc::NotFound, "no such key");
    return it->second;
  }
  Result<void> xs_write(const std::string& path, const std::string& value) override {
    xs[path] = value;
    return {};
  }
  Result<void> xs_rm(const std::string& path) override {
    if (!xs.erase(path)) return fake_error(Errc::NotFound, "no such key");
    return {};
  }
  Result<std::vector<std::string>> xs_directory(const std::string& path) override {
    std::vector<std::string> out;
    const std::string pre = path + "/";
    for (auto& [k, v] : xs)
      if (k.starts_with(pre) && k.find('/', pre.size()) == std::string::npos) out.push_back(k.substr(pre.size()));
    return out;
  }
  Result<void> xs_grant_read(const std::string&, DomId) override { return {}; }
  Result<void> xs_watch(const std::string&, const std::string&) override { return {}; }
  Result<void> xs_unwatch(const std::string&, const std::string&) override { return {}; }
  int xs_fd() override { return -1; }
  Result<std::vector<hv::WatchEvent>> xs_read_watches() override { return std::vector<hv::WatchEvent>{}; }

  Result<hv::EvtchnPort> evtchn_bind_virq(unsigned) override { return fake_error(Errc::NotSupported, "no VIRQ here"); }
  Result<hv::EvtchnPort> evtchn_bind_interdomain(DomId d, std::uint32_t remote) override {
    if (!domains_.contains(d.value)) return fake_error(Errc::NoSuchDomain, "no such domain");
    if (bind_fails) return fake_error(*bind_fails, "injected bind failure");
    if (remote == 0) return fake_error(Errc::InvalidArgument, "port 0");
    const hv::EvtchnPort p = next_port_++;
    bound.insert(p);
    return p;
  }
  Result<void> evtchn_unbind(hv::EvtchnPort p) override {
    if (!bound.erase(p)) return fake_error(Errc::InvalidArgument, "port not bound");
    return {};
  }
  Result<void> evtchn_notify(hv::EvtchnPort p) override {
    if (notify_fails) return fake_error(*notify_fails, "injected notify failure");
    if (!bound.contains(p)) return fake_error(Errc::InvalidArgument, "notify of an unbound port");
    ++notifies;
    return {};
  }
  int evtchn_fd() override { return -1; }
  Result<std::optional<hv::EvtchnPort>> evtchn_pending() override {
    if (pending.empty()) return std::optional<hv::EvtchnPort>{};
    const hv::EvtchnPort p = pending.front();
    pending.pop_front();
    return std::optional<hv::EvtchnPort>{p};
  }
  Result<void> evtchn_unmask(hv::EvtchnPort) override { return {}; }

  Result<void> set_debugging(DomId d, bool on) override {
    if (!domains_.contains(d.value)) return fake_error(Errc::NoSuchDomain, "no such domain");
    if (!on) debugging_off = true;
    return {};
  }
  Result<hv::GdbsxStatus> gdbsx_domstatus(DomId) override {
    if (gdbsx.empty()) return fake_error(Errc::NoSys, "no gdbsx");
    auto s = gdbsx.front();
    gdbsx.pop_front();
    return s;
  }
  Result<std::unique_ptr<hv::VmEventRing>> monitor_enable(DomId d) override {
    if (!ring_factory) return fake_error(Errc::NotSupported, "no vm_event here");
    return ring_factory(d);
  }
  Result<void> monitor_disable(DomId) override { return {}; }
  Result<void> monitor_software_breakpoint(DomId, bool) override { return {}; }
  Result<void> monitor_debug_exceptions(DomId, bool, bool) override { return {}; }
  Result<void> monitor_recover(DomId) override {
    monitor_recovered = true;
    return {};
  }
  Result<void> inject_event(DomId, VcpuId, std::uint8_t, std::uint8_t, std::uint32_t, std::uint8_t) override {
    if (inject_fails) return fake_error(*inject_fails, "injected inject failure");
    ++injects;
    return {};
  }

 private:
  hv::DomainInfo info_of(std::uint32_t id) {
    hv::DomainInfo i = domains_.at(id);
    i.paused = pause_count[id] > 0;
    return i;
  }

  std::vector<std::unique_ptr<Region>> regions_;
  std::map<std::uint64_t, std::pair<Region*, std::size_t>> frames_;
  std::map<std::uint32_t, hv::DomainInfo> domains_;
  std::map<std::pair<std::uint32_t, unsigned>, hv::VcpuRegs> regs_;
  hv::EvtchnPort next_port_ = 10;
  std::shared_ptr<std::size_t> live_ = std::make_shared<std::size_t>(0);
};

// 4-level page tables written into a FakeHv region, 4 KiB leaves only.
class PageTables {
 public:
  static constexpr std::uint64_t kP = 1, kRw = 2, kNx = 1ull << 63;
  PageTables(FakeHv& hv, std::uint64_t first_frame, std::size_t max_tables)
      : hv_(hv), first_(first_frame), max_(max_tables) {
    hv_.add_region(first_frame, max_tables);
    next_ = first_ + 1;  // the root
  }
  std::uint64_t cr3() const { return first_ << kPageShift; }
  // False when out of table frames.
  bool map(std::uint64_t va, std::uint64_t frame, std::uint64_t flags = kP | kRw) {
    std::uint64_t table = first_;
    for (unsigned level = 4; level > 1; --level) {
      const unsigned idx = (va >> (12 + 9 * (level - 1))) & 511;
      std::uint64_t e = get(table, idx);
      if (!(e & kP)) {
        if (next_ >= first_ + max_) return false;
        e = (next_++ << kPageShift) | kP | kRw | 4;
        set(table, idx, e);
      }
      table = (e & 0x000F'FFFF'FFFF'F000ull) >> kPageShift;
    }
    set(table, (va >> 12) & 511, (frame << kPageShift) | flags);
    return true;
  }

 private:
  std::uint64_t get(std::uint64_t table, unsigned idx) {
    std::uint64_t v;
    std::memcpy(&v, hv_.frame_ptr(table) + idx * 8, 8);
    return v;
  }
  void set(std::uint64_t table, unsigned idx, std::uint64_t v) { std::memcpy(hv_.frame_ptr(table) + idx * 8, &v, 8); }

  FakeHv& hv_;
  std::uint64_t first_, max_, next_;
};

// vCPU registers whose paging context (mem::paging_context) is 4-level paging on `cr3`.
inline hv::VcpuRegs long_mode_regs(std::uint64_t cr3) {
  hv::VcpuRegs r;
  r.cr0 = 0x80050033;
  r.cr4 = 0x3706f0;  // PAE, no LA57
  r.efer = 0xd01;    // LME | LMA | NXE | SCE
  r.cr3 = cr3;
  return r;
}

}  // namespace xenprobes::fuzz

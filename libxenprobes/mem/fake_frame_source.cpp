#include "mem/fake_frame_source.hpp"

#include <algorithm>
#include <cstring>

#include "mem/hex.hpp"

namespace xenprobes::mem {

FakeFrameSource::FakeFrameSource() : state_(std::make_shared<State>()) {}

FakeFrameSource::Page& FakeFrameSource::add_frame(Frame f) {
  auto& slot = pages_[f];
  if (!slot) {
    slot = std::make_shared<Page>();
    slot->fill(std::byte{0});
  }
  return *slot;
}

bool FakeFrameSource::has_frame(Frame f) const { return pages_.count(f) != 0; }

void FakeFrameSource::remove_frame(Frame f) { pages_.erase(f); }

void FakeFrameSource::write(Gpa pa, std::span<const std::byte> data) {
  while (!data.empty()) {
    const std::size_t off = pa.value & (kPageSize - 1);
    const std::size_t n = std::min<std::size_t>(data.size(), kPageSize - off);
    std::memcpy(add_frame(frame_of(pa)).data() + off, data.data(), n);
    data = data.subspan(n);
    pa = pa + n;
  }
}

void FakeFrameSource::read(Gpa pa, std::span<std::byte> out) const {
  while (!out.empty()) {
    const std::size_t off = pa.value & (kPageSize - 1);
    const std::size_t n = std::min<std::size_t>(out.size(), kPageSize - off);
    auto it = pages_.find(frame_of(pa));
    if (it == pages_.end()) std::memset(out.data(), 0, n);
    else std::memcpy(out.data(), it->second->data() + off, n);
    out = out.subspan(n);
    pa = pa + n;
  }
}

void FakeFrameSource::write_u32(Gpa pa, std::uint32_t v) { write(pa, std::as_bytes(std::span(&v, 1))); }

void FakeFrameSource::write_u64(Gpa pa, std::uint64_t v) { write(pa, std::as_bytes(std::span(&v, 1))); }

std::uint64_t FakeFrameSource::read_u64(Gpa pa) const {
  std::uint64_t v = 0;
  read(pa, std::as_writable_bytes(std::span(&v, 1)));
  return v;
}

void FakeFrameSource::fail_next_maps(std::size_t count, Errc code) {
  fail_next_ = count;
  fail_code_ = code;
}

void FakeFrameSource::deny_writable(Frame f) { deny_writable_.insert(f); }

std::size_t FakeFrameSource::map_calls(hv::MapAccess access) const {
  return static_cast<std::size_t>(
      std::count_if(log_.begin(), log_.end(), [&](const auto& e) { return e.second == access; }));
}

Result<hv::ForeignMapping> FakeFrameSource::map(Frame f, hv::MapAccess access) {
  log_.emplace_back(f, access);
  if (fail_next_ > 0) {
    --fail_next_;
    return fail(fail_code_, "injected failure mapping frame " + detail::hex(f.value));
  }
  auto it = pages_.find(f);
  if (it == pages_.end()) return fail(Errc::Fault, "frame " + detail::hex(f.value) + " is not guest RAM");
  if (access == hv::MapAccess::ReadWrite && deny_writable_.count(f))
    return fail(Errc::Permission, "frame " + detail::hex(f.value) + " cannot be mapped writable");
  ++state_->live;
  const bool writable = access == hv::MapAccess::ReadWrite;
  if (writable) ++state_->writable[f];
  // The callback owns the page and the counters, so it stays safe if it outlives *this.
  return hv::ForeignMapping(it->second->data(), 1,
                            [page = it->second, state = state_, f, writable](std::byte*, std::size_t) {
                              --state->live;
                              if (writable && --state->writable[f] == 0) state->writable.erase(f);
                            });
}

}  // namespace xenprobes::mem

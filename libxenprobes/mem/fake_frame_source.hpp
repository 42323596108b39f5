// FakeFrameSource: guest "RAM" in a map, for tests and benchmarks (no hypervisor needed).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "mem/frame_source.hpp"

namespace xenprobes::mem {

// Frames are whatever numbers the test decides: use them as GFNs to model an HVM guest or as
// MFNs to model a PV guest; the fake (like the walker) does not care.
//
// Mappings alias the stored page (a write through a ReadWrite mapping is visible through any
// other mapping, as on Xen). A mapping keeps its page alive even if the frame is removed,
// as Xen keeps a mapped page referenced.
class FakeFrameSource final : public FrameSource {
 public:
  using Page = std::array<std::byte, kPageSize>;

  FakeFrameSource();

  // ---- guest RAM (test setup) ----
  Page& add_frame(Frame);  // zero-filled; returns the existing page if present
  bool has_frame(Frame) const;
  void remove_frame(Frame);
  // Byte access by physical address; write() creates missing frames, read() of a missing
  // frame yields zeros.
  void write(Gpa, std::span<const std::byte>);
  void read(Gpa, std::span<std::byte>) const;
  void write_u32(Gpa, std::uint32_t);
  void write_u64(Gpa, std::uint64_t);
  std::uint64_t read_u64(Gpa) const;

  // ---- fault injection ----
  void fail_next_maps(std::size_t count, Errc code = Errc::Io);
  // ReadWrite maps of this frame fail with Permission, as Xen refuses a writable foreign
  // mapping of a PV page-table page (it cannot take PGT_writable_page).
  void deny_writable(Frame);

  // ---- counters ----
  std::size_t map_calls() const { return log_.size(); }
  std::size_t map_calls(hv::MapAccess) const;
  std::size_t live_mappings() const { return state_->live; }
  // Writable mappings of `f` alive now (on a PV guest each holds a writable type reference).
  std::size_t live_writable(Frame f) const {
    auto it = state_->writable.find(f);
    return it == state_->writable.end() ? 0 : it->second;
  }
  const std::vector<std::pair<Frame, hv::MapAccess>>& map_log() const { return log_; }
  void clear_log() { log_.clear(); }

  [[nodiscard]] Result<hv::ForeignMapping> map(Frame, hv::MapAccess) override;

 private:
  struct State {
    std::size_t live = 0;
    std::unordered_map<Frame, std::size_t> writable;
  };
  std::unordered_map<Frame, std::shared_ptr<Page>> pages_;
  std::unordered_set<Frame> deny_writable_;
  std::size_t fail_next_ = 0;
  Errc fail_code_ = Errc::Io;
  std::vector<std::pair<Frame, hv::MapAccess>> log_;
  std::shared_ptr<State> state_;  // shared with the unmap callbacks, which may outlive *this
};

}  // namespace xenprobes::mem

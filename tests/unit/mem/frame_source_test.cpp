// HypervisorFrameSource: the adapter passes domid, the frame number and the access through
// to hv::Hypervisor::map_frames unchanged. A stub hypervisor implements only that.
#include "mem/frame_source.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "mem/guest_memory.hpp"
#include "unit/mem/page_table_builder.hpp"

namespace xenprobes::mem {
namespace {

using namespace xenprobes::mem::testing;

// Every operation but map_frames is NotSupported.
class MapOnlyHypervisor final : public hv::Hypervisor {
 public:
  struct Call {
    DomId domid;
    std::vector<Frame> frames;
    hv::MapAccess access;
  };
  FakeFrameSource ram;  // the guest's memory, served through map_frames
  std::vector<Call> calls;
  bool return_empty = false;

  Result<hv::ForeignMapping> map_frames(DomId d, std::span<const Frame> frames, hv::MapAccess a) override {
    calls.push_back({d, {frames.begin(), frames.end()}, a});
    if (return_empty) return hv::ForeignMapping{};
    if (frames.size() != 1) return no("map_frames of several frames");
    return ram.map(frames[0], a);
  }

  std::string name() const override { return "stub"; }
  Result<std::string> version() override { return no("version"); }
  Result<hv::Capabilities> capabilities() override { return no("capabilities"); }
  Result<std::vector<hv::DomainInfo>> list_domains() override { return no("list_domains"); }
  Result<hv::DomainInfo> domain_info(DomId) override { return no("domain_info"); }
  Result<void> pause(DomId) override { return no("pause"); }
  Result<void> unpause(DomId) override { return no("unpause"); }
  Result<hv::VcpuRegs> get_vcpu_regs(DomId, VcpuId) override { return no("get_vcpu_regs"); }
  Result<void> set_vcpu_regs(DomId, VcpuId, const hv::VcpuRegs&) override { return no("set_vcpu_regs"); }
  Result<std::string> xs_read(const std::string&) override { return no("xs_read"); }
  Result<void> xs_write(const std::string&, const std::string&) override { return no("xs_write"); }
  Result<void> xs_rm(const std::string&) override { return no("xs_rm"); }
  Result<std::vector<std::string>> xs_directory(const std::string&) override { return no("xs_directory"); }
  Result<void> xs_grant_read(const std::string&, DomId) override { return no("xs_grant_read"); }
  Result<void> xs_watch(const std::string&, const std::string&) override { return no("xs_watch"); }
  Result<void> xs_unwatch(const std::string&, const std::string&) override { return no("xs_unwatch"); }
  int xs_fd() override { return -1; }
  Result<std::vector<hv::WatchEvent>> xs_read_watches() override { return no("xs_read_watches"); }
  Result<hv::EvtchnPort> evtchn_bind_virq(unsigned) override { return no("evtchn_bind_virq"); }
  Result<hv::EvtchnPort> evtchn_bind_interdomain(DomId, std::uint32_t) override { return no("bind"); }
  Result<void> evtchn_unbind(hv::EvtchnPort) override { return no("evtchn_unbind"); }
  Result<void> evtchn_notify(hv::EvtchnPort) override { return no("evtchn_notify"); }
  int evtchn_fd() override { return -1; }
  Result<std::optional<hv::EvtchnPort>> evtchn_pending() override { return no("evtchn_pending"); }
  Result<void> evtchn_unmask(hv::EvtchnPort) override { return no("evtchn_unmask"); }
  Result<void> set_debugging(DomId, bool) override { return no("set_debugging"); }
  Result<hv::GdbsxStatus> gdbsx_domstatus(DomId) override { return no("gdbsx_domstatus"); }
  Result<std::unique_ptr<hv::VmEventRing>> monitor_enable(DomId) override { return no("monitor_enable"); }
  Result<void> monitor_disable(DomId) override { return no("monitor_disable"); }
  Result<void> monitor_software_breakpoint(DomId, bool) override { return no("monitor_sw_bp"); }
  Result<void> monitor_debug_exceptions(DomId, bool, bool) override { return no("monitor_debug"); }
  Result<void> inject_event(DomId, VcpuId, std::uint8_t, std::uint8_t, std::uint32_t, std::uint8_t) override {
    return no("inject_event");
  }

 private:
  static std::unexpected<Error> no(const char* what) { return fail(Errc::NotSupported, what); }
};

// A PV guest: its tables hold MFNs, and the adapter hands those MFNs to map_frames as is.
//
//   cr3 = 0x3a000000 -> PML4 MFN 0x3a000 -> PDPT 0x3a001 -> PD 0x3a002 -> PT 0x3a003
//   0xffffffff81000000 -> MFN 0x5b000
TEST(HypervisorFrameSource, PassesDomidFramesAndAccessThrough) {
  MapOnlyHypervisor hv;
  PageTableBuilder b(hv.ram, PagingMode::Long4, Frame{0x3a000});
  const std::uint64_t text = 0xFFFF'FFFF'8100'0000ull;
  b.map(text, 0x5b00'0000);
  hv.ram.add_frame(Frame{0x5b000});
  hv.ram.write_u64(Gpa{0x5b00'0010}, 0x0f0b);

  HypervisorFrameSource source(hv, DomId{7});
  GuestMemory mem(source);
  mem.set_context(pv_paging_mode(0), b.cr3());
  EXPECT_EQ(*mem.read_u64(Gva{text + 0x10}), 0x0f0bu);
  ASSERT_TRUE(mem.write_u8(Gva{text}, 0xCC));

  const std::vector<std::pair<std::uint64_t, hv::MapAccess>> expected = {
      {0x3a000, hv::MapAccess::Read}, {0x3a001, hv::MapAccess::Read}, {0x3a002, hv::MapAccess::Read},
      {0x3a003, hv::MapAccess::Read}, {0x5b000, hv::MapAccess::Read}, {0x5b000, hv::MapAccess::ReadWrite}};
  ASSERT_EQ(hv.calls.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(hv.calls[i].domid, DomId{7});
    ASSERT_EQ(hv.calls[i].frames.size(), 1u);
    EXPECT_EQ(hv.calls[i].frames[0].value, expected[i].first) << i;
    EXPECT_EQ(hv.calls[i].access, expected[i].second) << i;
  }
}

TEST(HypervisorFrameSource, EmptyMappingIsAnError) {
  MapOnlyHypervisor hv;
  hv.return_empty = true;
  HypervisorFrameSource source(hv, DomId{3});
  auto m = source.map(Frame{0x42}, hv::MapAccess::Read);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, Errc::Io);
  EXPECT_NE(m.error().what.find("frame 0x42 of domain 3"), std::string::npos) << m.error().what;
}

TEST(HypervisorFrameSource, ErrorsPassThrough) {
  MapOnlyHypervisor hv;
  HypervisorFrameSource source(hv, DomId{3});
  auto m = source.map(Frame{0x42}, hv::MapAccess::Read);  // not in the stub's RAM
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, Errc::Fault);
}

TEST(FakeFrameSource, MappingOutlivesRemovedFrameAndSource) {
  hv::ForeignMapping m;
  {
    FakeFrameSource ram;
    ram.write_u64(Gpa{0x1000}, 99);
    auto r = ram.map(Frame{1}, hv::MapAccess::Read);
    ASSERT_TRUE(r);
    m = std::move(*r);
    EXPECT_EQ(ram.live_mappings(), 1u);
    ram.remove_frame(Frame{1});
    EXPECT_FALSE(ram.map(Frame{1}, hv::MapAccess::Read));
  }
  std::uint64_t v;
  std::memcpy(&v, m.data(), 8);
  EXPECT_EQ(v, 99u);
}

TEST(FakeFrameSource, CountsAndInjectsFailures) {
  FakeFrameSource ram;
  ram.add_frame(Frame{1});
  ram.fail_next_maps(2, Errc::Busy);
  EXPECT_EQ(ram.map(Frame{1}, hv::MapAccess::Read).error().code, Errc::Busy);
  EXPECT_EQ(ram.map(Frame{1}, hv::MapAccess::Read).error().code, Errc::Busy);
  {
    auto ok = ram.map(Frame{1}, hv::MapAccess::ReadWrite);
    ASSERT_TRUE(ok);
    EXPECT_EQ(ram.live_mappings(), 1u);
  }
  EXPECT_EQ(ram.live_mappings(), 0u);
  EXPECT_EQ(ram.map_calls(), 3u);
  EXPECT_EQ(ram.map_calls(hv::MapAccess::ReadWrite), 1u);
  ram.deny_writable(Frame{1});
  EXPECT_EQ(ram.map(Frame{1}, hv::MapAccess::ReadWrite).error().code, Errc::Permission);
  EXPECT_TRUE(ram.map(Frame{1}, hv::MapAccess::Read));
}

}  // namespace
}  // namespace xenprobes::mem

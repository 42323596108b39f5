#include "xenprobes/guest_view.hpp"

#include "common/result.hpp"
#include "mem/frame_source.hpp"
#include "mem/guest_memory.hpp"
#include "mem/paging.hpp"

namespace xenprobes {

struct GuestView::Impl {
  Impl(hv::Hypervisor& hv, DomId d, bool pv) : source(hv, d), memory(source, options(pv)) {}
  static mem::GuestMemoryOptions options(bool pv) {
    mem::GuestMemoryOptions o;
    o.transient_data_writes = pv;  // see GuestMemory::write_transient()
    return o;
  }
  mem::HypervisorFrameSource source;
  mem::GuestMemory memory;
};

GuestView::GuestView(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GuestView::~GuestView() = default;

Result<std::unique_ptr<GuestView>> GuestView::open(hv::Hypervisor& hv, DomId domid, VcpuId vcpu) {
  hv::DomainInfo info = XP_TRY(hv.domain_info(domid));
  hv::VcpuRegs regs = XP_TRY(hv.get_vcpu_regs(domid, vcpu));
  mem::PagingContext ctx = XP_TRY(mem::paging_context(info, regs));
  auto impl = std::make_unique<Impl>(hv, domid, info.type == hv::GuestType::Pv);
  impl->memory.set_context(ctx);
  return std::unique_ptr<GuestView>(new GuestView(std::move(impl)));
}

Result<void> GuestView::read(Gva va, std::span<std::byte> out) { return impl_->memory.read(va, out); }
Result<void> GuestView::write(Gva va, std::span<const std::byte> data) {
  return impl_->memory.write_transient(va, data);
}
Result<std::uint64_t> GuestView::read_u64(Gva va) { return impl_->memory.read_u64(va); }
Result<std::string> GuestView::read_string(Gva va, std::size_t max_len) {
  return impl_->memory.read_string(va, max_len);
}
Result<Gpa> GuestView::translate(Gva va) {
  auto t = XP_TRY(impl_->memory.translate(va));
  return t.address;
}
void GuestView::flush() { impl_->memory.flush(); }

}  // namespace xenprobes

// GuestView: a domain's kernel memory as Dom0 sees it — guest-virtual addresses translated by
// walking the guest's own page tables (CR3 of one vCPU), frames mapped through the hypervisor
// and cached. The probe API builds on it; tools may use it directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "xenprobes/export.h"
#include "xenprobes/hypervisor.hpp"
#include "xenprobes/result.hpp"
#include "xenprobes/types.hpp"

namespace xenprobes {

class XENPROBES_API GuestView {
 public:
  // Reads the paging mode and CR3 from `vcpu` of `domid`. The hypervisor must outlive the view.
  [[nodiscard]] static Result<std::unique_ptr<GuestView>> open(hv::Hypervisor& hv, DomId domid,
                                                               VcpuId vcpu = VcpuId{0});
  ~GuestView();

  [[nodiscard]] Result<void> read(Gva va, std::span<std::byte> out);
  // On a PV guest it leaves no writable mapping of the frames behind: a frame Dom0 holds
  // writable cannot become a page table there, and the guest reuses any page it frees.
  [[nodiscard]] Result<void> write(Gva va, std::span<const std::byte> data);
  [[nodiscard]] Result<std::uint64_t> read_u64(Gva va);
  [[nodiscard]] Result<std::string> read_string(Gva va, std::size_t max_len);
  // Physical address (GPA for HVM, machine address for PV) of a guest-virtual address.
  [[nodiscard]] Result<Gpa> translate(Gva va);
  // Drops cached translations and mappings (after the guest may have changed its tables).
  void flush();

 private:
  struct Impl;
  explicit GuestView(std::unique_ptr<Impl>);
  std::unique_ptr<Impl> impl_;
};

}  // namespace xenprobes

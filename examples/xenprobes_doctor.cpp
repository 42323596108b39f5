// xenprobes-doctor: what can probe what on this host. For every guest domain (or one): its
// type, the guest module and its protocol version, and each channel with the reason it can
// or cannot serve, plus what the automatic choice would pick. Touches no guest.
//
//   xenprobes-doctor [domid]
//
// Exit status: 0 when every domain reported can be probed by some channel, 1 otherwise.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "example_backend.h"
#include "xenprobes/doctor.hpp"
#include "xenprobes/hypervisor.hpp"

int main(int argc, char** argv) {
  using namespace xenprobes;
  example_choose_backend("xenprobes-doctor");
  std::optional<DomId> only;
  if (argc > 1) {
    char* end = nullptr;
    unsigned long v = std::strtoul(argv[1], &end, 10);
    if (!*argv[1] || *end || v > 0x7fef) {
      std::fprintf(stderr, "xenprobes-doctor: '%s' is not a domain id\nusage: xenprobes-doctor [domid]\n", argv[1]);
      return 2;
    }
    only = DomId{static_cast<std::uint32_t>(v)};
  }
  auto hv = hv::open_hypervisor();
  if (!hv) {
    std::fprintf(stderr, "xenprobes-doctor: %s\n", hv.error().what.c_str());
    return 1;
  }
  auto rep = doctor(**hv, only);
  if (!rep) {
    std::fprintf(stderr, "xenprobes-doctor: %s\n", rep.error().what.c_str());
    return 1;
  }
  std::fputs(format(*rep).c_str(), stdout);
  for (const DomainReport& d : rep->domains)
    if (!d.auto_choice) return 1;
  return 0;
}

// What the kill-icall and safety-extable-all commands share (xpe2e_icall.cpp,
// xpe2e_extable_all.cpp): a session on the guest module's channel with the kernel's symbols from
// Dom0's /proc/kallsyms (a PV guest runs Dom0's kernel build), and kernel text read from the
// running guest and decoded with Capstone (independently of the library). The symbols as this
// program reads them (Kallsyms) are in xpe2e_kallsyms.hpp, the rule a refusal names (rule_of) in
// xpe2e_common.hpp.
#pragma once

#include <capstone/capstone.h>

#include <algorithm>
#include <cinttypes>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"
#include "xpe2e_kallsyms.hpp"

namespace xpe2e {

// n bytes of guest memory at addr, page by page (a range need not be mapped as one run).
inline bool read_guest(xenprobes::GuestView& view, std::uint64_t addr, std::size_t n, std::vector<std::byte>* out,
                       std::string* why) {
  out->assign(n, std::byte{0});
  for (std::size_t off = 0; off < n;) {
    const std::size_t k = std::min<std::uint64_t>(4096 - ((addr + off) & 4095), n - off);
    if (auto r = view.read(xenprobes::Gva{addr + off}, std::span(*out).subspan(off, k)); !r) {
      *why = fmt("read %#" PRIx64 ": ", addr + off) + r.error().what;
      return false;
    }
    off += k;
  }
  return true;
}

// One instruction as this program decodes it.
struct Decoded {
  std::uint64_t addr = 0;
  unsigned size = 0;
  std::string text;                // "call rax"
  bool call = false, jmp = false;  // near call / unconditional jmp
  bool via_reg = false;            // call/jmp *%reg
  bool via_mem = false;            // call/jmp *mem
  std::uint64_t target = 0;        // a relative call/jmp's destination, else 0
};

// The instructions of `bytes` (at guest address `addr`) up to the first Capstone cannot decode;
// *end is where decoding stopped.
inline std::vector<Decoded> decode(const std::vector<std::byte>& bytes, std::uint64_t addr, std::uint64_t* end) {
  std::vector<Decoded> out;
  *end = addr;
  csh h;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) fatal("cs_open");
  cs_option(h, CS_OPT_DETAIL, CS_OPT_ON);
  cs_insn* insn = nullptr;
  const std::size_t n = cs_disasm(h, reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), addr, 0, &insn);
  for (std::size_t i = 0; i < n; ++i) {
    Decoded d;
    d.addr = insn[i].address;
    d.size = insn[i].size;
    d.text = fmt("%s %s", insn[i].mnemonic, insn[i].op_str);
    d.call = insn[i].id == X86_INS_CALL;
    d.jmp = insn[i].id == X86_INS_JMP;
    if ((d.call || d.jmp) && insn[i].detail && insn[i].detail->x86.op_count == 1) {
      const cs_x86_op& op = insn[i].detail->x86.operands[0];
      d.via_reg = op.type == X86_OP_REG;
      d.via_mem = op.type == X86_OP_MEM;
      if (op.type == X86_OP_IMM) d.target = static_cast<std::uint64_t>(op.imm);
    }
    *end = d.addr + d.size;
    out.push_back(std::move(d));
  }
  if (n) cs_free(insn, n);
  cs_close(&h);
  return out;
}

// Waits for the guest module (its state key "ready"), opens a session on `kind` and loads Dom0's
// /proc/kallsyms for the domain; fails the program when any of it does not work.
inline std::unique_ptr<xenprobes::Session> open_module_session(xenprobes::DomId dom, xenprobes::ChannelKind kind,
                                                               std::string* channel) {
  using namespace xenprobes;
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  auto state = wait_key(*hvp, dom_path(dom, XENPROBES_XS_DIR "/" XENPROBES_XS_STATE), 120);
  check("module.state", state && *state == XENPROBES_XS_STATE_READY,
        state ? "state=" + *state : "no data/xenprobes/state within 120 s");
  if (!state) fatal("the guest module never published its keys");
  // Dom0's kallsyms name the guest's addresses only when the guest runs Dom0's kernel build.
  auto rel = hvp->xs_read(dom_path(dom, XENPROBES_XS_DIR "/" XENPROBES_XS_RELEASE));
  std::string dom0_rel;
  if (std::ifstream f("/proc/sys/kernel/osrelease"); f) std::getline(f, dom0_rel);
  if (!check("module.release", rel && *rel == dom0_rel,
             "guest " + (rel ? *rel : std::string("?")) + ", Dom0 " + dom0_rel +
                 " (Dom0's kallsyms serve only the same build)"))
    fatal("the guest runs another kernel build than Dom0");
  say("XPE2E-INFO: %s", describe(ctl_header(*hvp, dom)).c_str());
  auto s = must(Session::open(std::move(hvp), SessionOptions{kind}), "Session::open");
  must(s->load_symbols(dom, "/proc/kallsyms"), "load_symbols(/proc/kallsyms)");
  *channel = must(s->channel_name(dom), "channel_name");
  return s;
}

}  // namespace xpe2e

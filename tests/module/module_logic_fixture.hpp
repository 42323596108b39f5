// The guest module's pure decisions (guest-module/xp_logic.c, xp_fallback.c), compiled as userspace
// C11: what their tests share. A guest layout like x86-64 Linux, guest memory the decisions read
// and write through callbacks, and the registers and trap entries a hit comes with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <vector>

#include "xp_logic.h"

namespace module_logic {

// A guest layout like x86-64 Linux: core text, the module area, our OEA pool inside it.
constexpr std::uint64_t kText = 0xffffffff81000000ull;
constexpr std::uint64_t kTextEnd = 0xffffffff82000000ull;
constexpr std::uint64_t kModules = 0xffffffffc0000000ull;
constexpr std::uint64_t kModulesEnd = 0xffffffffff000000ull;
constexpr std::uint64_t kOea = 0xffffffffc0200000ull;
constexpr std::uint64_t kOeaEnd = kOea + 0x200000;
constexpr std::uint64_t kStack = 0xffffc90000013f00ull;  // a vmap'd kernel stack
constexpr std::uint64_t kRflagsIf = 0x200;               // IF: never taken from Dom0
constexpr std::uint64_t kRflagsDf = 0x400;

struct Guest {
  std::set<std::uint64_t> nx_pages;              // mapped but not executable
  std::map<std::uint64_t, std::uint64_t> stack;  // 8-byte words
  std::set<std::uint64_t> faulting;              // reads/writes there fault
  int writes = 0;

  static bool is_exec(void* ctx, std::uint64_t addr) {
    return !static_cast<Guest*>(ctx)->nx_pages.count(addr & ~0xfffull);
  }
  static bool read(void* ctx, std::uint64_t addr, std::uint64_t* val) {
    auto* g = static_cast<Guest*>(ctx);
    if (g->faulting.count(addr)) return false;
    auto it = g->stack.find(addr);
    *val = it == g->stack.end() ? 0 : it->second;
    return true;
  }
  static bool write(void* ctx, std::uint64_t addr, std::uint64_t val) {
    auto* g = static_cast<Guest*>(ctx);
    if (g->faulting.count(addr)) return false;
    g->stack[addr] = val;
    ++g->writes;
    return true;
  }

  xp_bounds bounds() {
    xp_bounds b{};
    b.ktext = {kText, kTextEnd};
    b.modules = {kModules, kModulesEnd};
    b.oea = {kOea, kOeaEnd};
    b.is_exec = &Guest::is_exec;
    b.ctx = this;
    return b;
  }
  xp_mem_ops mem() { return xp_mem_ops{&Guest::read, &Guest::write, this}; }
};

inline xenprobes_regs regs_at(std::uint64_t rip) {
  xenprobes_regs r{};
  r.rax = 0x1111;
  r.rbx = 0x2222;
  r.rcx = 0x3333;
  r.rsp = kStack;
  r.rip = rip;
  r.rflags = 0x2 | kRflagsIf;
  r.cs = 0x10;
  r.ss = 0x18;
  return r;
}

inline xenprobes_trap trap(std::uint64_t addr, std::uint32_t flags, std::initializer_list<std::uint8_t> insn,
                           std::uint64_t fallback = 0) {
  xenprobes_trap t{};
  t.addr = addr;
  t.flags = flags;
  t.fallback = fallback;
  t.len = static_cast<std::uint8_t>(insn.size());
  std::copy(insn.begin(), insn.end(), t.insn);
  return t;
}

// The address of a value that lives until the end of the full expression.
inline const xenprobes_trap* ptr(const xenprobes_trap& t) { return &t; }

// What Dom0 does to the mailbox at module time `now` (ns): its state and the seq it answers.
using Dom0Script = std::function<void(std::uint64_t now, std::uint32_t& state, std::uint32_t& answer_seq)>;

}  // namespace module_logic

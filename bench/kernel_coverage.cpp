// Coverage of a real kernel (issue 14, item 5): every instruction of every function of a kernel
// image, and the share the library would accept as
//   - probe-able on the vmevent channel with the guest module's slots (entry placement, the
//     address rules read from the image's own tables, the foreign-trap rule, the instruction
//     rules: what Engine::decode_probe_point decides),
//   - boostable (a slot copy + jmp back: plans boost and boost-riprel),
//   - jump-optimizable (probe-able, and x86::check_jump accepts a 5-byte jump region for it),
//   - and jump-optimizable with the engine's two rules, each alone and both: tail calls proven
//     from the image, and short jumps to islands in the dead padding the engine lists
//     (kernel::island_padding_near, the library's selection the engine calls),
// with per-reason counts of everything refused. The parts: coverage.hpp.
//
// The image stands in for the guest's memory: its PT_LOAD segments at their link addresses
// (a memory adaptor), and the kernel layer's own table readers run over it unchanged. The
// image is the kernel before boot: alternatives, retpoline and return-thunk sites and the
// ftrace sites (still `call __fentry__`) are rewritten when it boots, and .smp_locks is still
// there (docs/benchmarks.md says what that changes).
//
//   kernel_coverage [--every N] [--max-functions N] [--examples] [--islands] [--proof] <vmlinux> <System.map>
//
// --islands: one line per instruction that only a short jump to an island serves (islands
// alone, no tail-call proof: what the engine places without the vmlinux), "ISLAND
// <function>+<offset> island <function>+<offset> <instruction>", to pick e2e targets
// (docs/e2e.md).
// --proof: one line per instruction that neither a 5-byte region nor a short jump to an island
// serves without the tail-call proof, and a 5-byte region serves with it (what a session given
// the guest's vmlinux places as a jump, and refuses without it), "PROOF <function>+<offset>
// <instruction>", for the same purpose.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "coverage.hpp"

using namespace xenprobes;

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: kernel_coverage [--every N] [--max-functions N] [--examples] [--islands] [--proof] "
               "<vmlinux> <System.map>\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  coverage::Options o;
  std::vector<std::string> args;
  for (int k = 1; k < argc; ++k) {
    std::string a = argv[k];
    if ((a == "--every" || a == "--max-functions") && k + 1 < argc) {
      char* end = nullptr;
      unsigned long v = std::strtoul(argv[++k], &end, 10);
      if (!end || *end || v == 0) return usage();
      (a == "--every" ? o.every : o.max_functions) = v;
    } else if (a == "--islands") {
      o.list_islands = true;
    } else if (a == "--proof") {
      o.list_proof = true;
    } else if (a == "--examples") {
      o.examples = true;
    } else if (a.starts_with("--")) {
      return usage();
    } else {
      args.push_back(a);
    }
  }
  if (args.size() != 2) return usage();
  o.vmlinux = args[0];
  o.system_map = args[1];
  log::set_level(log::Level::Error);
  const auto t0 = std::chrono::steady_clock::now();

  auto k = coverage::Kernel::load(o);
  if (!k) {
    std::fprintf(stderr, "kernel_coverage: %s\n", k.error().what.c_str());
    return 1;
  }
  const coverage::Tally t = coverage::count(**k, o);
  coverage::report(**k, o, t, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  // A run that saw nothing, or read none of the tables, proves nothing.
  bool ok = t.total > 0 && t.jump_ok > 0;
  const kernel::KernelTables& tables = (*k)->tables;
  for (const kernel::TableStatus* st :
       {&tables.ex_status(), &tables.jump_status(), &tables.static_call_status(), &tables.smp_locks_status()})
    if (!st->found || st->entries == 0) {
      std::fprintf(stderr, "kernel_coverage: table %s not read: %s\n", st->name, st->why.c_str());
      ok = false;
    }
  return ok ? 0 : 1;
}

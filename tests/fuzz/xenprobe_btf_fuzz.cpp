// Fuzz target: the xenprobe language's types (xenprobe/btf.cpp, the TypeSource xenprobe and
// xenprobesd build from a guest kernel's BTF and its loaded modules' split BTF, both read from
// the guest's memory: hostile). libbpf's btf__new validates a blob before we walk it; what we
// then do with its types (typedef chains, anonymous members, arrays, pointers, per-CPU
// variables) must not crash or loop, whatever the type graph.
//
// Input: u32 n, then n bytes of the kernel's BTF (at most the rest), then a module's split BTF
// over it (the rest; none when empty).
//
// Invariants: open_btf_bytes() throws std::runtime_error or gives a TypeSource; on one, for every
// named struct and union (at most 256): find_record() finds it by its name (`void`: never), describe() of it is
// a record, member() finds each of the first 64 names member_names() gives, describe() of a member's type does
// not crash; percpu_offset() of the task pointer's variables and a compile of a program that
// casts to the record and reads a member, or of one using comm/pid, throws ProgramError at most.
#include <bpf/btf.h>

#include <stdexcept>

#include "compile.hpp"
#include "fuzz/fuzz_common.hpp"
#include "types.hpp"

using xenprobes::fuzz::Input;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  xenprobes::fuzz::quiet_logs();
  if (size > (1u << 20)) return 0;
  Input in(data, size);
  const std::uint32_t n = in.u32();
  const std::size_t head = std::min<std::size_t>(4, size);
  const std::size_t klen = std::min<std::size_t>(n, size - head);
  const auto* p = reinterpret_cast<const std::byte*>(data + head);
  const std::vector<std::byte> kernel(p, p + klen);
  std::vector<xenprobe::ModuleTypes> mods;
  if (size > head + klen) mods.push_back({"mod", std::vector<std::byte>(p + klen, p + (size - head))});
  std::unique_ptr<xenprobe::TypeSource> t;
  std::vector<std::string> refused;
  try {
    t = xenprobe::open_btf_bytes(kernel, "fuzzed BTF", mods, &refused);
  } catch (const std::runtime_error&) { return 0; }
  FUZZ_CHECK(t != nullptr);
  FUZZ_TRACE("types: %s; %zu module BTF refused", t->description().c_str(), refused.size());
  (void)t->percpu_offset("current_task");
  (void)t->percpu_offset("pcpu_hot");
  // The names of the records to look up: from libbpf's own view of the same bytes.
  btf* b = btf__new(kernel.data(), static_cast<__u32>(kernel.size()));
  if (!b) return 0;
  const std::uint32_t count = btf__type_cnt(b);
  unsigned looked = 0;
  for (std::uint32_t id = 1; id < count && looked < 256; ++id) {
    const btf_type* bt = btf__type_by_id(b, id);
    if (!bt || !(btf_is_struct(bt) || btf_is_union(bt))) continue;
    const char* name = btf__name_by_offset(b, bt->name_off);
    if (!name || !*name) continue;
    ++looked;
    const bool is_union = btf_is_union(bt);
    auto rec = t->find_record(name, is_union);
    if (std::string_view(name) == "void") {  // a keyword: never found, whatever the BTF says
      FUZZ_CHECK(!rec.has_value(), "a record named 'void' was found");
      continue;
    }
    FUZZ_CHECK(rec.has_value(), std::string("a record libbpf names is not found: ") + name);
    const xenprobe::TypeDesc d = t->describe(*rec);
    FUZZ_CHECK(d.kind == xenprobe::TypeDesc::Kind::Record, std::string("not a record: ") + name);
    std::string first_member;
    const std::vector<std::string> names = t->member_names(*rec);
    for (std::size_t k = 0; k < names.size() && k < 64; ++k) {
      const std::string& m = names[k];
      auto md = t->member(*rec, m);
      FUZZ_CHECK(md.has_value(), "member_names() gives '" + m + "', member() does not find it");
      const xenprobe::TypeDesc md_type = t->describe(md->type);
      if (md_type.kind == xenprobe::TypeDesc::Kind::Array || md_type.kind == xenprobe::TypeDesc::Kind::Ptr)
        (void)t->describe(md_type.target);
      if (first_member.empty() && md->bitfield == 0) first_member = m;
    }
    if (looked > 8 || first_member.empty() || !xenprobes::fuzz::printable(name) ||
        !xenprobes::fuzz::printable(first_member))
      continue;
    const std::string prog = std::string("kprobe:f { @[str(((") + (is_union ? "union " : "struct ") + name +
                             " *)arg0)->" + first_member + ")] = count(); @v = ((" + (is_union ? "union " : "struct ") +
                             name + " *)arg1)->" + first_member + "; }";
    try {
      (void)xenprobe::compile(xenprobe::parse(prog), t.get());
    } catch (const xenprobe::ProgramError&) {}
  }
  FUZZ_TRACE("%u records looked up", looked);
  try {
    (void)xenprobe::compile(xenprobe::parse("kprobe:f { @[comm, pid, tid] = count(); }"), t.get());
  } catch (const xenprobe::ProgramError&) {}
  btf__free(b);
  return 0;
}

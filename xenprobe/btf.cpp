// TypeSource over a BTF file, read with libbpf's BTF API.
#include <bpf/btf.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "shared/btf_split.hpp"
#include "types.hpp"

namespace xenprobe {
namespace {

// Guards against type graphs that loop (a hostile or broken file): no real chain of
// typedefs/qualifiers or of nested anonymous members is this deep.
constexpr int kMaxDepth = 32;
// Members visited in one lookup, at most (the kernel's largest record, task_struct, has a few
// hundred, anonymous members' own included). In C each anonymous struct or union is one
// member's own type; a hostile BTF can give one record many anonymous members of one type, each
// of them the same again, and the walk would grow as (members)^(depth).
constexpr int kMaxMembersVisited = 8192;

// The kernel's BTF and, on top of it, modules' split BTF. Ids: the kernel's as libbpf numbers
// them; a module's own types (its ids from the kernel's count on) get the ids after the
// kernel's and the modules' before it, so every type of every part has one id here.
class BtfFile final : public TypeSource {
 public:
  BtfFile(btf* b, std::string what) : btf_(b), what_(std::move(what)), base_cnt_(btf__type_cnt(b)) {}
  ~BtfFile() override {
    for (Part& p : parts_) btf__free(p.b);
    btf__free(btf_);
  }
  // A module's split BTF (btf__new_split over this kernel's); takes it.
  void add_module(btf* split, std::string module) {
    const std::uint32_t own = btf__type_cnt(split) - base_cnt_;
    const std::uint32_t first = parts_.empty() ? base_cnt_ : parts_.back().first + parts_.back().own;
    parts_.push_back(Part{split, std::move(module), first, own});
  }
  BtfFile(const BtfFile&) = delete;
  BtfFile& operator=(const BtfFile&) = delete;

  // "X, with the BTF of loaded module(s) ext4, xfs": the modules by name (a guest may have a
  // hundred: the first 8, then how many more), so that an error says where a type was looked for.
  std::string description() const override {
    if (parts_.empty()) return what_;
    constexpr std::size_t kNamed = 8;
    std::string d = what_ + ", with the BTF of loaded module(s) ";
    for (std::size_t i = 0; i < parts_.size() && i < kNamed; ++i) d += (i ? ", " : "") + parts_[i].module;
    if (parts_.size() > kNamed) d += " and " + std::to_string(parts_.size() - kNamed) + " more";
    return d;
  }

  // The kernel's type of that name wins; then the modules' in the order they were added.
  std::optional<std::uint32_t> find_record(std::string_view name, bool is_union) const override {
    // `void` is a keyword, never a record's name in C; libbpf's lookup answers "not found" for it
    // whatever the BTF holds, so a hostile BTF naming a struct `void` gets the same answer here.
    if (name == "void") return std::nullopt;
    std::string n(name);
    const auto kind = is_union ? BTF_KIND_UNION : BTF_KIND_STRUCT;
    int id = btf__find_by_name_kind(btf_, n.c_str(), kind);
    if (id > 0) return static_cast<std::uint32_t>(id);
    for (std::size_t k = 0; k < parts_.size(); ++k) {
      id = btf__find_by_name_kind(parts_[k].b, n.c_str(), kind);
      if (id > 0) return global(k + 1, static_cast<std::uint32_t>(id));
    }
    return std::nullopt;
  }

  TypeDesc describe(std::uint32_t gid) const override {
    TypeDesc d;
    const auto [part, id] = local(gid);
    const btf* b = part_btf(part);
    std::uint32_t cur = id;
    const btf_type* t = nullptr;
    for (int depth = 0; depth < kMaxDepth; ++depth) {
      t = btf__type_by_id(b, cur);
      if (!t) return d;
      if (btf_is_mod(t) || btf_is_typedef(t) || btf_is_type_tag(t)) {
        cur = t->type;
        continue;
      }
      break;
    }
    if (!t) return d;
    d.id = global(part, cur);
    d.name = name_of(b, cur);
    if (btf_is_int(t)) {
      d.kind = TypeDesc::Kind::Int;
      d.size = t->size;
      d.is_signed = (btf_int_encoding(t) & BTF_INT_SIGNED) != 0;
    } else if (btf_is_any_enum(t)) {
      d.kind = TypeDesc::Kind::Int;
      d.size = t->size;
      d.is_signed = true;
    } else if (btf_is_ptr(t)) {
      d.kind = TypeDesc::Kind::Ptr;
      d.size = 8;
      d.target = global(part, t->type);
    } else if (btf_is_composite(t)) {
      d.kind = TypeDesc::Kind::Record;
      d.size = t->size;
    } else if (btf_is_array(t)) {
      d.kind = TypeDesc::Kind::Array;
      const struct btf_array* a = btf_array(t);
      d.target = global(part, a->type);
      d.count = a->nelems;
      __s64 sz = btf__resolve_size(b, cur);
      d.size = sz > 0 ? static_cast<std::uint32_t>(sz) : 0;
    }
    return d;
  }

  std::optional<MemberDesc> member(std::uint32_t record, std::string_view name) const override {
    int budget = kMaxMembersVisited;
    return find_member(record, name, 0, 0, budget);
  }

  std::vector<std::string> member_names(std::uint32_t record) const override {
    std::vector<std::string> out;
    int budget = kMaxMembersVisited;
    collect_names(record, out, 0, budget);
    return out;
  }

  std::optional<std::uint64_t> percpu_offset(std::string_view variable) const override {
    std::string n(variable);
    int var = btf__find_by_name_kind(btf_, n.c_str(), BTF_KIND_VAR);
    if (var <= 0) return std::nullopt;
    int sec = btf__find_by_name_kind(btf_, ".data..percpu", BTF_KIND_DATASEC);
    if (sec <= 0) return std::nullopt;
    const btf_type* s = btf__type_by_id(btf_, static_cast<std::uint32_t>(sec));
    const btf_var_secinfo* v = btf_var_secinfos(s);
    for (unsigned i = 0; i < btf_vlen(s); ++i)
      if (v[i].type == static_cast<std::uint32_t>(var)) return v[i].offset;
    return std::nullopt;
  }

 private:
  struct Part {
    btf* b;
    std::string module;
    std::uint32_t first;  // its own types' ids here start at this
    std::uint32_t own;    // how many it has
  };
  // Part 0 is the kernel, part k the (k-1)th module.
  const btf* part_btf(std::size_t part) const { return part == 0 ? btf_ : parts_[part - 1].b; }
  // This TypeSource's id of a part's (local) id: the kernel's ids stay.
  std::uint32_t global(std::size_t part, std::uint32_t id) const {
    if (part == 0 || id < base_cnt_) return id;
    return parts_[part - 1].first + (id - base_cnt_);
  }
  // The part and its local id; an id past every part stays in part 0 (libbpf answers null).
  std::pair<std::size_t, std::uint32_t> local(std::uint32_t gid) const {
    if (gid < base_cnt_) return {0, gid};
    for (std::size_t k = 0; k < parts_.size(); ++k)
      if (gid >= parts_[k].first && gid - parts_[k].first < parts_[k].own)
        return {k + 1, base_cnt_ + (gid - parts_[k].first)};
    return {0, gid};
  }

  static std::string name_of(const btf* b, std::uint32_t id) {
    if (id == 0) return "void";
    const btf_type* t = btf__type_by_id(b, id);
    if (!t) return "?";
    const char* n = btf__name_by_offset(b, t->name_off);
    std::string base = n && *n ? n : "(anonymous)";
    if (btf_is_struct(t)) return "struct " + base;
    if (btf_is_union(t)) return "union " + base;
    if (btf_is_ptr(t)) return "pointer";
    if (btf_is_array(t)) return "array";
    return base;
  }

  std::optional<MemberDesc> find_member(std::uint32_t record, std::string_view name, std::uint32_t base, int depth,
                                        int& budget) const {
    if (depth > kMaxDepth) return std::nullopt;
    const auto [part, id] = local(record);
    const btf* b = part_btf(part);
    const btf_type* t = btf__type_by_id(b, id);
    if (!t || !btf_is_composite(t)) return std::nullopt;
    const btf_member* m = btf_members(t);
    for (unsigned i = 0; i < btf_vlen(t); ++i) {
      if (--budget < 0) return std::nullopt;
      const char* mn = btf__name_by_offset(b, m[i].name_off);
      const std::uint32_t bit = btf_member_bit_offset(t, i);
      if (mn && *mn) {
        if (name == mn) {
          MemberDesc d{global(part, m[i].type), base + bit / 8, btf_member_bitfield_size(t, i), bit % 8};
          d.misaligned = d.bitfield == 0 && bit % 8 != 0;
          return d;
        }
      } else {
        // An anonymous struct or union: its members are the record's own.
        TypeDesc inner = describe(global(part, m[i].type));
        if (inner.kind == TypeDesc::Kind::Record)
          if (auto r = find_member(inner.id, name, base + bit / 8, depth + 1, budget)) return r;
      }
    }
    return std::nullopt;
  }

  void collect_names(std::uint32_t record, std::vector<std::string>& out, int depth, int& budget) const {
    const auto [part, id] = local(record);
    const btf* b = part_btf(part);
    const btf_type* t = btf__type_by_id(b, id);
    if (depth > kMaxDepth || !t || !btf_is_composite(t)) return;
    const btf_member* m = btf_members(t);
    for (unsigned i = 0; i < btf_vlen(t); ++i) {
      if (--budget < 0) return;
      const char* mn = btf__name_by_offset(b, m[i].name_off);
      if (mn && *mn) {
        out.emplace_back(mn);
      } else {
        TypeDesc inner = describe(global(part, m[i].type));
        if (inner.kind == TypeDesc::Kind::Record) collect_names(inner.id, out, depth + 1, budget);
      }
    }
  }

  btf* btf_;
  std::string what_;
  std::uint32_t base_cnt_;  // the kernel's types, void included
  std::vector<Part> parts_;
};

}  // namespace

std::unique_ptr<TypeSource> open_btf_file(const std::string& path) {
  errno = 0;
  btf* b = btf__parse(path.c_str(), nullptr);  // libbpf 1.x: NULL and errno on failure
  if (!b)
    throw std::runtime_error("cannot read BTF from " + path + ": " + std::strerror(errno ? errno : EINVAL) +
                             " (give a raw BTF file such as /sys/kernel/btf/vmlinux of the guest's kernel, "
                             "or an ELF file with a .BTF section)");
  return std::make_unique<BtfFile>(b, "BTF file " + path);
}

std::unique_ptr<TypeSource> open_btf_bytes(std::span<const std::byte> bytes, const std::string& what,
                                           const std::vector<ModuleTypes>& modules, std::vector<std::string>* refused) {
  if (bytes.size() > std::numeric_limits<__u32>::max()) throw std::runtime_error(what + " is too large");
  errno = 0;
  btf* b = btf__new(bytes.data(), static_cast<__u32>(bytes.size()));  // libbpf 1.x: NULL and errno
  if (!b) throw std::runtime_error("libbpf refused " + what + ": " + std::strerror(errno ? errno : EINVAL));
  auto file = std::make_unique<BtfFile>(b, what);
  for (const ModuleTypes& m : modules) {
    if (m.btf.size() > std::numeric_limits<__u32>::max()) continue;
    btf* s = xp_shared::btf_new_split(m.btf, b);
    if (!s) {
      if (refused) refused->push_back(m.module + ": libbpf refused its BTF: " + std::strerror(errno ? errno : EINVAL));
      continue;
    }
    file->add_module(s, m.module);
  }
  return file;
}

}  // namespace xenprobe

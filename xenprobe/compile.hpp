// The semantic pass: checks a parsed program and annotates its tree (types, map and variable
// slots, field offsets, printf formats) so that a hit only walks a tree of precomputed
// operations. Everything that can be wrong with a program is found here, before anything is
// attached: a ProgramError with the position and what to use instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lang.hpp"
#include "types.hpp"

namespace xenprobe {

enum class MapKind : std::uint8_t { Int, Str, Count, Sum, Avg, Min, Max, Hist, Lhist };
const char* map_kind_name(MapKind);

inline constexpr std::size_t kMaxKeys = 8;
inline constexpr std::int64_t kMaxLhistBuckets = 1000;
inline constexpr int kHistBuckets = 66;             // (..., 0), [0], [1], [2, 4), ..., [2^63, ...)
inline constexpr std::int64_t kDefaultStrLen = 64;  // bytes, NUL included (bpftrace's default)
inline constexpr std::int64_t kMaxStrLen = 1024;
inline constexpr std::int64_t kMaxStackFrames = 127;  // kstack's default and most (bpftrace's default)

struct MapDecl {
  std::string name;  // "@name", "@" for the anonymous map
  MapKind kind = MapKind::Int;
  std::vector<bool> key_is_str;           // one per key
  Pos pos;                                // first assignment
  std::int64_t lo = 0, hi = 0, step = 0;  // lhist
  std::vector<bool> key_is_stack{};       // one per key: a kstack (printed one frame a line)
};

// One piece of a printf format: literal text, then (if conv != 0) one conversion.
struct FormatPiece {
  std::string literal;
  std::string spec;  // the conversion for snprintf, length modifier normalised: "%-8lld", "%s"
  char conv = 0;
};
struct Format {
  std::vector<FormatPiece> pieces;
};

// Where comm/pid/tid come from: the per-CPU `current` task pointer and task_struct's fields,
// all from the BTF source.
struct TaskLayout {
  bool available = false;
  std::string why_not;               // the message when a program uses comm/pid/tid without it
  std::uint64_t current_percpu = 0;  // offset of the task pointer from the per-CPU base (gs)
  std::uint32_t comm_offset = 0, comm_size = 0, pid_offset = 0, tgid_offset = 0;
};

struct Compiled {
  Program program;
  std::vector<MapDecl> maps;
  std::vector<Format> formats;
  std::vector<std::string> kaddrs;  // symbols kaddr() names, resolved per domain
  TaskLayout task;
  int max_vars = 0;
  bool uses_task = false;
  bool uses_kstack = false;  // the guest's unwind tables are needed
};

// Throws ProgramError. `types` may be null (no BTF source).
Compiled compile(Program, const TypeSource* types);

}  // namespace xenprobe

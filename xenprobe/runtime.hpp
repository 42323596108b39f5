// Running a compiled program: one Instance per probed domain (its own maps and variables, as
// if the program ran inside that guest), and the Output that writes what they print as text
// or as NDJSON records.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "compile.hpp"
#include "xenprobes/xenprobes.hpp"

namespace xenprobe {

enum class OutputFormat { Text, Json };

// Where every instance writes. Text: bpftrace's layout; with several domains each line starts
// with "[DOMAIN] ". Json: one record per line, bpftrace's record types plus a "domain" field.
class Output {
 public:
  Output(OutputFormat f, std::FILE* out, bool prefix) : format_(f), out_(out), prefix_(prefix) {}
  virtual ~Output() = default;  // xenprobesd sends each instance's records elsewhere
  OutputFormat format() const { return format_; }
  // Text for the stdout of `domain`; partial lines wait for the rest (each domain its own).
  virtual void text(const std::string& domain, std::string_view s);
  virtual void record(const std::string& domain, const char* type, const std::string& data_json);
  virtual void flush();  // ends partial lines
  // A warning about one domain's instance (a map is full): on stderr, "xenprobe: DOMAIN: msg".
  virtual void warning(const std::string& domain, const std::string& msg);

 private:
  OutputFormat format_;
  std::FILE* out_;
  bool prefix_;
  std::map<std::string, std::string> partial_;
};

// What a hit's probe is: for func and probe.
struct ProbeSite {
  std::string function;  // "sys_read"
  std::string probe;     // "kprobe:sys_read"
};

struct Value {
  std::int64_t i = 0;
  std::string s;
};

// What one instance may hold. Map keys come from the guest (a string it wrote, an argument it
// chose): without a bound, a guest that makes every key unique grows Dom0's memory without end.
// A full map takes no new key: the update is dropped, counted, and warned about once per map.
// Worst case per map: max_map_keys entries of at most kMaxKeys key parts of kMaxStrLen bytes.
inline constexpr std::size_t kDefaultMaxMapKeys = 4096;  // as bpftrace's default map size
inline constexpr std::size_t kMaxMapKeysLimit = 1'000'000;
struct Limits {
  std::size_t max_map_keys = kDefaultMaxMapKeys;  // keys per map, 1 ... kMaxMapKeysLimit
};

class Instance {
 public:
  Instance(const Compiled&, Output&, std::string domain, std::vector<std::int64_t> kaddrs, Limits = {});

  // Runs block `b` (predicate, then body) for one hit (ctx non-null) or for BEGIN, END and
  // interval (ctx null). Where the hit's values come from is ctx's business: the vCPU waiting
  // (the library's context) or an async record (async.hpp's RecordContext). `nsecs`, when
  // given, is what nsecs yields (an async record's guest clock), else Dom0's monotonic clock.
  void run(int b, const ProbeSite& site, xenprobes::HitContext* ctx, std::optional<std::int64_t> nsecs = {});
  bool exit_requested() const { return exit_; }
  std::uint64_t read_errors() const { return read_errors_; }
  const std::string& domain() const { return domain_; }
  // Updates dropped because the map of that slot (Compiled::maps) was full (a new key,
  // max_map_keys reached).
  std::uint64_t updates_dropped(int slot) const { return dropped_[static_cast<std::size_t>(slot)]; }
  // kstack's text for a hit: one "        func+0xOFF\n" line per frame after a "\n", at most
  // `frames` frames; false when the stack could not be walked at all (counted as a read error).
  using StackFn = std::function<bool(xenprobes::HitContext&, unsigned frames, std::string& out)>;
  void set_stack_source(StackFn f) { stacks_ = std::move(f); }
  // A new bound takes effect for the next new key; a map already over it keeps its keys.
  void set_limits(Limits l) { limits_ = l; }

  void print_map(int slot);
  void print_all_maps();
  // For tests: a map's entries as "k1,k2" -> value (avg: the average; hist: bucket sum).
  std::map<std::string, std::int64_t> snapshot(const std::string& map) const;

 private:
  struct Entry {
    std::vector<Value> keys;
    std::int64_t v = 0;
    std::int64_t n = 0;  // avg: samples; min/max: whether set
    std::string s;
    std::vector<std::uint64_t> buckets;
  };
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Table = std::unordered_map<std::string, Entry, Hash, std::equal_to<>>;

  void exec(const std::vector<Stmt>& body);
  void statement(const Stmt& s);
  void eval(const Expr& e, Value& out);
  std::int64_t eval_int(const Expr& e);
  Entry* entry(const Expr& target, bool create);
  void aggregate(const Stmt& s);
  void do_printf(const Expr& e);
  std::int64_t load(std::uint64_t addr, std::uint32_t size, bool is_signed);
  std::optional<std::uint64_t> current_task();  // nullopt (counted) if unreadable
  std::string map_text(int slot) const;
  std::string map_json(int slot, const char** type) const;
  std::vector<const Entry*> sorted(int slot) const;

  const Compiled& c_;
  Output& out_;
  std::string domain_;
  std::vector<std::int64_t> kaddrs_;
  std::vector<Table> maps_;
  Limits limits_;
  std::vector<std::uint64_t> dropped_;  // per map slot
  std::vector<Value> vars_;
  std::string key_;     // scratch: the encoded key of the entry being looked up
  std::string printf_;  // scratch: printf's output
  xenprobes::HitContext* ctx_ = nullptr;
  const ProbeSite* site_ = nullptr;
  std::optional<std::int64_t> nsecs_;  // the hit's time, when it comes with one
  bool exit_ = false;
  bool leave_ = false;  // exit() in the running action
  std::uint64_t read_errors_ = 0;
  StackFn stacks_;
};

}  // namespace xenprobe

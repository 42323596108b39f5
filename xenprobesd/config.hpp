// xenprobesd's configuration: a TOML file (docs/xenprobesd.md has the schema) read with
// toml++, checked completely before the daemon uses any of it. Every error names the file,
// the line and the column, and says what to write instead; a program that does not compile
// gives the xenprobe checker's own message, placed in the configuration file when the program
// is written inline.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "async.hpp"
#include "compile.hpp"

namespace xenprobesd {

// One way of choosing domains. A program runs in every domain that any of its selectors
// matches (Dom0 never).
struct Selector {
  enum class Kind { Name, Domid, Glob, Xenstore };
  Kind kind = Kind::Name;
  std::string text;         // Name: the name; Glob: the pattern; Xenstore: the key below /local/domain/<id>/
  std::uint32_t domid = 0;  // Domid
  std::string value;        // Xenstore: a glob the key's value must match
  std::string describe() const;
};

enum class Outputs { Metrics, Events, Both };
const char* outputs_name(Outputs);

// How a program's kprobes go into the guest: xenprobe's --method (docs/xenprobe.md "--method").
// kretprobes are trap probes whatever it says.
enum class Method { Trap, Jump, Fastest, Async };
const char* method_name(Method);

// Each block's async plan (xenprobe::plan_async), shared by the attachments of a program.
using AsyncPlans = std::shared_ptr<const std::vector<xenprobe::AsyncPlan>>;

struct ProgramConfig {
  std::string name;
  std::string source;  // the program's text
  std::string origin;  // where it came from, for messages: "FILE:LINE" or the program file
  std::vector<Selector> domains;
  Outputs outputs = Outputs::Both;
  double events_per_second = 100;  // rate limit of event records, per domain
  double event_burst = 200;
  unsigned maxactive = 64;
  Method method = Method::Trap;
  // The checked program (shared so that a reload can keep it when the text is unchanged).
  // Null when the program needs the guest kernel's types (casts, fields, comm, pid, tid): it
  // is then checked again for each domain with that domain's BTF, read from its memory, and
  // `parsed` holds its probes meanwhile.
  std::shared_ptr<const xenprobe::Compiled> compiled;
  std::shared_ptr<const xenprobe::Program> parsed;
  // Method::Async: what each block's async probes capture (xenprobe::plan_async over
  // `compiled`). A program checked for each domain is planned there (Daemon::compiled_for).
  AsyncPlans plans;

  bool wants_metrics() const { return outputs != Outputs::Events; }
  bool wants_events() const { return outputs != Outputs::Metrics; }
};

struct Config {
  std::string path;
  std::string channel = "auto";
  std::string event_log = "-";                    // "-" = stdout
  std::string metrics_listen = "127.0.0.1:9477";  // "" = no endpoint
  std::string metrics_textfile;                   // "" = none
  std::string control_socket;                     // "" = none
  unsigned max_map_series = 1000;                 // exported keys per map and domain
  std::size_t max_map_keys = 4096;                // keys a map holds per domain (xenprobe::Limits)
  std::vector<ProgramConfig> programs;
};

// A configuration that cannot be used: the whole message, "FILE:LINE:COL: error: WHY" first.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads, parses and checks `path` (program files are relative to its directory). Throws
// ConfigError.
Config load_config(const std::string& path);
// The same from text already read (`path` names it in messages and anchors program files).
Config parse_config(const std::string& text, const std::string& path);

// xenprobe's async planner (xenprobe::plan_async) for a program of the daemon: its refusal is
// the same ProgramError, in the daemon's words (the method key instead of xenprobe's --method).
std::vector<xenprobe::AsyncPlan> plan_async_program(xenprobe::Compiled&);

// Splits "HOST:PORT" ("127.0.0.1:9477", "[::1]:9477"); nullopt if malformed.
struct ListenAddress {
  std::string host;
  int port = 0;
};
std::optional<ListenAddress> parse_listen(const std::string&);

}  // namespace xenprobesd

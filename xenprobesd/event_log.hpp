// The NDJSON event log: one JSON object per line, on stdout or in a file that is reopened on
// SIGHUP and SIGUSR1 (logrotate's "move, then signal"). The record shape and its mapping onto
// OpenTelemetry's log data model are in docs/xenprobesd.md.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace xenprobesd {

class EventLog {
 public:
  EventLog() = default;
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // "-" is stdout. Returns "" or why the file cannot be opened (the old one stays in use).
  std::string open(const std::string& where);
  std::string reopen() { return open(where_); }
  const std::string& where() const { return where_; }

  // Writes one record: time fields, then `kind` and `severity`, then `fields` in order.
  // Strings from guests have already had their bytes that are not UTF-8 replaced.
  void write(const char* kind, const char* severity, const nlohmann::ordered_json& fields);
  std::uint64_t written() const { return written_; }
  std::uint64_t failed() const { return failed_; }

 private:
  std::FILE* f_ = nullptr;
  bool owned_ = false;
  std::string where_;
  std::uint64_t written_ = 0, failed_ = 0;
};

}  // namespace xenprobesd

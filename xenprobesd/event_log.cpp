// The NDJSON event log (event_log.hpp).
#include "event_log.hpp"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace xenprobesd {

EventLog::~EventLog() {
  if (owned_ && f_) std::fclose(f_);
}

std::string EventLog::open(const std::string& where) {
  std::FILE* f = nullptr;
  bool owned = false;
  if (where == "-") {
    f = stdout;
  } else {
    // Appended to, created 0640 (the log may name what guests do), never a terminal's
    // controlling side effect, closed on exec.
    int fd = ::open(where.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);
    if (fd < 0) return "cannot open the event log " + where + ": " + std::strerror(errno);
    f = ::fdopen(fd, "a");
    if (!f) {
      std::string why = std::strerror(errno);
      ::close(fd);
      return "cannot open the event log " + where + ": " + why;
    }
    owned = true;
  }
  if (owned_ && f_) std::fclose(f_);
  f_ = f;
  owned_ = owned;
  where_ = where;
  return {};
}

void EventLog::write(const char* kind, const char* severity, const nlohmann::ordered_json& fields) {
  if (!f_) return;
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm utc{};
  gmtime_r(&ts.tv_sec, &utc);
  char iso[64];
  std::snprintf(iso, sizeof iso, "%04d-%02d-%02dT%02d:%02d:%02d.%09ldZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<long>(ts.tv_nsec));
  nlohmann::ordered_json rec;
  rec["time"] = iso;
  // A string, as OTLP/JSON writes 64-bit integers: a JavaScript consumer loses no digits.
  rec["time_unix_nano"] = std::to_string(static_cast<unsigned long long>(ts.tv_sec) * 1000000000ULL +
                                         static_cast<unsigned long long>(ts.tv_nsec));
  rec["kind"] = kind;
  rec["severity"] = severity;
  for (auto it = fields.begin(); it != fields.end(); ++it) rec[it.key()] = it.value();
  std::string line = rec.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  line += '\n';
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0) ++failed_;
  else ++written_;
}

}  // namespace xenprobesd

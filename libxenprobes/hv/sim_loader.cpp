// libxenprobes.so's side of the simulated Xen (hv/sim_entry.hpp): the public functions of
// include/xenprobes/sim.hpp, each handing over to libxenprobes-sim.so, which is loaded with
// dlopen() the first time one of them needs it and stays loaded for the life of the process.
// Where it is looked for, in this order:
//
//  1. XENPROBES_SIM_LIBRARY, when set (read with secure_getenv): that file and nothing else;
//  2. beside libxenprobes.so itself (what `cmake --install` and the build tree both give);
//  3. the dynamic linker's search (LD_LIBRARY_PATH, ld.so.cache, the system directories).
//
// A library that is missing, cannot load (Unicorn absent) or comes from another build is an
// error naming the file and what to do; nothing else of libxenprobes.so depends on it. The
// static libraries the tests link (xp_hv_sim) hold the simulation itself instead of this file.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "common/result.hpp"
#include "hv/sim_entry.hpp"
#include "sim_build.h"

namespace xenprobes::hv::sim {
namespace {

struct Loaded {
  const SimEntry* entry = nullptr;
  std::string error;  // why entry is null
};

// The folder libxenprobes.so was loaded from ("" if the dynamic linker cannot say).
std::string own_dir() {
  Dl_info info{};
  if (!::dladdr(reinterpret_cast<void*>(&own_dir), &info) || !info.dli_fname) return "";
  std::string path = info.dli_fname;
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::string dl_error() {
  const char* e = ::dlerror();
  return e ? e : "unknown dlopen error";
}

Loaded cannot_load(const std::string& name, const std::string& why) {
  std::string hint =
      why.find("unicorn") != std::string::npos ? " (the simulated Xen needs Unicorn 2: Debian's libunicorn2)" : "";
  return {nullptr, "cannot load " + name + ": " + why + hint};
}

// Checks the table of the library `h` (opened as `name`); closes it unless it is the one.
Loaded check_library(void* h, const std::string& name) {
  auto* entry_fn = reinterpret_cast<const SimEntry* (*)()>(::dlsym(h, XENPROBES_SIM_ENTRY_SYMBOL));
  const SimEntry* e = entry_fn ? entry_fn() : nullptr;
  if (!e) {
    ::dlclose(h);
    return {nullptr, name + " is no libxenprobes-sim: it has no " XENPROBES_SIM_ENTRY_SYMBOL};
  }
  if (std::strcmp(e->version, XENPROBES_VERSION_STRING) != 0 || std::strcmp(e->build, XENPROBES_SIM_BUILD) != 0) {
    std::string why = std::string("libxenprobes-sim ") + e->version + " (build " + e->build + ", " + name +
                      ") does not match libxenprobes " XENPROBES_VERSION_STRING " (build " XENPROBES_SIM_BUILD
                      "): install the two from one build";
    ::dlclose(h);
    return {nullptr, why};
  }
  return {e, ""};  // the handle is kept: the simulation's code runs until the process exits
}

Loaded open_path(const std::string& path) {
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return cannot_load(path, dl_error());
  return check_library(h, path);
}

Loaded find_library() {
  if (const char* path = ::secure_getenv("XENPROBES_SIM_LIBRARY"); path && *path) {
    if (::access(path, F_OK) != 0) return {nullptr, std::string("XENPROBES_SIM_LIBRARY=") + path + ": no such file"};
    return open_path(path);
  }
  std::string dir = own_dir();
  if (!dir.empty()) {
    std::string beside = dir + "/" XENPROBES_SIM_SONAME;
    if (::access(beside.c_str(), F_OK) == 0) return open_path(beside);
  }
  if (void* h = ::dlopen(XENPROBES_SIM_SONAME, RTLD_NOW | RTLD_LOCAL)) return check_library(h, XENPROBES_SIM_SONAME);
  std::string why = dl_error();
  if (why.find(XENPROBES_SIM_SONAME) == std::string::npos)  // found, but it does not load
    return cannot_load(XENPROBES_SIM_SONAME, why);
  return {nullptr, "the simulated Xen is not installed: " XENPROBES_SIM_SONAME " is neither beside libxenprobes (" +
                       (dir.empty() ? std::string("?") : dir) +
                       ") nor on the library search path. It is built and installed with libxenprobes "
                       "(cmake --install; a distribution ships it as libxenprobes-sim); "
                       "XENPROBES_SIM_LIBRARY may name the file"};
}

const Loaded& loaded() {
  static const Loaded l = find_library();
  return l;
}

const SimEntry& entry_or_throw() {
  const Loaded& l = loaded();
  if (!l.entry) throw std::runtime_error(l.error);
  return *l.entry;
}

}  // namespace

std::shared_ptr<SimHost> SimHost::create(SimOptions o) { return entry_or_throw().create(std::move(o)); }

SimHost* sim_host_of(Hypervisor& h) {
  // No library loaded, no simulated handle: a real Xen's handle never loads the simulation.
  if (h.name() != "sim") return nullptr;
  const Loaded& l = loaded();
  return l.entry ? l.entry->host_of(h) : nullptr;
}

std::string default_guest_dir() { return entry_or_throw().guest_dir(); }

const char* op_name(Op op) { return entry_or_throw().op_name(op); }

Result<std::unique_ptr<Hypervisor>> open_default_sim() {
  const Loaded& l = loaded();
  if (!l.entry) return fail(Errc::NotSupported, l.error);
  return l.entry->open_default();
}

}  // namespace xenprobes::hv::sim

/*
 * Types for xenprobe's BTF tests, compiled with clang -target bpf -g into an object whose .BTF
 * section libbpf reads like a kernel's. Two groups:
 *  - the demo guest's own structures (guest/demo.c, guest/demo_abi.h), laid out as the guest
 *    lays them out, so casts and field reads run against the simulated guest's memory;
 *  - a few Linux structures with the fields the docs' examples use (struct file ... qstr,
 *    task_struct with comm/pid/tgid, the per-CPU current_task), for the checker.
 */
#include <stdint.h>

#include "demo_abi.h"

struct demo_file {
  const char *path;
  const char *data;
  uint32_t size;
  uint32_t mode;
};

struct qstr {
  union {
    struct {
      uint32_t hash;
      uint32_t len;
    };
    uint64_t hash_len;
  };
  const unsigned char *name;
};
struct dentry {
  unsigned int d_flags;
  struct qstr d_name;
};
struct path {
  void *mnt;
  struct dentry *dentry;
};
struct file {
  void *f_u;
  struct path f_path;
  unsigned int f_flags : 4; /* a bitfield: refused with a message */
};
struct task_struct {
  long state;
  int pid;
  int tgid;
  char comm[16];
};

/* Variables make clang emit the types. */
struct demo_file btf_demo_file;
struct demo_stats btf_demo_stats;
struct file btf_file;
struct dentry btf_dentry; /* a type only pointed to would be a forward declaration */
struct task_struct btf_task;
__attribute__((section(".data..percpu"))) struct task_struct *current_task;

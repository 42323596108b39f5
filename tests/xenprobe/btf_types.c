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
  unsigned int f_flags : 4; /* a bitfield */
};
/* Bitfields in one 4-byte unit, one across a byte boundary, one in an 8-byte unit that
 * starts inside a byte, signed ones (builtins_test.cpp reads them against the same struct
 * compiled for the host). */
struct demo_bits {
  uint32_t lo : 3;
  uint32_t mid : 9;
  int32_t neg : 5;
  uint64_t wide : 40;
  int64_t swide : 33;
  uint8_t byte;
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
struct demo_bits btf_demo_bits;
__attribute__((section(".data..percpu"))) struct task_struct *current_task;

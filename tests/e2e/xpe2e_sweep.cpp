// xpe2e-probe sweep: the real-kernel sweep of issue 12 ("And a real-kernel sweep"), the Dom0
// side of tools/e2e/scenarios/stock_pv_sweep.sh (docs/e2e.md "The real-kernel sweep").
//
//   xpe2e-probe sweep --domid D [--channel guest] [--batch N] [--cap N] [--per-area N]
//                     [--max-fn-bytes N] [--min-functions N] [--round-limit S] [--hot-limit S]
//                     [--console FILE] [--only F1,F2,...]
//
// Takes the kernel functions of kAreas (a fixed list by name over mm, fs, sched, net, locking,
// RCU and the syscall paths; each name looked up in the guest's symbols, those absent or larger
// than --max-fn-bytes are left out and said so), decodes each one from the running guest's text
// (Capstone, from the function's first byte to the next symbol), and asks the library for a
// probe on every instruction, --batch instructions at a time. Each registration either gives a
// probe (counted by the mode the library chose, and as "moved" when it went elsewhere) or is
// refused (counted by the rule the refusal names: `rule '<name>'`, or the instruction rule's
// reason). The batch's probes stay armed while the guest runs one round of its mixed workload
// (xpe2e-workload safety, phase "sweep": exact numbers of getppid, getsid, fsync and listen
// calls, fork+exec churn, file I/O, TCP and UDP over 127.0.0.1, the function tracer and two
// tracepoints on and off); then they are unregistered and every function of the batch must be
// byte-identical to the snapshot taken before. Four probes on the counted syscalls' entries stay
// for the whole sweep and must count exactly what every round reports. A probe whose handler
// ran --cap times is unregistered at once (the time bound on hot functions: under TCG each hit
// costs ~0.4 ms); a round still running --hot-limit seconds after it started loses every sweep
// probe of its batch (said so). After every batch: the guest alive, no timeouts in the guest
// module, and its console (--console) without an oops, WARN, BUG, lockup or stall line.
// Prints "XPE2E-SWEEP ..." lines: one per batch, per area, per mode and per rule.
#include <capstone/capstone.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "xenprobes/guest_view.hpp"
#include "xenprobes/protocol.h"
#include "xenprobes/xenprobes.hpp"
#include "xpe2e_common.hpp"

using namespace xenprobes;
using namespace xpe2e;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The functions, by area. Chosen by name (the guest's kallsyms has no file names) from the
// source areas issue 12 names; a name absent from the guest's symbols is skipped and reported.
// Hot paths are in on purpose (schedule, the spin locks, kmalloc/kfree, the RCU core): --cap
// bounds what they cost.
struct Area {
  const char* name;
  std::vector<const char*> functions;
};
const std::vector<Area> kAreas = {
    {"mm",
     {
         "handle_mm_fault",
         "__handle_mm_fault",
         "do_wp_page",
         "wp_page_copy",
         "do_fault",
         "filemap_map_pages",
         "filemap_fault",
         "filemap_get_pages",
         "filemap_read",
         "__filemap_get_folio",
         "folio_mark_accessed",
         "folio_add_lru",
         "lru_add_fn",
         "lru_cache_add_inactive_or_unevictable",
         "__alloc_pages",
         "get_page_from_freelist",
         "rmqueue_bulk",
         "free_unref_page",
         "free_unref_page_list",
         "__free_pages",
         "__folio_put",
         "release_pages",
         "kmem_cache_alloc",
         "kmem_cache_free",
         "__kmalloc",
         "kfree",
         "kmalloc_trace",
         "__kmem_cache_alloc_node",
         "__kmem_cache_free",
         "___slab_alloc",
         "__slab_free",
         "vma_merge",
         "vma_expand",
         "__vma_adjust",
         "find_vma",
         "vma_link",
         "do_mmap",
         "mmap_region",
         "unmap_region",
         "unmap_vmas",
         "unmap_page_range",
         "free_pgtables",
         "copy_page_range",
         "dup_mmap",
         "exit_mmap",
         "mmput",
         "__mmput",
         "do_brk_flags",
         "__x64_sys_brk",
         "__x64_sys_mmap",
         "ksys_mmap_pgoff",
         "__x64_sys_munmap",
         "__x64_sys_mprotect",
         "mprotect_fixup",
         "change_protection",
         "page_add_new_anon_rmap",
         "page_remove_rmap",
         "page_add_file_rmap",
         "anon_vma_fork",
         "anon_vma_clone",
         "unlink_anon_vmas",
         "__anon_vma_prepare",
         "shmem_get_folio_gfp",
         "shmem_write_begin",
         "shmem_write_end",
         "shmem_file_read_iter",
         "shmem_add_to_page_cache",
         "shmem_undo_range",
         "generic_perform_write",
         "vm_area_alloc",
         "vm_area_free",
         "vm_area_dup",
         "pte_alloc_one",
         "__pte_alloc",
         "__pmd_alloc",
         "set_pte_vaddr",
         "follow_page_mask",
         "__get_user_pages",
         "get_user_pages_remote",
         "vmalloc",
         "__vmalloc_node_range",
         "vfree",
         "__vunmap",
         "alloc_vmap_area",
         "mark_page_accessed",
         "truncate_inode_pages_range",
         "delete_from_page_cache_batch",
         "filemap_add_folio",
         "__filemap_add_folio",
         "balance_dirty_pages_ratelimited_flags",
         "__folio_mark_dirty",
         "mm_init",
         "mm_alloc",
         "__mm_populate",
         "populate_vma_page_range",
         // Debian 13's 6.12 names (absent from 6.1, or over --max-fn-bytes there): the
         // allocators' _noprof entry points (memory allocation profiling) and the folio rmap.
         "vmalloc_noprof",
         "__vmalloc_node_noprof",
         "folio_alloc_noprof",
         "__folio_alloc_noprof",
         "folio_add_file_rmap_ptes",
         "folio_remove_rmap_ptes",
         "__folio_batch_release",
         "__lruvec_stat_mod_folio",
         "mmap_region",
     }},
    {"fs",
     {
         "vfs_read",
         "vfs_write",
         "ksys_read",
         "ksys_write",
         "__x64_sys_read",
         "__x64_sys_write",
         "do_sys_openat2",
         "do_filp_open",
         "path_openat",
         "walk_component",
         "lookup_fast",
         "__lookup_slow",
         "d_alloc_parallel",
         "__d_lookup_rcu",
         "__d_lookup",
         "d_alloc",
         "__d_alloc",
         "dput",
         "dget_parent",
         "step_into",
         "terminate_walk",
         "path_init",
         "complete_walk",
         "vfs_open",
         "do_dentry_open",
         "alloc_empty_file",
         "__alloc_file",
         "fput",
         "__fput",
         "____fput",
         "filp_close",
         "__close_fd_get_file",
         "close_fd",
         "__x64_sys_close",
         "alloc_fd",
         "fd_install",
         "__fget_light",
         "__fdget_pos",
         "__f_unlock_pos",
         "getname",
         "getname_flags",
         "putname",
         "do_unlinkat",
         "vfs_unlink",
         "do_renameat2",
         "vfs_rename",
         "vfs_create",
         "do_mkdirat",
         "vfs_mkdir",
         "vfs_fsync_range",
         "__x64_sys_fsync",
         "vfs_fstat",
         "vfs_statx",
         "do_statx",
         "cp_new_stat",
         "__do_sys_newfstat",
         "__do_sys_newstat",
         "__x64_sys_newfstatat",
         "vfs_getattr",
         "generic_fillattr",
         "iput",
         "evict",
         "new_inode",
         "alloc_inode",
         "inode_init_always",
         "file_close_fd",  // 6.12's name for 6.1's __close_fd_get_file
         "touch_atime",
         "atime_needs_update",
         "file_update_time",
         "generic_file_write_iter",
         "__generic_file_write_iter",
         "generic_write_checks",
         "file_remove_privs",
         "simple_lookup",
         "simple_unlink",
         "dcache_readdir",
         "iterate_dir",
         "__x64_sys_getdents64",
         "filldir64",
         "seq_read",
         "seq_read_iter",
         "seq_printf",
         "single_open",
         "proc_reg_read_iter",
         "__x64_sys_lseek",
         "ksys_lseek",
         "default_llseek",
         "pipe_read",
         "pipe_write",
         "do_pipe2",
         "create_pipe_files",
         "__x64_sys_pipe2",
         "do_sys_poll",
         "__x64_sys_poll",
         "do_select",
         "core_sys_select",
         "__x64_sys_pselect6",
         "do_epoll_wait",
         "do_epoll_ctl",
         "__x64_sys_dup2",
         "ksys_dup3",
         "do_dup2",
         "do_fcntl",
         "__x64_sys_fcntl",
     }},
    {"sched",
     {
         "schedule",
         "__schedule",
         "pick_next_task_fair",
         "put_prev_task_fair",
         "enqueue_task_fair",
         "dequeue_task_fair",
         "update_curr",
         "update_load_avg",
         "__update_load_avg_se",
         "__update_load_avg_cfs_rq",
         "enqueue_entity",
         "dequeue_entity",
         "set_next_entity",
         "pick_next_entity",
         "check_preempt_wakeup",
         "try_to_wake_up",
         "wake_up_process",
         "ttwu_do_activate",
         "activate_task",
         "deactivate_task",
         "select_task_rq_fair",
         "wake_up_new_task",
         "sched_fork",
         "sched_post_fork",
         "sched_cgroup_fork",
         "scheduler_tick",
         "task_tick_fair",
         "resched_curr",
         "schedule_timeout",
         "schedule_hrtimeout_range_clock",
         "do_nanosleep",
         "hrtimer_nanosleep",
         "__x64_sys_nanosleep",
         "__x64_sys_clock_nanosleep",
         "__x64_sys_sched_yield",
         "do_sched_yield",
         "yield_task_fair",
         "__wake_up",
         "__wake_up_common",
         "__wake_up_common_lock",
         "prepare_to_wait",
         "prepare_to_wait_event",
         "finish_wait",
         "autoremove_wake_function",
         "default_wake_function",
         "wait_woken",
         "woken_wake_function",
         "complete",
         "wait_for_completion",
         "do_wait",
         "kernel_wait4",
         "__x64_sys_wait4",
         "wait_consider_task",
         "release_task",
         "do_exit",
         "do_group_exit",
         "__x64_sys_exit_group",
         "kernel_clone",
         "copy_process",
         "__x64_sys_clone",
         "__x64_sys_vfork",
         "sched_exec",
         "set_task_cpu",
         "migrate_task_rq_fair",
         "update_rq_clock",
         "hrtick_update",
         "idle_cpu",
         "available_idle_cpu",
         "cpuacct_charge",
         "account_user_time",
         "account_system_time",
         "__sched_setscheduler",
         "sched_setaffinity",
         "__x64_sys_sched_setaffinity",
         "__x64_sys_sched_getaffinity",
         "task_fork_fair",
         "place_entity",
         "reweight_entity",
         "update_cfs_group",
         "attach_entity_load_avg",
         "detach_entity_load_avg",
         "load_balance",
         "find_busiest_group",
     }},
    {"net",
     {
         "sock_sendmsg",
         "sock_recvmsg",
         "__sys_sendto",
         "__sys_recvfrom",
         "__x64_sys_sendto",
         "__x64_sys_recvfrom",
         "__sys_socket",
         "__x64_sys_socket",
         "sock_create",
         "__sock_create",
         "inet_create",
         "__sys_bind",
         "__x64_sys_bind",
         "inet_bind",
         "__inet_bind",
         "__sys_listen",
         "__x64_sys_listen",
         "inet_listen",
         "inet_csk_listen_start",
         "__sys_accept4",
         "do_accept",
         "__x64_sys_accept4",
         "inet_accept",
         "inet_csk_accept",
         "__sys_connect",
         "__x64_sys_connect",
         "inet_stream_connect",
         "__inet_stream_connect",
         "tcp_v4_connect",
         "tcp_connect",
         "tcp_sendmsg",
         "tcp_sendmsg_locked",
         "tcp_recvmsg",
         "tcp_recvmsg_locked",
         "tcp_push",
         "__tcp_push_pending_frames",
         "tcp_write_xmit",
         "__tcp_transmit_skb",
         "tcp_v4_rcv",
         "tcp_v4_do_rcv",
         "tcp_rcv_established",
         "tcp_rcv_state_process",
         "tcp_ack",
         "tcp_data_queue",
         "tcp_event_data_recv",
         "tcp_close",
         "__tcp_close",
         "tcp_fin",
         "tcp_set_state",
         "tcp_time_wait",
         "inet_release",
         "sock_close",
         "__sock_release",
         "ip_queue_xmit",
         "__ip_queue_xmit",
         "ip_local_out",
         "__ip_local_out",
         "ip_output",
         "ip_finish_output",
         "ip_finish_output2",
         "ip_rcv",
         "ip_rcv_finish",
         "ip_local_deliver",
         "ip_local_deliver_finish",
         "ip_protocol_deliver_rcu",
         "__netif_receive_skb_one_core",
         "netif_rx",
         "__netif_rx",
         "process_backlog",
         "net_rx_action",
         "__dev_queue_xmit",
         "dev_hard_start_xmit",
         "loopback_xmit",
         "__alloc_skb",
         "kfree_skb_reason",
         "consume_skb",
         "skb_release_data",
         "__kfree_skb",
         "skb_clone",
         "tcp_stream_alloc_skb",
         "sock_def_readable",
         "sk_wait_data",
         "lock_sock_nested",
         "release_sock",
         "__release_sock",
         "sk_reset_timer",
         "tcp_rcv_space_adjust",
         "tcp_cleanup_rbuf",
         "udp_sendmsg",
         "udp_recvmsg",
         "__udp4_lib_rcv",
         "udp_rcv",
         "inet_sendmsg",
         "inet_recvmsg",
     }},
    {"locking",
     {
         "mutex_lock",
         "mutex_unlock",
         "mutex_trylock",
         "__mutex_lock_slowpath",
         "mutex_lock_interruptible",
         "down_read",
         "down_write",
         "up_read",
         "up_write",
         "down_read_trylock",
         "down_write_trylock",
         "rwsem_down_read_slowpath",
         "rwsem_down_write_slowpath",
         "_raw_spin_lock",
         "_raw_spin_unlock",
         "_raw_spin_lock_irqsave",
         "_raw_spin_unlock_irqrestore",
         "_raw_spin_lock_irq",
         "_raw_spin_unlock_irq",
         "_raw_spin_lock_bh",
         "_raw_spin_unlock_bh",
         "_raw_spin_trylock",
         "_raw_read_lock",
         "_raw_read_unlock",
         "_raw_write_lock",
         "_raw_write_unlock",
         "_raw_write_lock_irq",
         "native_queued_spin_lock_slowpath",
         "queued_read_lock_slowpath",
         "queued_write_lock_slowpath",
         "__pv_queued_spin_lock_slowpath",
         "__pv_queued_spin_unlock_slowpath",
         "down",
         "up",
         "down_interruptible",
         "down_trylock",
         "__down",
         "percpu_down_write",
         "percpu_up_write",
         "__percpu_down_read",
         "osq_lock",
         "osq_unlock",
         "mutex_spin_on_owner",
         "rt_mutex_lock",
         "rt_mutex_unlock",
         "ww_mutex_lock",
         "ww_mutex_unlock",
         "lockref_get",
         "lockref_get_not_zero",
         "lockref_put_return",
         "lockref_get_not_dead",
         "lockref_put_or_lock",
         "lockref_mark_dead",
         "_atomic_dec_and_lock",
         "refcount_dec_and_lock",
         "refcount_dec_and_mutex_lock",
         "refcount_dec_not_one",
         "refcount_warn_saturate",
         "__init_rwsem",
         "__mutex_init",
         "__init_waitqueue_head",
     }},
    {"rcu",
     {
         "__rcu_read_lock",
         "__rcu_read_unlock",
         "rcu_read_unlock_special",
         "synchronize_rcu",
         "synchronize_rcu_expedited",
         "call_rcu",
         "kfree_rcu_monitor",
         "kvfree_call_rcu",
         "rcu_note_context_switch",
         "rcu_sched_clock_irq",
         "rcu_core",
         "rcu_core_si",
         "rcu_gp_kthread",
         "rcu_gp_init",
         "rcu_gp_cleanup",
         "rcu_gp_fqs_loop",
         "rcu_report_qs_rnp",
         "rcu_accelerate_cbs",
         "rcu_do_batch",
         "rcu_segcblist_enqueue",
         "rcu_segcblist_accelerate",
         "rcu_segcblist_advance",
         "rcu_segcblist_extract_done_cbs",
         "rcu_segcblist_insert_done_cbs",
         "rcu_cblist_dequeue",
         "note_gp_changes",
         "__note_gp_changes",
         "rcu_needs_cpu",
         "rcu_nocb_flush_deferred_wakeup",
         "rcu_barrier",
         "rcu_exp_wait_wake",
         "rcu_momentary_dyntick_idle",
         "rcu_momentary_eqs",  // 6.12's name for it
         "rcu_is_watching",
         "rcu_preempt_deferred_qs",
         "rcu_softirq_qs",
         "rcu_gp_is_expedited",
         "rcu_start_this_gp",
         "kfree_rcu_work",
         "synchronize_rcu_tasks",
         "call_rcu_tasks",
         "rcu_tasks_kthread",
         "rcu_tasks_wait_gp",
         "rcu_tasks_pregp_step",
         "rcu_tasks_postgp",
         "rcu_spawn_tasks_kthread_generic",
         "rcu_sync_enter",
         "rcu_sync_exit",
         "rcu_sync_func",
         "call_srcu",
         "synchronize_srcu",
         "__srcu_read_lock",
         "__srcu_read_unlock",
         "srcu_gp_start",
         "process_srcu",
         "srcu_invoke_callbacks",
         "rcu_cpu_kthread",
         "get_state_synchronize_rcu",
         "poll_state_synchronize_rcu",
         "start_poll_synchronize_rcu",
         "cond_synchronize_rcu",
     }},
    {"syscall",
     {
         "__x64_sys_getppid",
         "__x64_sys_getpid",
         "__x64_sys_gettid",
         "__x64_sys_getuid",
         "__x64_sys_geteuid",
         "__x64_sys_getgid",
         "__x64_sys_getegid",
         "__x64_sys_getsid",
         "__x64_sys_getpgid",
         "__x64_sys_setpgid",
         "__x64_sys_umask",
         "__x64_sys_uname",
         "__x64_sys_newuname",
         "__x64_sys_sysinfo",
         "__x64_sys_getrusage",
         "getrusage",
         "__x64_sys_times",
         "do_sys_times",
         "__x64_sys_gettimeofday",
         "__x64_sys_time",
         "__x64_sys_clock_gettime",
         "posix_get_monotonic_timespec",
         "__x64_sys_getcwd",
         "__x64_sys_chdir",
         "__x64_sys_fchdir",
         "__x64_sys_kill",
         "kill_something_info",
         "__x64_sys_rt_sigaction",
         "do_sigaction",
         "__x64_sys_rt_sigprocmask",
         "sigprocmask",
         "__x64_sys_rt_sigreturn",
         "__x64_sys_prctl",
         "__x64_sys_arch_prctl",
         "__x64_sys_set_tid_address",
         "__x64_sys_getrandom",
         "__x64_sys_ioctl",
         "do_vfs_ioctl",
         "__x64_sys_access",
         "do_faccessat",
         "__x64_sys_readlink",
         "do_readlinkat",
         "__x64_sys_execve",
         "bprm_execve",
         "load_elf_binary",
         "begin_new_exec",
         "setup_arg_pages",
         "__x64_sys_exit",
         "__x64_sys_getrlimit",
         "__x64_sys_prlimit64",
         "do_prlimit",
         "__x64_sys_setrlimit",
         "__x64_sys_getpriority",
         "__x64_sys_setpriority",
         "__x64_sys_getcpu",
         "__x64_sys_sched_getparam",
         "__x64_sys_getgroups",
         "__x64_sys_capget",
         "syscall_exit_to_user_mode",
         "do_syscall_64",
         "exit_to_user_mode_prepare",
         "__x64_sys_futex",
         "do_futex",
         "futex_wait",
         "futex_wake",
         "__x64_sys_alarm",
         "__x64_sys_pause",
         "__x64_sys_dup",
         "__x64_sys_sync",
         "ksys_sync",
         "__x64_sys_mkdir",
         "__x64_sys_rmdir",
         "__x64_sys_unlink",
         "__x64_sys_rename",
         "__x64_sys_openat",
         "__x64_sys_open",
         "__x64_sys_pread64",
         "__x64_sys_pwrite64",
         "__x64_sys_readv",
         "__x64_sys_writev",
         "do_readv",
         "do_writev",
     }},
};

// The syscalls the guest's round makes an exact number of times, and the result key for each.
struct Counted {
  const char* function;
  const char* key;
};
constexpr Counted kCounted[] = {
    {"__x64_sys_getppid", "getppid"},
    {"__x64_sys_getsid", "getsid"},
    {"__x64_sys_fsync", "fsync"},
    {"__x64_sys_listen", "listen"},
};

struct Args {
  DomId dom{0};
  std::string channel = "guest";
  unsigned batch = 1000;             // instructions asked for per batch (the module's trap table: 2048)
  unsigned cap = 5;                  // handler calls before a probe is unregistered
  unsigned per_area = 0;             // 0: every function of the list
  std::uint64_t max_fn_bytes = 256;  // bounds the sweep's time: see docs/e2e.md
  unsigned min_functions = 300;
  int round_limit = 240;  // the guest's limit for one round
  int hot_limit = 60;     // seconds into a round before the batch's probes go
  std::string console;    // the DomU's console log (xenconsoled)
  std::string only;       // comma-separated names: only these functions (to bisect a failure)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) fatal("option " + k + " needs a value");
    std::string v = argv[++i];
    if (k == "--domid") a.dom = DomId{static_cast<std::uint32_t>(std::stoul(v))};
    else if (k == "--channel") a.channel = v;
    else if (k == "--batch") a.batch = static_cast<unsigned>(std::stoul(v));
    else if (k == "--cap") a.cap = static_cast<unsigned>(std::stoul(v));
    else if (k == "--per-area") a.per_area = static_cast<unsigned>(std::stoul(v));
    else if (k == "--max-fn-bytes") a.max_fn_bytes = std::stoull(v);
    else if (k == "--min-functions") a.min_functions = static_cast<unsigned>(std::stoul(v));
    else if (k == "--round-limit") a.round_limit = std::stoi(v);
    else if (k == "--hot-limit") a.hot_limit = std::stoi(v);
    else if (k == "--console") a.console = v;
    else if (k == "--only") a.only = "," + v + ",";
    else if (k == "--timeout")
      ;  // accepted for the harness's common options; --round-limit bounds a round
    else fatal("unknown option " + k);
  }
  if (!a.dom.value) fatal("--domid is required");
  if (a.batch == 0 || a.cap == 0) fatal("--batch and --cap must be at least 1");
  return a;
}

// Every line of the console from `*offset` on that a hurt kernel prints (scenarios/lib.sh's
// KERNEL_BAD_RE, plus the lockup and stall reports).
std::vector<std::string> console_bad(const std::string& path, std::streamoff* offset) {
  static const std::regex bad(
      "BUG:|Oops|WARNING:|general protection|kernel BUG|panic|soft lockup|hard LOCKUP|rcu_(sched|preempt) "
      "(self-)?detected stall|detected stalls on CPUs|self-detected stall|blocked for more than|ftrace failed to "
      "modify|jump_label: Fatal|unexpected static_call");
  std::vector<std::string> out;
  if (path.empty()) return out;
  std::ifstream in(path);
  if (!in) return out;
  in.seekg(*offset);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("XPE2E-SWEEP-ROUND") != std::string::npos) say("XPE2E-INFO: guest: %s", line.c_str());
    if (line.rfind("XPE2E-", 0) != 0 && std::regex_search(line, bad)) out.push_back(line);
    if (in.tellg() >= 0) *offset = in.tellg();
  }
  in.clear();
  in.seekg(0, std::ios::end);
  *offset = in.tellg();
  return out;
}

struct Function {
  std::string area, name;
  Gva start;
  std::uint64_t size = 0;
  std::vector<std::uint64_t> insns;  // instruction addresses, decoded from the guest's text
  std::vector<std::byte> text;       // the snapshot of the batch it is probed in
  bool undecodable_tail = false;     // Capstone stopped before the end
};

struct Point {
  std::size_t fn = 0;
  Gva at;
  Probe probe;
  std::uint64_t hits = 0;
  bool capped = false;
  bool counted = false;  // a counted syscall's entry: never capped
};

struct Tally {
  std::map<std::string, std::uint64_t> accepted;  // by mode, "moved" apart
  std::map<std::string, std::uint64_t> refused;   // by rule
  std::map<std::string, std::string> example;     // one refusal message per rule
  std::map<std::string, std::uint64_t> area_insns, area_accepted, area_functions, area_hit;
  std::uint64_t capped = 0, hits = 0, points = 0, hot_dropped = 0;
};

class Sweep {
 public:
  Sweep(const Args& a, Session& s) : a_(a), s_(s), hv_(s.hypervisor()) {}

  int run();

 private:
  bool select_functions();
  void register_counted();
  std::optional<std::string> round(int phase, const std::string& tag, std::deque<Point>* batch, double* hot_at);
  void cap_pending();
  void unregister(std::deque<Point>& pts, const std::string& tag);
  bool after_batch(const std::string& tag, const std::optional<std::string>& res, std::size_t fn_from,
                   std::size_t fn_to);
  void serve(int ms);

  const Args& a_;
  Session& s_;
  hv::Hypervisor& hv_;
  std::vector<Function> fns_;
  std::deque<Point> counted_;
  std::vector<Point*> to_cap_;
  std::map<std::string, std::uint64_t> counted_before_;
  Tally t_;
  std::streamoff console_off_ = 0;
  std::vector<std::string> pending_bad_;  // bad console lines seen while a round ran
  double cap_max_s_ = 0, run_max_s_ = 0;  // the longest cap_pending() (the domain paused) and run_once() with hits
  int phase_ = 0;
  bool dead_ = false;
};

void Sweep::serve(int ms) {
  auto t0 = Clock::now();
  auto r = s_.run_once(ms);
  run_max_s_ = std::max(run_max_s_, since(t0) - ms / 1000.0);
  if (!r) say("XPE2E-INFO: run_once: %s", r.error().what.c_str());
  cap_pending();
}

// Probes whose handler reached the cap: unregistered together (one pause of the domain).
void Sweep::cap_pending() {
  if (to_cap_.empty()) return;
  std::vector<Point*> now;
  now.swap(to_cap_);
  auto t0 = Clock::now();
  (void)s_.begin_batch();
  for (Point* p : now) {
    if (!p->probe) continue;
    if (auto r = p->probe.unregister(); !r)
      say("XPE2E-INFO: unregister a capped probe at %#" PRIx64 ": %s", p->at.value, r.error().what.c_str());
    p->capped = true;
    ++t_.capped;
  }
  (void)s_.end_batch();
  cap_max_s_ = std::max(cap_max_s_, since(t0));
}

bool Sweep::select_functions() {
  auto all = must(s_.find_symbols(a_.dom, "*"), "find_symbols(*)");
  std::map<std::string, const SymbolInfo*> by_name;
  for (const auto& y : all)
    if (y.function) by_name.emplace(y.name, &y);
  auto view = must(GuestView::open(hv_, a_.dom), "GuestView::open");
  csh h;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) fatal("cs_open");
  std::set<std::uint64_t> seen;
  for (const auto& ar : kAreas) {
    unsigned taken = 0;
    std::vector<std::string> absent, large;
    for (const char* n : ar.functions) {
      if (a_.per_area && taken >= a_.per_area) break;
      if (!a_.only.empty() && a_.only.find("," + std::string(n) + ",") == std::string::npos) continue;
      auto it = by_name.find(n);
      if (it == by_name.end()) {
        absent.push_back(n);
        continue;
      }
      const SymbolInfo& y = *it->second;
      if (y.size == 0 || y.size > a_.max_fn_bytes) {
        large.push_back(fmt("%s (%" PRIu64 " bytes)", n, y.size));
        continue;
      }
      if (!seen.insert(y.address.value).second) continue;  // an alias of one taken already
      Function f{ar.name, n, y.address, y.size, {}, {}, false};
      std::vector<std::byte> b(y.size);
      for (std::uint64_t off = 0; off < b.size();) {
        std::size_t k = std::min<std::uint64_t>(4096 - ((y.address.value + off) & 4095), b.size() - off);
        must(view->read(Gva{y.address.value + off}, std::span(b).subspan(off, k)), "read the text of " + f.name);
        off += k;
      }
      cs_insn* insn = nullptr;
      std::size_t cnt =
          cs_disasm(h, reinterpret_cast<const std::uint8_t*>(b.data()), b.size(), y.address.value, 0, &insn);
      std::uint64_t end = y.address.value;
      for (std::size_t i = 0; i < cnt; ++i) {
        f.insns.push_back(insn[i].address);
        end = insn[i].address + insn[i].size;
      }
      if (cnt) cs_free(insn, cnt);
      f.undecodable_tail = end != y.address.value + y.size;
      if (f.undecodable_tail)
        say("XPE2E-INFO: %s: Capstone stopped at +%#" PRIx64 " of %" PRIu64 " bytes", f.name.c_str(),
            end - y.address.value, y.size);
      t_.area_functions[ar.name]++;
      t_.area_insns[ar.name] += f.insns.size();
      fns_.push_back(std::move(f));
      ++taken;
    }
    std::string ab, lg;
    for (auto& x : absent) ab += " " + x;
    for (auto& x : large) lg += " " + x;
    say("XPE2E-SWEEP area %s functions=%u absent=%zu%s%s large=%zu%s", ar.name, taken, absent.size(),
        absent.empty() ? "" : ":", ab.c_str(), large.size(), lg.c_str());
  }
  cs_close(&h);
  std::uint64_t insns = 0;
  for (auto& f : fns_) insns += f.insns.size();
  std::string per;
  bool spread = true;
  for (const auto& ar : kAreas) {
    per += fmt(" %s=%" PRIu64, ar.name, t_.area_functions[ar.name]);
    spread &= t_.area_functions[ar.name] >= 20;
  }
  return check("sweep.functions", fns_.size() >= a_.min_functions && (spread || a_.min_functions == 0),
               fmt("%zu functions, %" PRIu64 " instructions (at least %u functions, 20 per area):%s", fns_.size(),
                   insns, a_.min_functions, per.c_str()));
}

// The counted syscalls' entries (asked for by name: the library places them past the ftrace
// site); they stay for the whole sweep, uncapped.
void Sweep::register_counted() {
  for (const auto& c : kCounted) {
    Point& p = counted_.emplace_back();
    p.counted = true;
    Point* pp = &p;
    auto r = s_.probe(a_.dom, std::string_view(c.function), [pp](HitContext&) {
      ++pp->hits;
      return 0;
    });
    if (!r) fatal(fmt("probe on %s: ", c.function) + r.error().what);
    p.probe = std::move(*r);
    auto i = p.probe.info();
    p.at = i ? i->address : Gva{0};
    say("XPE2E-INFO: counted: %s at %#" PRIx64 " (%s)", c.function, p.at.value, i ? i->instruction.c_str() : "?");
  }
}

// Sends the guest round `phase` and serves hits until its result; hot probes are capped as they
// go, and at `hot_limit` seconds every sweep probe of the batch goes.
std::optional<std::string> Sweep::round(int phase, const std::string& tag, std::deque<Point>* batch, double* hot_at) {
  must(hv_.xs_write(dom_path(a_.dom, fmt("data/xpe2e/safety/go-%d", phase)), fmt("sweep %d", a_.round_limit)),
       "write data/xpe2e/safety/go");
  const std::string key = dom_path(a_.dom, fmt("data/xpe2e/safety/result-%d", phase));
  auto t0 = Clock::now(), last_read = t0;
  auto end = t0 + std::chrono::seconds(a_.round_limit + 30);
  *hot_at = -1;
  while (Clock::now() < end) {
    auto t_run = Clock::now();
    auto r = s_.run_once(100);
    if (r && *r > 0) run_max_s_ = std::max(run_max_s_, since(t_run));
    if (!r) say("XPE2E-INFO: run_once: %s", r.error().what.c_str());
    cap_pending();
    if (batch && *hot_at < 0 && since(t0) > a_.hot_limit) {
      *hot_at = since(t0);
      std::size_t armed = 0;
      for (auto& p : *batch) armed += bool(p.probe);
      say("XPE2E-INFO: %s: the round is still running after %.0f s: its %zu armed sweep probes go", tag.c_str(),
          *hot_at, armed);
      t_.hot_dropped += armed;
      unregister(*batch, tag);
    }
    // xenstore only between hits, at most every 0.5 s (a read per hit slows the guest down).
    if (r && *r > 0 && since(last_read) < 0.5) continue;
    last_read = Clock::now();
    if (auto v = hv_.xs_read(key)) {
      serve(0);
      say("XPE2E-INFO: %s: round %.1f s: %s", tag.c_str(), since(t0), v->c_str());
      return *v;
    }
    std::string st;
    if (!domain_alive(hv_, a_.dom, &st)) {
      say("XPE2E-INFO: %s: the domain is not running any more (%s)", tag.c_str(), st.c_str());
      return std::nullopt;
    }
    for (auto& l : console_bad(a_.console, &console_off_)) pending_bad_.push_back(l);
  }
  say("XPE2E-INFO: %s: no result within %d s; %s", tag.c_str(), a_.round_limit + 30,
      describe(ctl_header(hv_, a_.dom)).c_str());
  return std::nullopt;
}

// Unregisters a batch's probes, a pause of the domain per 100, serving hits in between.
void Sweep::unregister(std::deque<Point>& pts, const std::string& tag) {
  std::size_t n = 0, failed = 0;
  std::string first;
  for (auto it = pts.begin(); it != pts.end();) {
    serve(0);
    (void)s_.begin_batch();
    for (unsigned k = 0; k < 100 && it != pts.end(); ++it) {
      if (!it->probe) continue;
      ++k;
      ++n;
      if (auto r = it->probe.unregister(); !r) {
        if (!failed++) first = fmt("%#" PRIx64 ": ", it->at.value) + r.error().what;
      }
    }
    (void)s_.end_batch();
  }
  serve(0);
  if (failed)
    check("sweep." + tag + ".unregister", false, fmt("%zu of %zu failed; first: %s", failed, n, first.c_str()));
}

bool Sweep::after_batch(const std::string& tag, const std::optional<std::string>& res, std::size_t fn_from,
                        std::size_t fn_to) {
  bool ok = true;
  auto m = res ? kv(*res) : std::map<std::string, std::string>{};
  ok &= check("sweep." + tag + ".guest", res && num(m, "ok") == 1,
              res ? "guest: " + *res : "no result from the guest's round");
  // Counts: every counted entry's hits in this round equal the guest's calls.
  std::string cs;
  bool exact = true;
  for (std::size_t k = 0; k < std::size(kCounted); ++k) {
    Point& p = counted_[k];
    std::uint64_t d = p.hits - counted_before_[kCounted[k].key];
    counted_before_[kCounted[k].key] = p.hits;
    long want = num(m, kCounted[k].key);
    exact &= want >= 0 && static_cast<long>(d) == want;
    cs += fmt(" %s %" PRIu64 "/%ld", kCounted[k].key, d, want);
  }
  ok &= check("sweep." + tag + ".counts", exact, "probe hits / the guest's calls:" + cs);
  std::string st;
  bool alive = domain_alive(hv_, a_.dom, &st);
  ok &= check("sweep." + tag + ".alive", alive, st);
  if (!alive) {
    dead_ = true;
    return false;
  }
  // Text: every function of the batch byte-identical to its snapshot.
  auto view = GuestView::open(hv_, a_.dom);
  std::string diff;
  std::size_t same = 0;
  for (std::size_t i = fn_from; i < fn_to && view && diff.empty(); ++i) {
    Function& f = fns_[i];
    std::vector<std::byte> now(f.text.size());
    if (auto r = (*view)->read(f.start, now); !r) {
      diff = f.name + ": " + r.error().what;
      break;
    }
    for (std::size_t k = 0; k < now.size(); ++k)
      if (now[k] != f.text[k]) {
        diff = fmt("%s+0x%zx: %02x, was %02x", f.name.c_str(), k, static_cast<unsigned>(now[k]),
                   static_cast<unsigned>(f.text[k]));
        break;
      }
    if (diff.empty()) ++same;
  }
  if (!view) diff = "GuestView::open: " + view.error().what;
  ok &= check("sweep." + tag + ".text", diff.empty(),
              diff.empty() ? fmt("%zu functions byte-identical to their snapshots", same) : diff);
  auto h = ctl_header(hv_, a_.dom);
  ok &= check("sweep." + tag + ".module", h && h->timeouts == 0 && !h->dom0_gone, describe(h));
  auto bad = console_bad(a_.console, &console_off_);
  bad.insert(bad.begin(), pending_bad_.begin(), pending_bad_.end());
  pending_bad_.clear();
  std::string b;
  for (std::size_t i = 0; i < bad.size() && i < 5; ++i) b += " | " + bad[i];
  ok &= check("sweep." + tag + ".console", bad.empty(),
              bad.empty() ? "no oops/WARN/BUG/lockup/stall line in the guest's console"
                          : fmt("%zu bad lines:", bad.size()) + b);
  return ok;
}

int Sweep::run() {
  auto ready = wait_key(hv_, dom_path(a_.dom, "data/xpe2e/safety/ready"), 120);
  if (!check("sweep.ready", ready && *ready == "1",
             ready ? "guest: " + *ready : "no data/xpe2e/safety/ready within 120 s"))
    fatal("the guest's round loop did not start");
  if (!a_.console.empty()) (void)console_bad(a_.console, &console_off_);  // only what comes from now on

  auto t_sel = Clock::now();
  if (!select_functions()) fatal("not enough functions");
  say("XPE2E-INFO: selection and decoding: %.1f s", since(t_sel));
  register_counted();

  // Round 1: only the counted entries: the workload's own numbers and time.
  {
    double hot = -1;
    auto res = round(++phase_, "baseline", nullptr, &hot);
    if (!after_batch("baseline", res, 0, 0)) {
      say("XPE2E-INFO: the round without the sweep's probes failed: no batch is tried");
      return 1;
    }
  }

  // The batches: consecutive instructions over the function list.
  struct Ref {
    std::size_t fn;
    std::uint64_t at;
  };
  std::vector<Ref> all;
  for (std::size_t i = 0; i < fns_.size(); ++i)
    for (auto at : fns_[i].insns) all.push_back(Ref{i, at});
  const std::size_t nbatches = (all.size() + a_.batch - 1) / a_.batch;
  say("XPE2E-INFO: %zu instructions in %zu batches of at most %u", all.size(), nbatches, a_.batch);
  auto t_all = Clock::now();
  double reg_s = 0, round_s = 0, unreg_s = 0;
  for (std::size_t b = 0; b < nbatches && !dead_; ++b) {
    const std::string tag = fmt("batch%zu", b + 1);
    const std::size_t from = b * a_.batch, to = std::min(all.size(), from + a_.batch);
    const std::size_t fn_from = all[from].fn, fn_to = all[to - 1].fn + 1;
    // Snapshots of the batch's functions, while nothing is armed in them.
    {
      auto view = must(GuestView::open(hv_, a_.dom), "GuestView::open");
      for (std::size_t i = fn_from; i < fn_to; ++i) {
        Function& f = fns_[i];
        f.text.assign(f.size, std::byte{0});
        for (std::uint64_t off = 0; off < f.text.size();) {
          std::size_t k = std::min<std::uint64_t>(4096 - ((f.start.value + off) & 4095), f.text.size() - off);
          must(view->read(Gva{f.start.value + off}, std::span(f.text).subspan(off, k)), "snapshot " + f.name);
          off += k;
        }
      }
    }
    // Registration: the domain paused for at most ~0.5 s at a time, hits served in between.
    std::deque<Point> pts;
    auto t_reg = Clock::now();
    std::size_t acc = 0, ref = 0, i = from;
    while (i < to) {
      serve(0);
      (void)s_.begin_batch();
      auto slice = Clock::now();
      for (; i < to && since(slice) < 0.5; ++i) {
        const Function& f = fns_[all[i].fn];
        Point& p = pts.emplace_back();
        p.fn = all[i].fn;
        p.at = Gva{all[i].at};
        Point* pp = &p;
        std::vector<Point*>* cap_list = &to_cap_;
        const unsigned cap = a_.cap;
        auto r = s_.probe(a_.dom, p.at, [pp, cap_list, cap](HitContext&) {
          if (++pp->hits == cap) cap_list->push_back(pp);
          return 0;
        });
        ++t_.points;
        if (!r) {
          std::string rule = rule_of(r.error());
          if (!t_.refused[rule]++) t_.example[rule] = r.error().what;
          ++ref;
          pts.pop_back();
          continue;
        }
        p.probe = std::move(*r);
        auto info = p.probe.info();
        std::string mode = info ? mode_name(info->mode) : "info-failed";
        if (info && info->address != p.at) mode = "moved (" + mode + ")";
        t_.accepted[mode]++;
        t_.area_accepted[f.area]++;
        ++acc;
      }
      (void)s_.end_batch();
    }
    serve(0);
    double reg = since(t_reg);
    reg_s += reg;
    // One round of the guest's workload with the batch armed.
    double hot = -1;
    auto t_round = Clock::now();
    auto res = round(++phase_, tag, &pts, &hot);
    double rnd = since(t_round);
    round_s += rnd;
    std::uint64_t hits = 0, hit_points = 0, capped = 0;
    for (auto& p : pts) {
      hits += p.hits;
      hit_points += p.hits > 0;
      capped += p.capped;
      if (p.hits) t_.area_hit[fns_[p.fn].area]++;
    }
    t_.hits += hits;
    auto t_un = Clock::now();
    unregister(pts, tag);
    double un = since(t_un);
    unreg_s += un;
    say("XPE2E-SWEEP batch %zu/%zu functions %s..%s (%zu) asked=%zu accepted=%zu refused=%zu hits=%" PRIu64
        " points_hit=%" PRIu64 " capped=%" PRIu64
        "%s register=%.1fs round=%.1fs unregister=%.1fs max_cap=%.2fs max_run_once=%.2fs",
        b + 1, nbatches, fns_[fn_from].name.c_str(), fns_[fn_to - 1].name.c_str(), fn_to - fn_from, to - from, acc, ref,
        hits, hit_points, capped, hot >= 0 ? fmt(" dropped-at=%.0fs", hot).c_str() : "", reg, rnd, un, cap_max_s_,
        run_max_s_);
    cap_max_s_ = run_max_s_ = 0;
    if (!after_batch(tag, res, fn_from, fn_to)) {
      say("XPE2E-INFO: %s failed: functions %s..%s", tag.c_str(), fns_[fn_from].name.c_str(),
          fns_[fn_to - 1].name.c_str());
      if (dead_) break;
    }
  }
  say("XPE2E-INFO: batches: %.1f s (register %.1f s, rounds %.1f s, unregister %.1f s)", since(t_all), reg_s, round_s,
      unreg_s);

  // The tally.
  std::uint64_t acc = 0, ref = 0;
  for (auto& [m, n] : t_.accepted) {
    say("XPE2E-SWEEP accepted %s %" PRIu64, m.c_str(), n);
    acc += n;
  }
  for (auto& [r, n] : t_.refused) {
    say("XPE2E-SWEEP refused %s %" PRIu64 " e.g. %s", r.c_str(), n, t_.example[r].c_str());
    ref += n;
  }
  for (const auto& ar : kAreas)
    say("XPE2E-SWEEP area-total %s functions=%" PRIu64 " instructions=%" PRIu64 " accepted=%" PRIu64
        " points_hit=%" PRIu64,
        ar.name, t_.area_functions[ar.name], t_.area_insns[ar.name], t_.area_accepted[ar.name], t_.area_hit[ar.name]);
  say("XPE2E-SWEEP total functions=%zu asked=%" PRIu64 " accepted=%" PRIu64 " refused=%" PRIu64 " hits=%" PRIu64
      " capped=%" PRIu64 " dropped_hot=%" PRIu64,
      fns_.size(), t_.points, acc, ref, t_.hits, t_.capped, t_.hot_dropped);
  check("sweep.every_instruction", acc + ref == t_.points && acc > 0,
        fmt("%" PRIu64 " asked = %" PRIu64 " accepted + %" PRIu64 " refused", t_.points, acc, ref));
  bool unexpected = false;
  for (auto& [r, n] : t_.refused) unexpected |= r.rfind("other:", 0) == 0;
  check("sweep.refusals_named", !unexpected, "every refusal names its rule (no 'other:' entries above)");
  return 0;
}

}  // namespace

int xpe2e_sweep_main(int argc, char** argv) {
  // The sweep's own fatal lines, fmt() length, describe() and xenstore polling (xpe2e_common.hpp).
  g_program = Program{.fatal_check = "sweep.fatal",
                      .fatal_prog = "sweep",
                      .fmt_buffer = 2048,
                      .describe_magic = false,
                      .key_poll = std::chrono::milliseconds(200)};
  Args a = parse(argc, argv);
  auto opt = must(parse_channel_kind(a.channel), "--channel");
  auto hvp = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  auto state = wait_key(*hvp, dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_STATE), 120);
  if (!check("module.state", state && *state == XENPROBES_XS_STATE_READY,
             state ? "state=" + *state : "no state within 120 s"))
    fatal("the guest module never published its keys");
  std::string rel;
  if (std::ifstream f("/proc/sys/kernel/osrelease"); f) std::getline(f, rel);
  auto grel = hvp->xs_read(dom_path(a.dom, XENPROBES_XS_DIR "/" XENPROBES_XS_RELEASE));
  check("module.release", grel && *grel == rel, "guest " + (grel ? *grel : std::string("?")) + ", Dom0 " + rel);
  say("XPE2E-INFO: sweep: kernel %s; %s", rel.c_str(), describe(ctl_header(*hvp, a.dom)).c_str());
  auto s = must(Session::open(std::move(hvp), SessionOptions{opt}), "Session::open");
  must(s->load_symbols(a.dom, "/proc/kallsyms"), "load_symbols(/proc/kallsyms)");
  auto ch = s->channel_name(a.dom);
  check("channel", ch && *ch == a.channel, ch ? "serving channel: " + *ch : "channel_name: " + ch.error().what);
  int rc = 0;
  {
    Sweep sw(a, *s);
    rc = sw.run();
  }
  hv::Hypervisor& hv = s->hypervisor();
  must(hv.xs_write(dom_path(a.dom, "data/xpe2e/safety/end"), "1"), "write data/xpe2e/safety/end");
  auto done = wait_key(hv, dom_path(a.dom, "data/xpe2e/done"), 60);
  check("workload.ok", done && num(kv(*done), "ok") == 1, done ? *done : "no data/xpe2e/done within 60 s");
  s.reset();
  auto hv2 = must(hv::open_hypervisor("xen"), "open_hypervisor(xen)");
  auto h = ctl_header(*hv2, a.dom);
  check("module.traps_cleared", h && h->nr_traps == 0 && h->timeouts == 0, "after the session closed: " + describe(h));
  must(hv2->xs_write(dom_path(a.dom, "data/xpe2e/unload"), "1"), "write data/xpe2e/unload");
  auto un = wait_key(*hv2, dom_path(a.dom, "data/xpe2e/unloaded"), 90);
  check("module.unload", un && *un == "ok", un ? "detach + rmmod: " + *un : "no data/xpe2e/unloaded within 90 s");
  say("XPE2E-PROG sweep %s %d", g_failed || rc ? "FAIL" : "PASS", g_failed);
  return g_failed || rc ? 1 : 0;
}

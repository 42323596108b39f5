/* Diagnostic (diag_env_procs): does a process get its own SSE registers back?
 * fpucheck <seconds> <tag>: loads a pattern unique to this process into xmm8-xmm15,
 * makes syscalls that let the kernel switch tasks (sched_yield, plus a short nanosleep
 * now and then), then reads the registers back and compares. Prints one line:
 *   XPE2E-FPU: <tag> pid=P rounds=R bad=B first=<hex of the first wrong register>
 * Built with -mgeneral-regs-only: nothing but the asm below touches the vector registers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

static long sys0(long n) {
  long r;
  __asm__ volatile("syscall" : "=a"(r) : "a"(n) : "rcx", "r11", "memory");
  return r;
}
static long sys2(long n, long a, long b) {
  long r;
  __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b) : "rcx", "r11", "memory");
  return r;
}

int main(int argc, char **argv) {
  long secs = argc > 1 ? atol(argv[1]) : 10;
  const char *tag = argc > 2 ? argv[2] : "-";
  uint64_t pat[16], out[16];
  long pid = sys0(SYS_getpid);
  for (int i = 0; i < 16; i++) pat[i] = 0x5a5a000000000000ull ^ ((uint64_t)pid << 16) ^ (uint64_t)(i * 0x1111);
  time_t t0 = time(NULL);
  long rounds = 0, bad = 0;
  char first[80] = "none";
  struct timespec ts = {0, 100000};
  while (time(NULL) - t0 < secs) {
    __asm__ volatile(
        "movdqu 0(%0),%%xmm8\n\tmovdqu 16(%0),%%xmm9\n\tmovdqu 32(%0),%%xmm10\n\tmovdqu 48(%0),%%xmm11\n\t"
        "movdqu 64(%0),%%xmm12\n\tmovdqu 80(%0),%%xmm13\n\tmovdqu 96(%0),%%xmm14\n\tmovdqu 112(%0),%%xmm15\n\t"
        : : "r"(pat) : "memory");
    for (int k = 0; k < 200; k++) {
      sys0(SYS_sched_yield);
      if ((k & 31) == 0) sys2(SYS_nanosleep, (long)&ts, 0);
    }
    __asm__ volatile(
        "movdqu %%xmm8,0(%0)\n\tmovdqu %%xmm9,16(%0)\n\tmovdqu %%xmm10,32(%0)\n\tmovdqu %%xmm11,48(%0)\n\t"
        "movdqu %%xmm12,64(%0)\n\tmovdqu %%xmm13,80(%0)\n\tmovdqu %%xmm14,96(%0)\n\tmovdqu %%xmm15,112(%0)\n\t"
        : : "r"(out) : "memory");
    rounds++;
    if (memcmp(pat, out, sizeof pat) != 0) {
      if (bad == 0)
        for (int i = 0; i < 16; i++)
          if (pat[i] != out[i]) {
            snprintf(first, sizeof first, "q%d:%016llx(want %016llx)", i, (unsigned long long)out[i],
                     (unsigned long long)pat[i]);
            break;
          }
      bad++;
    }
  }
  printf("XPE2E-FPU: %s pid=%ld rounds=%ld bad=%ld first=%s\n", tag, pid, rounds, bad, first);
  return bad ? 1 : 0;
}

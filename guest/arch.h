/*
 * arch.h - the few x86 instructions the demo guest needs, as inline functions.
 */
#ifndef DEMO_GUEST_ARCH_H
#define DEMO_GUEST_ARCH_H

#include "demo.h"

static inline void demo_outb(uint16_t port, uint8_t value) {
  __asm__ volatile("outb %0, %1" : : "a"(value), "Nd"(port));
}

static inline uintptr_t demo_stack_pointer(void) {
  uintptr_t sp;
  __asm__("movq %%rsp, %0" : "=r"(sp));
  return sp;
}

/*
 * The running vCPU, found from the stack it runs on (entry.S gives vCPU n demo_stacks[n]).
 * Returns DEMO_MAX_VCPUS when RSP is outside demo_stacks.
 */
static inline unsigned long demo_this_vcpu(void) {
  unsigned long n = (demo_stack_pointer() - (uintptr_t)demo_stacks) / DEMO_STACK_SIZE;
  return n < DEMO_MAX_VCPUS ? n : DEMO_MAX_VCPUS;
}

#endif /* DEMO_GUEST_ARCH_H */

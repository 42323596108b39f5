/*
 * lib.c - the demo guest's tiny libc: memcpy/memset (rep movsb/stosb, also what GCC falls back
 * to for block copies) and the debug console on DEMO_PORT_CONSOLE.
 */
#include "arch.h"

void *memcpy(void *dst, const void *src, size_t n) {
  void *ret = dst;
  __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
  return ret;
}

void *memset(void *dst, int c, size_t n) {
  void *ret = dst;
  __asm__ volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(c) : "memory");
  return ret;
}

void demo_puts(const char *s) {
  while (*s) demo_outb(DEMO_PORT_CONSOLE, (uint8_t)*s++);
}

void demo_putu(uint64_t v) {
  char digits[21];
  size_t i = sizeof digits;

  digits[--i] = '\0';
  do {
    digits[--i] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  demo_puts(&digits[i]);
}

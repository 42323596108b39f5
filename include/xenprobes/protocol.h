/*
 * The protocol between the libxenprobes guest module (xenprobesU) and Dom0.
 *
 * One header, shared by the library (C++), the guest module (Linux, C) and the simulated
 * Xen, so the constants exist exactly once. Everything the guest writes here is hostile
 * input to Dom0: Dom0 validates every value before using it.
 *
 * The module publishes under /local/domain/<domid>/XENPROBES_XS_DIR (relative to the
 * guest's home, i.e. xenbus_write(XBT_NIL, "data/xenprobes", key, value)):
 *
 *   version       decimal, XENPROBES_PROTOCOL_VERSION; Dom0 refuses other versions
 *   kernel-text   hex, 0x-prefixed: the running kernel's _text (gives the KASLR slide)
 *   release       the guest's `uname -r`
 *   nr-cpus       decimal, number of possible CPUs
 *   oea/count     decimal, number of out-of-line execution areas published
 *   oea/<i>/addr  hex: guest-virtual start of area i (page aligned, executable,
 *                 within +-2 GiB of kernel text)
 *   oea/<i>/size  decimal bytes, a multiple of the page size
 *   state         "ready" once every other key is written (Dom0 watches this key)
 *
 * Written last so Dom0 never sees a half-published set: `state`.
 *
 * What Dom0 checks (libxenprobes/probe/module_info.hpp): numbers are strict (decimal without
 * sign, blanks or leading zeros; hex with a 0x prefix; no trailing junk, no overflow); at
 * least one and at most XENPROBES_OEA_MAX_AREAS areas; each area page aligned, size a nonzero
 * multiple of 4096 and at most XENPROBES_OEA_MAX_SIZE, no wrap-around, in the canonical upper
 * half, every byte within rel32 reach (+-2 GiB) of kernel-text, outside the first 16 MiB of
 * the kernel image, disjoint from the other areas, and every page mapped and executable.
 *
 * Growing the OEA (Dom0 asks, the module answers):
 *
 *   oea-request   written by Dom0: decimal bytes wanted (a nonzero multiple of the page
 *                 size, at most XENPROBES_OEA_MAX_SIZE). The module watches this key. For
 *                 every new value it allocates one more area of at least that size, writes
 *                 oea/<n>/addr and oea/<n>/size for n = the current count, and only then
 *                 bumps oea/count to n + 1 (Dom0 watches oea/count). Published areas never
 *                 change or disappear while the module is loaded: Dom0 refuses a re-read in
 *                 which a known area moved. At XENPROBES_OEA_MAX_AREAS areas, or when the
 *                 allocation fails, the module leaves oea/count alone and writes
 *   oea-error     a one-line reason (e.g. "vmalloc failed", "area limit reached"); Dom0 then
 *                 stops asking. Dom0 removes oea-error before writing a new oea-request.
 */
#ifndef XENPROBES_PROTOCOL_H
#define XENPROBES_PROTOCOL_H

#define XENPROBES_PROTOCOL_VERSION 1

#define XENPROBES_XS_DIR "data/xenprobes"
#define XENPROBES_XS_VERSION "version"
#define XENPROBES_XS_KERNEL_TEXT "kernel-text"
#define XENPROBES_XS_RELEASE "release"
#define XENPROBES_XS_NR_CPUS "nr-cpus"
#define XENPROBES_XS_OEA_COUNT "oea/count"
#define XENPROBES_XS_OEA_ADDR_FMT "oea/%u/addr"
#define XENPROBES_XS_OEA_SIZE_FMT "oea/%u/size"
#define XENPROBES_XS_STATE "state"
#define XENPROBES_XS_STATE_READY "ready"
#define XENPROBES_XS_OEA_REQUEST "oea-request"
#define XENPROBES_XS_OEA_ERROR "oea-error"

/* Bounds Dom0 enforces on published values. */
#define XENPROBES_OEA_MAX_AREAS 16
#define XENPROBES_OEA_MAX_SIZE (16u << 20)

#endif /* XENPROBES_PROTOCOL_H */

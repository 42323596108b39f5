/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xenprobesU: the number of fixup slots (protocol.h, fixup-slots), shared by xp_oea.S, which
 * reserves them with their exception-table entries, and the C code that publishes them.
 * Each slot is XENPROBES_FIXUP_SLOT_SIZE (32) bytes: 256 of them are two pages.
 */
#ifndef XP_FIXUP_H
#define XP_FIXUP_H

#define XP_FIXUP_SLOTS 256
#define XP_FIXUP_SLOT_BYTES 32

#endif

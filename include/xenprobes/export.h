/* XENPROBES_API marks what libxenprobes.so exports; everything else is hidden. */
#ifndef XENPROBES_EXPORT_H
#define XENPROBES_EXPORT_H
#define XENPROBES_API __attribute__((visibility("default")))
#endif

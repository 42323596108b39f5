# postlink.cmake - run after the demo guest is linked (cmake -P):
#   1. writes System.map from `nm -n` (Linux's format; absolute, debug, undefined and weak
#      undefined symbols (a/A/N/U/w) and local labels dropped),
#   2. checks the image: _text at 0xffffffff81000000, no instruction Unicorn 2.0.1 or the
#      simulated Xen cannot run, and the constructs the tests rely on are present.
# Inputs: -DNM=<nm> -DOBJDUMP=<objdump or empty> -DELF=<vmlinux> -DOUT=<System.map>

foreach(v NM ELF OUT)
  if(NOT ${v})
    message(FATAL_ERROR "postlink.cmake: ${v} not set")
  endif()
endforeach()

execute_process(COMMAND ${NM} -n ${ELF} OUTPUT_VARIABLE nm_out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -n ${ELF} failed (${rc})")
endif()
string(REPLACE "\n" ";" lines "${nm_out}")
set(map "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-f]+ [^aANUw] [^.$]")
    string(APPEND map "${line}\n")
  endif()
endforeach()
if(NOT map MATCHES "(^|\n)ffffffff81000000 T _text\n")
  message(FATAL_ERROR "${ELF}: _text is not a text symbol at 0xffffffff81000000")
endif()
file(WRITE ${OUT}.tmp "${map}")
file(RENAME ${OUT}.tmp ${OUT})

if(NOT OBJDUMP)
  message(STATUS "demo guest: no objdump, instruction checks skipped")
  return()
endif()
execute_process(COMMAND ${OBJDUMP} -d --no-show-raw-insn ${ELF}
                OUTPUT_VARIABLE dis RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${OBJDUMP} -d ${ELF} failed (${rc})")
endif()
# Forbidden: anything needing SSE/AVX/x87, time, CPUID, MSRs, interrupts or system tables.
# Functions that are probe targets only and hold traps on purpose are left out of the check
# (safety.S's demo_bug_end: a WARN()'s and a BUG()'s ud2, int3 padding); nothing runs them.
set(checked "${dis}")
foreach(fn demo_bug_end)
  set(before "${checked}")
  string(REGEX REPLACE "\n[0-9a-f]+ <${fn}>:\n[^\n]*(\n[^\n]+)*" "\n" checked "${checked}")
  if(checked STREQUAL before)
    message(WARNING "demo guest: no function ${fn} in ${ELF}")
  endif()
endforeach()
set(bad "")
foreach(re
    "%[xyz]mm[0-9]" "%st[(0-9]" "\t(rdtscp?|cpuid|rdrand|rdseed|rdpid|rdmsr|wrmsr|syscall|sysenter)"
    "\t(sysret|iret[lqw]?|int[13]?|into|ud2|lgdt|lidt|ltr|sti|cli|pause|xsave|xrstor|vm[a-z]+) "
    "\t(int3|ud2|iretq|sti|cli|pause)\n" "\tmov +%[^,]*,%cr[0-9]" "\tmov +%cr[0-9]")
  string(REGEX MATCHALL "[^\n]*${re}[^\n]*" hits "${checked}")
  foreach(hit IN LISTS hits)
    string(APPEND bad "  ${hit}\n")
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "demo guest uses instructions the simulated Xen cannot run:\n${bad}")
endif()
# Required: the shapes the probe tests exercise (a warning: a compiler change may lose one).
set(required
    "call rel32" "\tcall +[0-9a-f]+ <"
    "jcc" "\tj(n?[abceglopsz]|[abgl]e|n[abgl]e) +[0-9a-f]+ <"
    "jmp rel" "\tjmp +[0-9a-f]+ <"
    "RIP-relative operand" "\\(%rip\\)"
    "jump table" "\tjmp +\\*-?(0x)?[0-9a-f]*\\(,%r[a-z0-9]+,8\\)"
    "ret" "\tret *\n"
    "rep movsb" "rep movsb"
    "5-byte ftrace nop" "\tnopl +0x0\\(%rax,%rax,1\\)")
list(LENGTH required n)
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last} 2)
  math(EXPR j "${i} + 1")
  list(GET required ${i} what)
  list(GET required ${j} re)
  if(NOT dis MATCHES "${re}")
    message(WARNING "demo guest: no ${what} in ${ELF}")
  endif()
endforeach()

# Builds guest-module/ with Kbuild against installed kernel headers and checks the result.
#
#   cmake -DSOURCE_DIR=<guest-module> -DINCLUDE_DIR=<include> -DWORK_DIR=<scratch dir>
#         [-DKDIR=<kernel build dir>] -P kbuild_test.cmake
#
# The kernel build dir is KDIR, else $XENPROBES_KDIR, else /lib/modules/$(uname -r)/build, else
# the newest /usr/src/linux-headers-*-amd64 (the running kernel of a build machine or container
# often has no headers installed). Prints XENPROBES_KBUILD_SKIP (the test's skip pattern) when
# there are none. Fails on a failed build and on any warning in the build log.

foreach(var SOURCE_DIR INCLUDE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "kbuild_test.cmake: -D${var}=... is required")
  endif()
endforeach()

# ---- which kernel ----
if(NOT DEFINED KDIR AND DEFINED ENV{XENPROBES_KDIR})
  set(KDIR "$ENV{XENPROBES_KDIR}")
endif()
if(NOT DEFINED KDIR)
  execute_process(COMMAND uname -r OUTPUT_VARIABLE running OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(EXISTS "/lib/modules/${running}/build/Makefile")
    set(KDIR "/lib/modules/${running}/build")
  else()
    file(GLOB candidates LIST_DIRECTORIES true "/usr/src/linux-headers-*-amd64")
    set(usable "")
    foreach(c IN LISTS candidates)
      if(EXISTS "${c}/Makefile" AND EXISTS "${c}/Module.symvers")
        list(APPEND usable "${c}")
      endif()
    endforeach()
    if(usable)
      list(SORT usable COMPARE NATURAL)
      list(GET usable -1 KDIR)
      message(STATUS "no headers for the running kernel ${running}; using ${KDIR}")
    endif()
  endif()
endif()
if(NOT DEFINED KDIR OR NOT EXISTS "${KDIR}/Makefile")
  message(STATUS "XENPROBES_KBUILD_SKIP: no kernel headers (apt-get install linux-headers-amd64)")
  return()
endif()

set(release "")
if(EXISTS "${KDIR}/include/generated/utsrelease.h")
  file(STRINGS "${KDIR}/include/generated/utsrelease.h" uts REGEX "UTS_RELEASE")
  string(REGEX REPLACE ".*UTS_RELEASE \"([^\"]*)\".*" "\\1" release "${uts}")
endif()
message(STATUS "building against ${KDIR} (${release})")

# ---- a fresh copy of the sources: Kbuild writes its objects next to them ----
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
file(GLOB sources "${SOURCE_DIR}/*.c" "${SOURCE_DIR}/*.h" "${SOURCE_DIR}/*.S"
     "${SOURCE_DIR}/Kbuild" "${SOURCE_DIR}/Makefile")
file(COPY ${sources} DESTINATION "${WORK_DIR}")
if(EXISTS "${WORK_DIR}/protocol.h")
  message(FATAL_ERROR "guest-module/ holds a copy of protocol.h: include/xenprobes/protocol.h is the only one")
endif()

execute_process(
  COMMAND make -C "${KDIR}" "M=${WORK_DIR}" "XENPROBES_INCLUDE=${INCLUDE_DIR}" modules
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
set(log "${out}${err}")
file(WRITE "${WORK_DIR}/build.log" "${log}")
message("${log}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the module did not build (exit ${rc}); log: ${WORK_DIR}/build.log")
endif()

# ---- a clean log ----
string(REGEX MATCHALL "[^\n]*([Ww][Aa][Rr][Nn][Ii][Nn][Gg]|[Ee][Rr][Rr][Oo][Rr])[^\n]*" bad "${log}")
if(bad)
  string(REPLACE ";" "\n" bad "${bad}")
  message(FATAL_ERROR "warnings or errors in the kernel build:\n${bad}")
endif()

# ---- the result ----
set(ko "${WORK_DIR}/xenprobes.ko")
if(NOT EXISTS "${ko}")
  message(FATAL_ERROR "no ${ko}")
endif()
file(STRINGS "${ko}" modinfo REGEX "^(vermagic|license|parm)=")
string(REPLACE ";" "\n" modinfo_text "${modinfo}")
message(STATUS "modinfo:\n${modinfo_text}")
if(NOT modinfo MATCHES "license=GPL")
  message(FATAL_ERROR "the module must be GPL (it uses EXPORT_SYMBOL_GPL symbols)")
endif()
# The release as a literal in a regex (Debian 13's has a '+': 6.12.117+deb13-amd64).
string(REGEX REPLACE "([][+.*?()^$|\\])" "\\\\\\1" release_re "${release}")
if(release AND NOT modinfo MATCHES "vermagic=${release_re} ")
  message(FATAL_ERROR "vermagic does not name ${release}")
endif()
foreach(p oea_size trap_capacity ret_capacity timeout_ms ring_order spin_us kernel_text detach)
  if(NOT modinfo MATCHES "parm=${p}:")
    message(FATAL_ERROR "parameter ${p} is missing")
  endif()
endforeach()

# protocol.h came from include/xenprobes/ (Kbuild's dependency file of xp_logic.o names it).
file(READ "${WORK_DIR}/.xp_logic.o.cmd" deps)
string(FIND "${deps}" "${INCLUDE_DIR}/xenprobes/protocol.h" at)
if(at EQUAL -1)
  message(FATAL_ERROR "xp_logic.o was not built from ${INCLUDE_DIR}/xenprobes/protocol.h")
endif()

# The OEA pool and the 256 fixup slots (8 KiB) are one executable section in the module's
# text (int3-filled PROGBITS), and the module's exception table holds the slots' 256 entries
# of 12 bytes (0xc00 bytes) and whatever its C code adds.
find_program(READELF readelf)
if(READELF)
  execute_process(COMMAND "${READELF}" -SW "${ko}" OUTPUT_VARIABLE sections)
  if(NOT sections MATCHES "\\.text\\.xenprobes_oea +PROGBITS +[0-9a-f]+ [0-9a-f]+ 202000 00 +AX ")
    message(FATAL_ERROR "no executable .text.xenprobes_oea section of 2 MiB + 8 KiB in ${ko}:\n${sections}")
  endif()
  if(NOT sections MATCHES "__ex_table +PROGBITS +[0-9a-f]+ [0-9a-f]+ ([0-9a-f]+) ")
    message(FATAL_ERROR "no __ex_table section in ${ko}:\n${sections}")
  endif()
  math(EXPR ex_bytes "0x${CMAKE_MATCH_1}")
  math(EXPR ex_rest "${ex_bytes} % 12")
  if(ex_bytes LESS 3072 OR NOT ex_rest EQUAL 0)
    message(FATAL_ERROR "__ex_table of ${ex_bytes} bytes in ${ko}: not the fixup slots' 256 entries of 12 bytes")
  endif()
endif()
message(STATUS "xenprobes.ko built cleanly against ${release}")

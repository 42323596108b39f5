# Writes the linker version script of libxenprobes.so from libxenprobes/xenprobes.abi, the one
# list of its exports (docs/architecture.md "ABI"): every symbol by its exact name, none by a
# pattern, so that the library exports what the list names and nothing else. Run at build time
# (libxenprobes/CMakeLists.txt):
#
#   cmake -DABI=libxenprobes/xenprobes.abi -DMAP=<build>/xenprobes.map -P abi-to-map.cmake
#
# A line of the list is "<demangled name>@@<version node>" ("? " before it: a symbol that some
# builds do not emit, listed all the same), or a version node's name alone (the definition
# `nm -D` prints), which adds nothing. A name that is a C identifier goes in the node as it is;
# any other is a C++ name and goes in its node's extern "C++" block quoted, which the linker
# matches against the demangled symbol exactly (a quoted name is no glob: `[abi:cxx11]` is
# literal). The nodes come in version order, each later one depending on the one before it;
# the first holds `local: *`, which hides every symbol not named.
cmake_minimum_required(VERSION 3.21)
if(NOT ABI OR NOT MAP)
  message(FATAL_ERROR "abi-to-map.cmake: -DABI=<list> -DMAP=<version script> needed")
endif()
file(STRINGS "${ABI}" _lines ENCODING UTF-8)
get_filename_component(_abi_name "${ABI}" NAME)
set(_nodes)
foreach(_line IN LISTS _lines)
  string(REGEX REPLACE "^\\? " "" _line "${_line}")
  if(_line STREQUAL "" OR NOT _line MATCHES "@@")
    continue()
  endif()
  if(NOT _line MATCHES "^(.+)@@([A-Za-z0-9_.]+)$")
    message(FATAL_ERROR "${ABI}: not \"<name>@@<version node>\": ${_line}")
  endif()
  set(_name "${CMAKE_MATCH_1}")
  set(_node "${CMAKE_MATCH_2}")
  string(MAKE_C_IDENTIFIER "${_node}" _key)
  if(NOT _node IN_LIST _nodes)
    list(APPEND _nodes "${_node}")
    set(_c_${_key} "")
    set(_cxx_${_key} "")
  endif()
  if(_name MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
    string(APPEND _c_${_key} "    ${_name};\n")
  else()
    if(_name MATCHES "[\"\\\\]")
      message(FATAL_ERROR "${ABI}: a name the version script cannot quote: ${_name}")
    endif()
    string(APPEND _cxx_${_key} "      \"${_name}\";\n")
  endif()
endforeach()
if(NOT _nodes)
  message(FATAL_ERROR "${ABI}: no symbol listed")
endif()
list(SORT _nodes COMPARE NATURAL)

set(_out "/* Generated from ${_abi_name} by libxenprobes/abi-to-map.cmake: edit the list, not this. */\n")
set(_previous "")
foreach(_node IN LISTS _nodes)
  string(MAKE_C_IDENTIFIER "${_node}" _key)
  string(APPEND _out "${_node} {\n  global:\n")
  if(NOT _cxx_${_key} STREQUAL "")
    string(APPEND _out "    extern \"C++\" {\n${_cxx_${_key}}    };\n")
  endif()
  string(APPEND _out "${_c_${_key}}")
  if(_previous STREQUAL "")
    string(APPEND _out "  local: *;\n};\n")
  else()
    string(APPEND _out "} ${_previous};\n")
  endif()
  set(_previous "${_node}")
endforeach()
file(WRITE "${MAP}" "${_out}")

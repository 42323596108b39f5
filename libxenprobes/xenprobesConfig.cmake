# find_package(xenprobes): the library, and its simulated Xen when that is installed
# (libxenprobes/CMakeLists.txt, docs/simulated-xen.md "A library of its own").
include(${CMAKE_CURRENT_LIST_DIR}/xenprobesTargets.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/xenprobes-simTargets.cmake OPTIONAL)

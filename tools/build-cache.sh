# Sourced (`. tools/build-cache.sh`) by the scripts that build the tree: compile through ccache
# when it is installed (tools/install-deps.sh installs it), so that a fresh clone of an
# unchanged tree does not compile everything again. CI builds a clean clone at every run: the
# library three times (tests, sanitizers, fuzzing) and twice more for the e2e payloads; with a
# warm cache those compilations are cache hits. Sets XP_CMAKE_LAUNCHER, the CMake arguments to
# pass at configure time (empty values when ccache is absent or XENPROBES_CCACHE=0, which also
# takes ccache out of a build tree configured with it before).
#
# ccache only returns an object for the same compiler, flags and preprocessed source
# (ccache(1), "How ccache works"). Its cache: CCACHE_DIR when set, else for root (CI, and
# the e2e suite's builds) /var/cache/xenprobes-ccache beside the e2e and kernel caches, else
# ccache's own default (~/.cache/ccache).
#   CCACHE_BASEDIR   paths under the source tree are hashed relative to the build directory,
#                    so two checkouts in different directories share their objects;
#   CCACHE_NOHASHDIR the build directory is not part of the hash (it only names the
#                    compilation directory in the debug information);
#   CCACHE_MAXSIZE   the five builds above take ~2 GB compressed.
if [ "${XENPROBES_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
  if [ -z "${CCACHE_DIR:-}" ] && [ "$(id -u)" = 0 ]; then
    export CCACHE_DIR=/var/cache/xenprobes-ccache
  fi
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
  export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
  XP_CCACHE=1
  XP_CMAKE_LAUNCHER="-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
else
  XP_CCACHE=0
  XP_CMAKE_LAUNCHER="-DCMAKE_C_COMPILER_LAUNCHER= -DCMAKE_CXX_COMPILER_LAUNCHER="
fi

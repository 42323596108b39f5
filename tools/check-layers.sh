#!/bin/sh
# The library's layers (docs/architecture.md), bottom to top. A source file of a layer may
# include its own layer's headers, the public headers (include/xenprobes/) and those of the
# layers listed before it on lower lines; never one on its own line or above:
#
#   common
#   hv
#   mem
#   x86 symbols
#   kernel
#   guestmod
#   guardian
#   channel
#   probe
#   api
#
# Below its own line a layer may include only what docs/architecture.md's table says it may
# (ALLOWED below: x86 and symbols use common alone, guestmod and guardian common, hv and mem,
# ...; probe and api everything below them). The public headers include only each other (and
# the C++ library). A folder under
# libxenprobes/ that is not in the list fails the check too: a new layer gets its place here
# and in docs/architecture.md first. The top-level shared/ holds headers that the library and
# the programs both compile (shared/README.md): any layer may include "shared/...", and a
# header there includes no header of the project (only <...> ones). The test command
# (tools/run-tests.sh) runs this.
#
#   sh tools/check-layers.sh
set -eu
cd "$(dirname "$0")/.."

LAYERS="common:0 hv:1 mem:2 x86:3 symbols:3 kernel:4 guestmod:5 guardian:6 channel:7 probe:8 api:9"
# layer=what it may include (docs/architecture.md, "may include"); "below": every lower rank.
ALLOWED="common= hv=common mem=common,hv x86=common symbols=common kernel=common,x86,symbols
  guestmod=common,hv,mem guardian=common,hv,mem channel=common,hv,mem,guestmod,guardian probe=below api=below"

allowed_of() {
  for a in $ALLOWED; do
    if [ "${a%%=*}" = "$1" ]; then
      echo "${a#*=}"
      return
    fi
  done
}

rank_of() {
  for l in $LAYERS; do
    if [ "${l%%:*}" = "$1" ]; then
      echo "${l#*:}"
      return
    fi
  done
  echo ""
}

bad=0
for dir in libxenprobes/*/; do
  layer=$(basename "$dir")
  if [ -z "$(rank_of "$layer")" ]; then
    echo "check-layers: libxenprobes/$layer/ is in no layer: give it a place in tools/check-layers.sh and docs/architecture.md" >&2
    bad=1
  fi
done

# Every quoted include of <folder>/<file> in the library: file, line, folder.
includes=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[A-Za-z0-9_]+/' libxenprobes include \
             --include='*.h' --include='*.hpp' --include='*.c' --include='*.cpp' |
           sed -E 's|^([^:]+):([0-9]+):.*#[[:space:]]*include[[:space:]]+"([A-Za-z0-9_]+)/.*|\1 \2 \3|')

echo "$includes" | {
  status=0
  while read -r file line target; do
    [ -n "$file" ] || continue
    case "$file" in
      include/xenprobes/*)
        if [ "$target" != xenprobes ]; then
          echo "$file:$line: a public header includes \"$target/...\": the installed headers include only xenprobes/ ones" >&2
          status=1
        fi
        continue ;;
    esac
    [ "$target" = xenprobes ] && continue
    [ "$target" = shared ] && continue  # shared/: below every layer (checked below)
    layer=$(echo "$file" | cut -d/ -f2)
    [ "$target" = "$layer" ] && continue
    own=$(rank_of "$layer")
    theirs=$(rank_of "$target")
    [ -n "$own" ] || continue  # reported above
    if [ -z "$theirs" ]; then
      echo "$file:$line: includes \"$target/...\", which is no layer of the library" >&2
      status=1
    elif [ "$theirs" -ge "$own" ]; then
      echo "$file:$line: layer '$layer' includes \"$target/...\", a layer at or above its own (layers, bottom up: $(echo "$LAYERS" | sed 's/:[0-9]*//g'))" >&2
      status=1
    else
      may=$(allowed_of "$layer")
      case ",$may," in
        ,below, | *",$target,"*) ;;
        *)
          echo "$file:$line: layer '$layer' includes \"$target/...\", which it may not use (it may include: ${may:-nothing but itself}; docs/architecture.md)" >&2
          status=1 ;;
      esac
    fi
  done
  exit $status
} || bad=1

# shared/ sits below the library's layers: its headers include only system and third-party ones.
for f in $(find shared -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.c' -o -name '*.cpp' \) 2>/dev/null); do
  if grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$f" >&2; then
    echo "$f: includes a header of the project (above): a header in shared/ includes only <...> ones" >&2
    bad=1
  fi
done

if [ "$bad" != 0 ]; then
  echo "check-layers: FAILED (docs/architecture.md says what each layer may use)" >&2
  exit 1
fi
echo "check-layers: every include goes down the layers"

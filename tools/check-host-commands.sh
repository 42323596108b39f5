#!/bin/sh
# Every program the host-side scripts run must come from a package that those scripts install
# themselves or that every Debian 12 has (debootstrap --variant=minbase). A fresh machine once
# failed at images.sh's `modprobe` because no package list named kmod; this check catches
# that before the long stages, in well under a second.
#
#   sh tools/check-host-commands.sh           the check (tools/run-tests.sh runs it)
#   sh tools/check-host-commands.sh --list    every command found: package, scope, first use;
#                                             the scripts not checked
#   sh tools/check-host-commands.sh --words   every word in command position (the tokenizer's view)
#   sh tools/check-host-commands.sh --verify  the check, then asks dpkg -S which package ships
#                                             each command present on this machine (catches a
#                                             wrong entry in MAP below)
#
# Host side: the scripts the README has people run (ENTRY below) and every script they run or
# source, followed through `sh x`, `bash x`, `. x`, `source x` and paths in command position
# (so tools/e2e/{dom0,domu,scenarios}, which run inside the Dom0 and DomU images with
# images.sh's E2E_ROOTFS_PKGS, are left out: run.sh only copies them); and the programs CMake
# files name after COMMAND or in find_program (ctest and the builds run them). A script under
# tools/ that none of them runs (a standalone tool with its own needs) is not checked: --list
# names it.
# A conservative shell tokenizer (awk below) finds every word in command position: after ; &
# | && || ( { newline, then, do, ..., inside $( ) and backticks, after exec, nice, timeout,
# xargs, env, chroot, in trap and sh -c strings. Each must be a shell builtin, a function of
# the scripts, a path (into the source or build tree, or the e2e cache), or a name in MAP
# (command -> the Debian package shipping it). An unknown name fails the check, so a new
# command cannot slip past it: add it to MAP with its package. A command run from a variable
# must be in DYNAMIC.
#
# Which packages count, per scope:
#   e2e  (tools/e2e/*, tools/bench/*: `sudo tools/e2e/run.sh` runs alone): the packages its
#        install loops name (E2E_HOST_PKGS in tools/e2e/lib.sh, the GDBSX build's list in
#        images.sh), minbase;
#   main (everything else, and the CMake files): tools/install-deps.sh's list, minbase.
# An install loop is `for p in LIST; do` followed by a dpkg-query "install ok installed"
# test, the idiom of install-deps.sh, lib.sh and images.sh; $VARIABLES in LIST are expanded
# from the scripts' own assignments.
set -eu
cd "$(dirname "$0")/.."
mode=check
case "${1:-}" in
  "") ;;
  --list) mode=list ;;
  --words) mode=words ;;
  --verify) mode=verify ;;
  -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "check-host-commands: unknown option '$1' (--list, --words, --verify)" >&2; exit 2 ;;
esac

# What `debootstrap --variant=minbase bookworm` installs (Priority: required, plus apt):
# measured with dpkg-query in such a chroot (docs/e2e.md "A fresh machine").
MINBASE="adduser apt base-files base-passwd bash bsdutils coreutils dash debconf
debian-archive-keyring debianutils diffutils dpkg e2fsprogs findutils gcc-12-base gpgv grep
gzip hostname init-system-helpers libacl1 libapt-pkg6.0 libattr1 libaudit-common libaudit1
libblkid1 libbz2-1.0 libc-bin libc6 libcap-ng0 libcap2 libcom-err2 libcrypt1 libdb5.3
libdebconfclient0 libext2fs2 libffi8 libgcc-s1 libgcrypt20 libgmp10 libgnutls30 libgpg-error0
libhogweed6 libidn2-0 liblz4-1 liblzma5 libmd0 libmount1 libnettle8 libp11-kit0 libpam-modules
libpam-modules-bin libpam-runtime libpam0g libpcre2-8-0 libseccomp2 libselinux1
libsemanage-common libsemanage2 libsepol2 libsmartcols1 libss2 libstdc++6 libsystemd0
libtasn1-6 libtinfo6 libudev1 libunistring2 libuuid1 libxxhash0 libzstd1 login logsave mawk
mount ncurses-base ncurses-bin passwd perl-base sed sysvinit-utils tar tzdata usr-is-merged
util-linux util-linux-extra zlib1g"

# A listed package also installs these (their Depends; build-essential's are Debian policy).
IMPLIED="build-essential:make,gcc,g++,dpkg-dev,libc6-dev"

# command -> Debian package (bookworm). `--verify` checks the entries against dpkg -S.
MAP="
apt-cache apt
apt-get apt
awk mawk
basename coreutils
bash bash
busybox busybox-static
cat coreutils
ccache ccache
chmod coreutils
chroot coreutils
clang-14 clang-14
clang-format-14 clang-format-14
clang-tidy-19 clang-tidy-19
cmake cmake
cp coreutils
cpio cpio
ctest cmake
cut coreutils
date coreutils
debootstrap debootstrap
dirname coreutils
dpkg dpkg
dpkg-deb dpkg
dpkg-query dpkg
dpkg-source dpkg-dev
du coreutils
find findutils
gcc gcc
grep grep
gzip gzip
head coreutils
id coreutils
install coreutils
ldd libc-bin
ln coreutils
ls coreutils
mktemp coreutils
make make
mkdir coreutils
mkfs.ext4 e2fsprogs
modprobe kmod
mv coreutils
nice coreutils
nproc coreutils
od coreutils
promtool prometheus
qemu-system-x86_64 qemu-system-x86
readelf binutils
readlink coreutils
realpath coreutils
rm coreutils
sed sed
sh dash
sha256sum coreutils
sleep coreutils
sort coreutils
systemd-analyze systemd
tail coreutils
tar tar
tee coreutils
timeout coreutils
touch coreutils
tr coreutils
uname coreutils
unshare util-linux
wc coreutils
xargs findutils
xz xz-utils
zcat gzip
zstd zstd
"

# Commands run from a variable: variable -> the program it holds ("-": none from a package).
DYNAMIC="
qemu qemu-system-x86_64
qemu_bin qemu-system-x86_64
QEMU_NEW -
"

# Where host-side runs start: the README's two commands, CI, the e2e harness run alone, the
# benchmark, this check.
ENTRY="tools/run-tests.sh tools/run-demo.sh tools/install-deps.sh .ci/run tools/e2e/run.sh
tools/bench/table1.sh tools/check-host-commands.sh"

# Every shell script under tools/ and .ci/ (ENTRY and what they reach are checked), and the
# CMake files.
files=$(
  find tools .ci -type f | while read -r f; do
    case "$f" in
      *.sh) echo "$f" ;;
      *) head -n 1 "$f" | grep -q '^#!.*[/ ]\(ba\)\{0,1\}sh\( \|$\)' && echo "$f" ;;
    esac
  done | LC_ALL=C sort
  find . \( -name 'build*' -o -name '.?*' \) -prune -o \( -name CMakeLists.txt -o -name '*.cmake' \) -print |
    sed 's|^\./||' | LC_ALL=C sort
)

tmp=$(mktemp)
# shellcheck disable=SC2086
XP_MODE=$mode XP_ENTRY=$ENTRY XP_MINBASE=$MINBASE XP_IMPLIED=$IMPLIED XP_MAP=$MAP XP_DYNAMIC=$DYNAMIC \
  awk '
# ---------------------------------------------------------------- the shell tokenizer ----
# S: the text being read; LINE: its line (counted when CL); FILE, SCOPE: where.
# Per nesting level lv ($( ), backticks, trap/sh -c strings: lv+1): W the word so far
# (expansions kept as their source text), INW in a word, DYN it holds an expansion, QU it
# holds quotes, RAW the quoted text (code for trap/sh -c), CP the next word is in command
# position, REDIR the next word is a redirection target (2: a here-document delimiter),
# DEPTH ( ) nesting, FOR in a for/select head, CASEH in a case head, PAT in a case pattern,
# CASED open cases, DBR inside [[ ]], WN the wrapper whose command is still to come (WPEND:
# an option argument comes, WPOS: positional words before the command), ARG what the
# arguments of the current command are (trap, shell, shellc, find, findexec, eval),
# FNAME after "function", NOCMD inside an array literal, OPEN the last token was "(" (so
# "name()" is followed by a command position).
function lvreset(lv) {
  W[lv] = ""; INW[lv] = 0; DYN[lv] = 0; QU[lv] = 0; RAW[lv] = ""; CP[lv] = 1; REDIR[lv] = 0
  DEPTH[lv] = 0; FOR[lv] = 0; CASEH[lv] = 0; PAT[lv] = 0; CASED[lv] = 0; DBR[lv] = 0
  WN[lv] = ""; WPEND[lv] = 0; WPOS[lv] = 0; ARG[lv] = ""; FNAME[lv] = 0; NOCMD[lv] = 0; OPEN[lv] = 0
}
function addw(lv, s, dyn) { W[lv] = W[lv] s; INW[lv] = 1; if (dyn) DYN[lv] = 1 }
function nl(s,   t) { t = s; return gsub(/\n/, "", t) }
# lex(i, mode, lv): reads S from i at level lv. mode 0: to the end of S; 1: to the ")" closing
# a $( ... ) or <( ... ), returns the index after it; 2: the same for an array literal.
function lex(i, mode, lv,    n, c, c2, j, op) {
  n = length(S)
  lvreset(lv)
  if (mode == 2) NOCMD[lv] = 1
  while (i <= n) {
    c = substr(S, i, 1)
    if (c == "\n") {
      flush(lv); sep(lv, "\n"); if (CL) LINE++; i++
      if (HDN > 0) i = heredocs(i)
      continue
    }
    if (c == " " || c == "\t") { flush(lv); i++; continue }
    if (c == "\\") {
      c2 = substr(S, i + 1, 1)
      if (c2 == "\n") { if (CL) LINE++ } else addw(lv, c2, 0)
      i += 2; continue
    }
    if (c == "#" && !INW[lv]) { while (i <= n && substr(S, i, 1) != "\n") i++; continue }
    if (c == "\047") {
      j = index(substr(S, i + 1), "\047"); if (j == 0) j = n - i + 1
      c2 = substr(S, i + 1, j - 1)
      if (CL) LINE += nl(c2)
      addw(lv, c2, 0); QU[lv] = 1; RAW[lv] = RAW[lv] c2
      i += j + 1; continue
    }
    if (c == "\"") { i = dquote(i, lv); continue }
    if (c == "$") { i = dollar(i, lv); continue }
    if (c == "`") { i = backtick(i, lv); continue }
    if (c == "(" && INW[lv] && !DYN[lv] && W[lv] ~ /^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=$/) {
      j = lex(i + 1, 2, lv + 1); addw(lv, substr(S, i, j - i), 0); i = j; continue
    }
    if ((c == "<" || c == ">") && substr(S, i + 1, 1) == "(" && !INW[lv]) {
      j = lex(i + 2, 1, lv + 1); addw(lv, substr(S, i, j - i), 1); i = j; continue
    }
    if (c == "<" || c == ">") {
      if (INW[lv] && W[lv] ~ /^[0-9]+$/ && !QU[lv]) { W[lv] = ""; INW[lv] = 0 } else flush(lv)
      j = i + 1
      while (j - i < 3 && substr(S, j, 1) ~ /[<>&|-]/) j++
      op = substr(S, i, j - i)
      REDIR[lv] = (op == "<<" || op == "<<-") ? 2 : 1
      i = j; continue
    }
    if (c == ";" || c == "&" || c == "|" || c == "(" || c == ")") {
      flush(lv)
      c2 = substr(S, i + 1, 1)
      if (c == ")") {
        if (mode && DEPTH[lv] == 0 && !PAT[lv]) return i + 1
        sep(lv, ")"); i++; continue
      }
      if (c == "(" && c2 == "(" && CP[lv]) { i = arith(i + 2, lv); continue }
      op = c
      if (c == ";" && c2 == ";") op = (substr(S, i + 2, 1) == "&") ? ";;&" : ";;"
      else if (c == ";" && c2 == "&") op = ";&"
      else if (c == "&" && c2 == "&") op = "&&"
      else if (c == "&" && c2 == ">") {
        j = i + 2; if (substr(S, j, 1) == ">") j++
        REDIR[lv] = 1; i = j; continue
      }
      else if (c == "|" && c2 == "|") op = "||"
      else if (c == "|" && c2 == "&") op = "|&"
      sep(lv, op); i += length(op); continue
    }
    addw(lv, c, 0); i++
  }
  flush(lv)
  return i
}
# A "..." string from i (its opening quote); returns the index after the closing one.
function dquote(i, lv,    n, c, start) {
  n = length(S); start = i + 1; i++
  QU[lv] = 1; INW[lv] = 1
  while (i <= n) {
    c = substr(S, i, 1)
    if (c == "\"") break
    if (c == "\\") {
      if (substr(S, i + 1, 1) == "\n") { if (CL) LINE++ } else addw(lv, substr(S, i + 1, 1), 0)
      i += 2; continue
    }
    if (c == "$") { i = dollar(i, lv); continue }
    if (c == "`") { i = backtick(i, lv); continue }
    if (c == "\n" && CL) LINE++
    addw(lv, c, 0); i++
  }
  RAW[lv] = RAW[lv] substr(S, start, i - start)
  return i + 1
}
# $name, ${...}, $(...), $((...)) and ANSI-C strings from i (the "$"); returns the index after it.
function dollar(i, lv,    n, c2, j, d, c) {
  n = length(S); c2 = substr(S, i + 1, 1)
  if (c2 == "(") {
    if (substr(S, i + 2, 1) == "(") j = arith(i + 3, lv)
    else j = lex(i + 2, 1, lv + 1)
    addw(lv, substr(S, i, j - i), 1); return j
  }
  if (c2 == "{") {
    j = i + 2; d = 1
    while (j <= n && d > 0) {
      c = substr(S, j, 1)
      if (c == "\\") { j += 2; continue }
      if (c == "$" && substr(S, j + 1, 1) == "(") { j = dollar(j, lv); continue }
      if (c == "{") d++
      else if (c == "}") d--
      else if (c == "\n" && CL) LINE++
      j++
    }
    addw(lv, substr(S, i, j - i), 1); return j
  }
  if (c2 == "\047") {
    j = i + 2
    while (j <= n && substr(S, j, 1) != "\047") j += (substr(S, j, 1) == "\\") ? 2 : 1
    addw(lv, substr(S, i, j + 1 - i), 0); QU[lv] = 1; return j + 1
  }
  j = i + 1
  if (c2 ~ /[@*#?$!0-9-]/) j++
  else while (j <= n && substr(S, j, 1) ~ /[A-Za-z0-9_]/) j++
  if (j == i + 1) { addw(lv, "$", 0); return j }
  addw(lv, substr(S, i, j - i), 1); return j
}
# An arithmetic expression after "((" (i: its first character); $( ) inside it is read.
function arith(i, lv,    n, c, d) {
  n = length(S); d = 2
  while (i <= n && d > 0) {
    c = substr(S, i, 1)
    if (c == "$" && substr(S, i + 1, 1) == "(" && substr(S, i + 2, 1) != "(") { i = lex(i + 2, 1, lv + 1); continue }
    if (c == "(") d++
    else if (c == ")") d--
    else if (c == "\n" && CL) LINE++
    i++
  }
  return i
}
function backtick(i, lv,    n, j, code) {
  n = length(S); j = i + 1
  while (j <= n && substr(S, j, 1) != "`") j += (substr(S, j, 1) == "\\") ? 2 : 1
  code = substr(S, i + 1, j - i - 1)
  gsub(/\\`/, "`", code)
  lexstr(code, lv + 1)
  if (CL) LINE += nl(code)
  addw(lv, substr(S, i, j + 1 - i), 1)
  return j + 1
}
# Reads a string of code (a trap or sh -c argument, a backtick) at level lv.
function lexstr(code, lv,    s, cl) {
  s = S; cl = CL
  S = code; CL = 0
  lex(1, 0, lv)
  S = s; CL = cl
}
# Skips the here-documents whose operators were on the line just ended.
function heredocs(i,    k, n, e, line) {
  n = length(S)
  for (k = 1; k <= HDN; k++) {
    while (i <= n) {
      e = index(substr(S, i), "\n"); if (e == 0) e = n - i + 2
      line = substr(S, i, e - 1); i += e
      if (CL) LINE++
      sub(/^\t+/, "", line)
      if (line == HD[k]) break
    }
  }
  HDN = 0
  return i
}
function flush(lv,    w, dyn, qu, raw) {
  if (!INW[lv]) return
  w = W[lv]; dyn = DYN[lv]; qu = QU[lv]; raw = RAW[lv]
  W[lv] = ""; INW[lv] = 0; DYN[lv] = 0; QU[lv] = 0; RAW[lv] = ""
  if (REDIR[lv]) {
    if (REDIR[lv] == 2) HD[++HDN] = w
    REDIR[lv] = 0; return
  }
  word(lv, w, dyn, qu, raw)
}
function sep(lv, op,    wasopen) {
  wasopen = OPEN[lv]; OPEN[lv] = 0
  if (NOCMD[lv]) return
  if (DBR[lv]) return
  if (op == ";;" || op == ";&" || op == ";;&") {
    if (CASED[lv] > 0) PAT[lv] = 1
    CP[lv] = 0; WN[lv] = ""; ARG[lv] = ""; return
  }
  if (PAT[lv]) { if (op == ")") { PAT[lv] = 0; CP[lv] = 1 }; return }
  if (CASEH[lv]) return
  WN[lv] = ""; WPEND[lv] = 0; ARG[lv] = ""
  if (op == "(") { DEPTH[lv]++; CP[lv] = 1; OPEN[lv] = 1; return }
  if (op == ")") { DEPTH[lv]--; CP[lv] = wasopen; return }
  FOR[lv] = 0; CP[lv] = 1
}
function word(lv, w, dyn, qu, raw) {
  OPEN[lv] = 0
  if (NOCMD[lv] || FOR[lv]) return
  if (CASEH[lv]) { if (w == "in" && !qu) { CASEH[lv] = 0; PAT[lv] = 1 }; return }
  if (PAT[lv]) { if (w == "esac" && !qu) { PAT[lv] = 0; CASED[lv]--; CP[lv] = 0 }; return }
  if (DBR[lv]) { if (w == "]]" && !qu) { DBR[lv] = 0; CP[lv] = 0 }; return }
  if (CP[lv]) cmdword(lv, w, dyn, qu)
  else argword(lv, w, dyn, qu, raw)
}
function cmdword(lv, w, dyn, qu,    b) {
  if (!dyn && !qu) {
    if (w ~ /^(if|then|else|elif|do|while|until|!|\{|time)$/) return
    if (w ~ /^(fi|done|\})$/) { CP[lv] = 0; return }
    if (w == "esac") { if (CASED[lv] > 0) CASED[lv]--; CP[lv] = 0; return }
    if (w == "for" || w == "select") { FOR[lv] = 1; CP[lv] = 0; return }
    if (w == "case") { CASEH[lv] = 1; CASED[lv]++; CP[lv] = 0; return }
    if (w == "[[") { DBR[lv] = 1; CP[lv] = 0; return }
    if (w == "function") { FNAME[lv] = 1; CP[lv] = 0; return }
  }
  if (w ~ /^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=/) return
  CP[lv] = 0; WN[lv] = ""; WPEND[lv] = 0; WPOS[lv] = 0; ARG[lv] = ""
  emit(w, dyn)
  if (dyn) return
  b = w; sub(/.*\//, "", b)
  if (b in WRAP) { WN[lv] = b; WPOS[lv] = WRAP[b] }
  else if (b == "trap") ARG[lv] = "trap"
  else if (b == "sh" || b == "bash" || b == "dash") ARG[lv] = "shell"
  else if (b == "." || b == "source") ARG[lv] = "source"
  else if (b == "find") ARG[lv] = "find"
  else if (b == "eval") ARG[lv] = "eval"
}
function argword(lv, w, dyn, qu, raw) {
  if (FNAME[lv]) { FUNCS[w] = 1; FNAME[lv] = 0; CP[lv] = 1; return }
  if (WN[lv] != "") {
    if (WPEND[lv]) { WPEND[lv] = 0; return }
    if (WN[lv] == "command" && w ~ /^-[vV]$/) { WN[lv] = ""; return }
    if (w ~ /^-./) { if ((WN[lv] SUBSEP w) in WOPTARG) WPEND[lv] = 1; return }
    if (WN[lv] == "env" && w ~ /^[A-Za-z_][A-Za-z0-9_]*=/) return
    if (WPOS[lv] > 0) { WPOS[lv]--; return }
    WN[lv] = ""; cmdword(lv, w, dyn, qu); return
  }
  if (ARG[lv] == "trap") { ARG[lv] = ""; if (w !~ /^-/) lexstr(qu ? raw : w, lv + 1); return }
  if (ARG[lv] == "shell") { if (w == "-c") ARG[lv] = "shellc"; else if (w !~ /^-/) { ref(w); ARG[lv] = "" }; return }
  if (ARG[lv] == "source") { ref(w); ARG[lv] = ""; return }
  if (ARG[lv] == "shellc") { ARG[lv] = ""; lexstr(qu ? raw : w, lv + 1); return }
  if (ARG[lv] == "find") { if (w ~ /^-(exec|execdir|ok|okdir)$/) ARG[lv] = "findexec"; return }
  if (ARG[lv] == "findexec") { emit(w, dyn); ARG[lv] = "findargs"; return }
  if (ARG[lv] == "eval") lexstr(qu ? raw : w, lv + 1)
}
function emit(w, dyn) {
  N++; CW[N] = w; CDYN[N] = dyn; CFILE[N] = FILE; CLINE[N] = LINE; CSCOPE[N] = SCOPE
  if (w ~ /\//) ref(w)
}
# A script FILE runs or sources (resolved after reading every file).
function ref(w) { RN++; RFROM[RN] = FILE; RTO[RN] = w }

# ------------------------------------------------------------------------ the inputs ----
function scopeof(f) { return (f ~ /^tools\/(e2e|bench)\//) ? "e2e" : "main" }
BEGIN {
  # Wrappers: the command they run follows their options and this many positional words.
  WRAP["exec"] = 0; WRAP["command"] = 0; WRAP["builtin"] = 0; WRAP["nice"] = 0; WRAP["nohup"] = 0
  WRAP["timeout"] = 1; WRAP["chroot"] = 1; WRAP["xargs"] = 0; WRAP["env"] = 0; WRAP["sudo"] = 0
  WRAP["setsid"] = 0; WRAP["stdbuf"] = 0; WRAP["ionice"] = 0
  split("exec:-a nice:-n timeout:-s timeout:-k xargs:-n xargs:-I xargs:-P xargs:-L xargs:-d xargs:-a " \
        "xargs:-E xargs:-s env:-u env:-C env:-S sudo:-u sudo:-g sudo:-C sudo:-h sudo:-p sudo:-D " \
        "ionice:-c ionice:-n stdbuf:-i stdbuf:-o stdbuf:-e", t, " ")
  for (k in t) { split(t[k], kv, ":"); WOPTARG[kv[1], kv[2]] = 1 }
  split(". : [ alias bg bind break builtin caller cd command compgen complete compopt continue " \
        "declare dirs disown echo enable eval exec exit export false fc fg getopts hash help " \
        "history jobs kill let local logout mapfile popd printf pushd pwd read readarray readonly " \
        "return set shift shopt source suspend test times trap true type typeset ulimit umask " \
        "unalias unset wait", t, " ")
  for (k in t) BUILTIN[t[k]] = 1
  n = split(ENVIRON["XP_MAP"], t, "\n")
  for (k = 1; k <= n; k++) if (split(t[k], kv, " ") == 2) MAP[kv[1]] = kv[2]
  n = split(ENVIRON["XP_DYNAMIC"], t, "\n")
  for (k = 1; k <= n; k++) if (split(t[k], kv, " ") == 2) DYNMAP[kv[1]] = kv[2]
  n = split(ENVIRON["XP_MINBASE"], t, /[ \t\n]+/)
  for (k = 1; k <= n; k++) if (t[k] != "") { PKG["main", t[k]] = "minbase"; PKG["e2e", t[k]] = "minbase" }
  n = split(ENVIRON["XP_IMPLIED"], t, /[ \t\n]+/)
  for (k = 1; k <= n; k++) if (split(t[k], kv, ":") == 2) IMPLIED[kv[1]] = kv[2]
}
FNR == 1 { NFILES++; FILES[NFILES] = FILENAME; inassign = 0; pendfor = "" }
FILENAME ~ /(^|\/)(CMakeLists\.txt|[^\/]*\.cmake)$/ {
  if (FNR == 1) NCMAKE++
  line = $0; sub(/#.*/, "", line)
  if (match(line, /add_executable\([ \t]*[A-Za-z0-9_.+-]+/)) {
    tok = substr(line, RSTART, RLENGTH); sub(/^add_executable\([ \t]*/, "", tok); TARGET[tok] = 1
  }
  if (match(line, /find_program\([ \t]*[A-Za-z0-9_]+[ \t]+[^ \t)]+/)) {
    tok = substr(line, RSTART, RLENGTH); sub(/^find_program\([ \t]*[A-Za-z0-9_]+[ \t]+/, "", tok)
    if (tok != "NAMES") { M++; MW[M] = tok; MFILE[M] = FILENAME; MLINE[M] = FNR }
  }
  while (match(line, /COMMAND[ \t]+[^ \t)]+/)) {
    tok = substr(line, RSTART, RLENGTH); sub(/^COMMAND[ \t]+/, "", tok); gsub(/"/, "", tok)
    if (tok !~ /^\$/) { M++; MW[M] = tok; MFILE[M] = FILENAME; MLINE[M] = FNR }
    line = substr(line, RSTART + RLENGTH)
  }
  next
}
{
  TEXT[FILENAME] = TEXT[FILENAME] $0 "\n"
  sc = scopeof(FILENAME)
  if (match($0, /^[ \t]*(function[ \t]+)?[A-Za-z_][A-Za-z0-9_.:-]*[ \t]*\(\)/)) {
    f = substr($0, RSTART, RLENGTH); sub(/^[ \t]*(function[ \t]+)?/, "", f); sub(/[ \t]*\(\)$/, "", f); FUNCS[f] = 1
  }
  # Assignments NAME=value, NAME="value" (may span lines): to expand install lists.
  if (inassign) {
    val = val "\n" $0
    if (index($0, q)) { sub(q ".*", "", val); VAR[aname] = val; inassign = 0 }
  } else if (match($0, /^[ \t]*((local|export|readonly)[ \t]+)?[A-Za-z_][A-Za-z0-9_]*=/)) {
    aname = substr($0, RSTART, RLENGTH - 1); sub(/^[ \t]*((local|export|readonly)[ \t]+)?/, "", aname)
    val = substr($0, RSTART + RLENGTH); q = substr(val, 1, 1)
    if (q == "\"" || q == "\047") {
      val = substr(val, 2)
      if (index(val, q)) { sub(q ".*", "", val); VAR[aname] = val } else inassign = 1
    } else { sub(/[ \t;].*/, "", val); VAR[aname] = val }
  }
  # Install loops: "for p in LIST; do", then a dpkg-query "install ok installed" test.
  if (pendfor != "" && $0 ~ /dpkg-query/ && $0 ~ /install ok installed/) { NL++; LOOP[NL] = pendfor; LOOPSC[NL] = sc; LOOPAT[NL] = FILENAME ":" FNR - 1 }
  pendfor = ""
  if (match($0, /^[ \t]*for[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]+in[ \t]+.*;[ \t]*do[ \t]*$/)) {
    pendfor = $0; sub(/^[ \t]*for[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]+in[ \t]+/, "", pendfor); sub(/;[ \t]*do[ \t]*$/, "", pendfor)
  }
}
# Expands $NAME and ${NAME} from the scripts assignments (two rounds: a value may name another).
function expand(s,    r, k, nm, out) {
  for (r = 0; r < 2; r++) {
    out = ""
    while (match(s, /\$\{?[A-Za-z_][A-Za-z0-9_]*\}?/)) {
      nm = substr(s, RSTART, RLENGTH); gsub(/[${}]/, "", nm)
      out = out substr(s, 1, RSTART - 1) VAR[nm]; s = substr(s, RSTART + RLENGTH)
    }
    s = out s
  }
  return s
}
function addpkg(sc, p, why,    t, n, k) {
  if (!((sc, p) in PKG)) PKG[sc, p] = why
  if (p in IMPLIED) {
    n = split(IMPLIED[p], t, ",")
    for (k = 1; k <= n; k++) if (!((sc, t[k]) in PKG)) PKG[sc, t[k]] = "implied by " p
  }
}
# normpath("tools/bench/../e2e/run.sh") = "tools/e2e/run.sh"
function normpath(p,    n, t, k, out, o) {
  n = split(p, t, "/"); o = 0
  for (k = 1; k <= n; k++) {
    if (t[k] == "" || t[k] == ".") continue
    if (t[k] == ".." && o > 0 && out[o] != "..") { o--; continue }
    out[++o] = t[k]
  }
  p = ""
  for (k = 1; k <= o; k++) p = p (k > 1 ? "/" : "") out[k]
  return p
}
# The script a reference names: a literal path from the top of the tree (the scripts cd
# there) or from the script own directory; after an expansion ($(dirname "$0")/lib.sh,
# $E2E_TOOLS/images.sh, "$here/../e2e/run.sh"), the literal tail from the script directory,
# else from the top of the tree ("$E2E_SRC/tools/vmlinuz-payload.sh").
# "" when it names no script here (a build output, a file in the cache).
function resolve(w, from,    dir, tail, p) {
  dir = from; sub(/\/[^\/]*$/, "", dir)
  if (w !~ /\$/) {
    if (w ~ /^\//) return ""
    p = normpath(w); if (p in TEXT) return p
    p = normpath(dir "/" w); return (p in TEXT) ? p : ""
  }
  tail = w
  sub(/^.*(\$\{[^}]*\}|\$\([^)]*\)|\$[A-Za-z_][A-Za-z0-9_]*|\$[0-9@*#?$!-])/, "", tail)
  if (tail !~ /^\//) return ""
  p = normpath(dir tail); if (p in TEXT) return p
  p = normpath(tail); return (p in TEXT) ? p : ""
}
function fail(msg) { print "check-host-commands: " msg > "/dev/stderr"; BAD++ }
END {
  for (k = 1; k <= NL; k++) {
    n = split(expand(LOOP[k]), t, /[ \t\n]+/)
    for (j = 1; j <= n; j++) {
      p = t[j]; gsub(/["\047]/, "", p)
      if (p ~ /^[a-z0-9][a-z0-9.+-]+$/) { addpkg(LOOPSC[k], p, "installed by " LOOPAT[k]); SEEN[LOOPSC[k]]++ }
    }
  }
  if (!SEEN["main"]) fail("no install loop found in tools/install-deps.sh (its package list cannot be read)")
  if (!SEEN["e2e"]) fail("no install loop found in tools/e2e (E2E_HOST_PKGS cannot be read)")

  for (k = 1; k <= NFILES; k++) {
    FILE = FILES[k]
    if (!(FILE in TEXT)) continue
    SCOPE = scopeof(FILE); S = TEXT[FILE]; CL = 1; LINE = 1; HDN = 0
    lex(1, 0, 0)
  }
  # Reachability from ENTRY over the references, per scope: a script under tools/e2e or
  # tools/bench runs in the e2e scope; any other runs in the scope of each script that runs
  # it (tools/vmlinuz-payload.sh: main from fetch-debian-kernels.sh, e2e from run.sh), and its
  # commands must come from the packages of that scope.
  n = split(ENVIRON["XP_ENTRY"], t, /[ \t\n]+/)
  for (j = 1; j <= n; j++) if (t[j] != "") {
    if (t[j] in TEXT) { REACH[t[j]] = 1; RSC[t[j], scopeof(t[j])] = 1 }
    else fail("ENTRY names " t[j] ", which is no shell script here: update ENTRY in tools/check-host-commands.sh")
  }
  do {
    more = 0
    for (k = 1; k <= RN; k++) {
      if (!(RFROM[k] in REACH)) continue
      f = resolve(RTO[k], RFROM[k])
      if (f == "") continue
      for (ns = 1; ns <= 2; ns++) {
        sc = (ns == 1) ? "main" : "e2e"
        if (!((RFROM[k], sc) in RSC)) continue
        if (scopeof(f) == "e2e") sc = "e2e"
        if (!((f, sc) in RSC)) { RSC[f, sc] = 1; REACH[f] = 1; more = 1 }
      }
    }
  } while (more)
  for (k = 1; k <= M; k++) {
    if (MW[k] in TARGET) continue
    N++; CW[N] = MW[k]; CDYN[N] = 0; CFILE[N] = MFILE[k]; CLINE[N] = MLINE[k]; CSCOPE[N] = "main"
  }

  for (k = 1; k <= N; k++) {
    if ((CFILE[k] in TEXT) && !(CFILE[k] in REACH)) continue
    USES++
    w = CW[k]; at = CFILE[k] ":" CLINE[k]
    if (ENVIRON["XP_MODE"] == "words") printf "%s\t%s%s\n", at, w, (CDYN[k] ? "\t(variable)" : "") > "/dev/stderr"
    if (CDYN[k]) {
      # A path under a variable ($E2E_TOOLS/images.sh, "$here/../e2e/run.sh", a build dir):
      # a file of the tree (followed above when it is a script), a build output or what the
      # harness unpacks into its cache.
      if (w ~ /\//) continue
      v = w; sub(/^\$\{?/, "", v); sub(/[^A-Za-z0-9_].*$/, "", v)
      if (!(v in DYNMAP)) { fail(at ": runs the command held in $" v " (" w "): name the program it holds in DYNAMIC in tools/check-host-commands.sh"); continue }
      if (DYNMAP[v] == "-") continue
      w = DYNMAP[v]
    }
    if (w in BUILTIN || w in FUNCS) continue
    if (w ~ /\//) { if (w !~ /^\//) continue; sub(/.*\//, "", w) }
    if (!(w in MAP)) { fail(at ": runs \"" w "\", which is not in MAP in tools/check-host-commands.sh: add it with the Debian package that ships it (dpkg -S $(command -v " w "))"); continue }
    p = MAP[w]; USED[w] = 1
    for (ns = 1; ns <= 2; ns++) {
      sc = (ns == 1) ? "main" : "e2e"
      if (CFILE[k] in TEXT) { if (!((CFILE[k], sc) in RSC)) continue }
      else if (sc != CSCOPE[k]) continue
      if (!((sc, p) in PKG)) {
        fail(at ": runs \"" w "\" from package " p ", which no install list of its scope (" sc ") names: add " p \
             (sc == "e2e" ? " to E2E_HOST_PKGS in tools/e2e/lib.sh" : " to tools/install-deps.sh"))
        continue
      }
      if (!((w, sc) in FIRST)) { FIRST[w, sc] = at; LIST[++NLIST] = w SUBSEP sc }
    }
  }
  if (ENVIRON["XP_MODE"] != "check")
    for (k = 1; k <= NFILES; k++)
      if ((FILES[k] in TEXT) && !(FILES[k] in REACH))
        print "check-host-commands: not checked (no entry point runs it): " FILES[k] > "/dev/stderr"
  if (ENVIRON["XP_MODE"] != "check") {
    for (k = 1; k <= NLIST; k++) {
      split(LIST[k], t, SUBSEP)
      printf "%s\t%s\t%s\t%s\t%s\n", t[1], MAP[t[1]], t[2], PKG[t[2], MAP[t[1]]], FIRST[t[1], t[2]]
    }
  }
  for (w in MAP) if (!(w in USED)) fail("MAP names \"" w "\", which no host script runs any more: drop it")
  if (BAD) exit 1
  for (f in REACH) NREACH++
  printf "check-host-commands: %d command uses in %d scripts and %d CMake files; every program comes from an installed package\n", USES, NREACH, NCMAKE > "/dev/stderr"
}
' $files >"$tmp" || { rm -f "$tmp"; exit 1; }
out=$(cat "$tmp")
rm -f "$tmp"
case "$mode" in
  list) printf '%s\n' "$out" | LC_ALL=C sort ;;
  verify)
    # Which package ships each command found here (merged /usr: dpkg may know /bin/x only).
    tab=$(printf '\t')
    wrong=$(printf '%s\n' "$out" | cut -f1,2 | LC_ALL=C sort -u | while IFS="$tab" read -r cmd pkg; do
      path=$(command -v "$cmd" || true)
      case "$path" in /*) ;; *) echo "check-host-commands: --verify: $cmd is not on this machine (MAP: $pkg)" >&2; continue ;; esac
      # The name first (/usr/bin/gcc is gcc's symlink to gcc-12's file), then its target
      # (/usr/bin/awk is an alternative, mawk's file).
      real=$(readlink -f "$path")
      owner=""
      for p in "$path" "${path#/usr}" "$real" "${real#/usr}"; do
        owner=$(dpkg -S "$p" 2>/dev/null | grep -v '^diversion by' | sed 's/: .*//' | head -n 1)
        [ -z "$owner" ] || break
      done
      case ", $owner," in
        *", $pkg,"* | *", $pkg:"*) echo "check-host-commands: --verify: $cmd ($path) is from $pkg" >&2 ;;
        *) echo "$cmd ($path) is from '${owner:-no package}', MAP says $pkg" ;;
      esac
    done)
    if [ -n "$wrong" ]; then
      printf 'check-host-commands: --verify: wrong MAP entry: %s\n' "$wrong" >&2
      exit 1
    fi
    ;;
esac
exit 0

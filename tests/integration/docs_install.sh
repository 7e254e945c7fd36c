#!/usr/bin/env bash
# Installing from the documented build, as the docs say it, in order. For docs/getting-started.md section 1
# and docs/embedding.md "Building against the installed package": reads the sh block, takes its build
# command (the target it builds) and its install command, then
#   1. proves the documented build produces every file the install copies from the build tree: each is an
#      output of the documented target's build graph (`ninja -t commands TARGET`), or written by configure;
#   2. runs the documented install command on this build tree, into a temporary prefix instead of the
#      documented one, and checks what a user then has: bin/strata runs, the C header, library, CMake
#      package and strata.pc are there, and a C program builds against the installed package with pkg-config.
#   docs_install.sh SOURCE_DIR BUILD_DIR CC
set -uo pipefail
src=$1 build=$2 cc=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 runs=0
check() { runs=$((runs + 1)); [ "$2" -eq 0 ] || { echo "FAIL: $1: $3"; fails=$((fails + 1)); }; }

# block DOC HEADING: the first sh block after the heading.
block() { awk -v h="$2" 'index($0, h) == 1 {f = 1} f && /^```sh/ {b = 1; next} b && /^```/ {exit} b' "$1"; }

for doc in "docs/getting-started.md|## 1. Install and build" "docs/embedding.md|## Building against the installed package"; do
  file=${doc%%|*} heading=${doc#*|}
  cmds=$(block "$src/$file" "$heading")
  target=$(grep -oE -- '(--target |ninja -C [^ ]+ )[a-z_]+' <<<"$cmds" | awk '{print $NF}' | head -1)
  install=$(grep -E '^cmake --install' <<<"$cmds" | head -1)
  [ -n "$target" ] && [ -n "$install" ] && [ "$(grep -n -- "$target" <<<"$cmds" | head -1 | cut -d: -f1)" -lt \
    "$(grep -n '^cmake --install' <<<"$cmds" | cut -d: -f1)" ]
  check "$file shows a build of a target, then cmake --install" $? "target '$target', install '$install': $cmds"
  [ -n "$target" ] || continue

  # 1. Every build-tree file the install copies is built by the documented target (or by configure).
  ninja -C "$build" -t commands "$target" > "$work/commands.txt" 2>&1
  out=$(python3 - "$build" "$work/commands.txt" <<'PY'
import os, re, subprocess, sys
build, commands = os.path.realpath(sys.argv[1]), open(sys.argv[2]).read()
listing = subprocess.run(["ninja", "-C", build, "-t", "targets", "all"], capture_output=True, text=True).stdout
outputs = {line.split(":")[0] for line in listing.splitlines()}
copied = set()
for root, _, files in os.walk(build):
    for f in files:
        if f == "cmake_install.cmake":
            text = open(os.path.join(root, f)).read()
            for head, clause in re.findall(r"file\(INSTALL ([^)]*)FILES ([^)]*)\)", text):
                if "OPTIONAL" in head:
                    continue  # installed when built (the CLI, after an embedder's build of strata_capi alone)
                copied.update(p for p in re.findall(r'"([^"]+)"', clause) if p.startswith(build + "/"))
if not copied:
    sys.exit("no install rule copies a file from the build tree")
bad = []
for p in sorted(copied):
    rel = os.path.relpath(p, build)
    if rel not in outputs:
        continue  # written by configure (package files, strata.pc)
    if f"-o {rel}" not in commands and f" {rel}" not in commands:
        bad.append(rel)
if bad:
    sys.exit("the documented target does not build: " + ", ".join(bad))
print(f"{len(copied)} installed build-tree files, all built by the target or by configure")
PY
)
  check "$file: building '$target' builds what cmake --install copies ($out)" $? "$out"
done

# 2. The documented install (getting-started's), into a temporary prefix.
install=$(block "$src/docs/getting-started.md" "## 1. Install and build" | grep -E '^cmake --install' | head -1)
prefix=$work/prefix
cmd=$(sed -E "s#build/release#$build#; s#--prefix +[^ ]+#--prefix $prefix#; s/ +#.*//" <<<"$install")
out=$(cd "$src" && eval "$cmd" 2>&1)
check "the documented install runs: $cmd" $? "$out"
for f in bin/strata include/strata/strata.h; do
  [ -e "$prefix/$f" ]; check "installed $f" $? "$(find "$prefix" | head -20)"
done
ls "$prefix"/lib*/libstrata.so.* > /dev/null 2>&1; check "installed libstrata.so" $? "$(find "$prefix" | head -20)"
pc=$(find "$prefix" -name strata.pc); [ -n "$pc" ]; check "installed strata.pc" $? "$(find "$prefix")"
find "$prefix" -name strataConfig.cmake | grep -q .; check "installed the CMake package" $? "$(find "$prefix")"
out=$("$prefix/bin/strata" --help 2>&1 | head -1); [ "$out" = "usage: strata <command> [flags]" ]
check "the installed strata runs" $? "$out"
export PKG_CONFIG_PATH=${pc%/*}
# shellcheck disable=SC2046
out=$("$cc" -std=c99 "$src/examples/embed_c/embed_c.c" $(pkg-config --cflags --libs strata) -lm -o "$work/embed" 2>&1)
check "a C program builds against the installed package" $? "$out"
echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]

#!/usr/bin/env bash
# Runs CMD as on a machine with no MPI installed (docs/decisions/0041-mpi-backend-module.md): in a new user and
# mount namespace (unshare --user --map-root-user --mount, no privilege needed), the system library directory
# /usr/lib/x86_64-linux-gnu is covered by a copy of itself made of symlinks that leaves out Open MPI's libraries
# (libmpi*, libopen-pal*, libopen-rte*, libompitrace*, libmca_common*, libpmix*, openmpi/, pmix2/), so that neither
# the dynamic loader (by name, by path or through ld.so.cache) nor dlopen finds them; each directory named in
# WITHOUT_MPI_HIDE (colon-separated: mpi4py's package, say) is covered by an empty tmpfs. Nothing outside the
# namespace changes; the namespace ends with CMD.
#   tests/python/without_mpi.sh CMD [ARGS...]      exit status: CMD's; 97 when the namespace cannot be made
# Limits: only that one directory is filtered (where Debian and Ubuntu's Open MPI lives); an MPI installed
# elsewhere (/usr/local, /opt) stays visible, and the caller checks that libmpi really cannot be loaded.
set -euo pipefail
libdir=/usr/lib/x86_64-linux-gnu
if [ "${1:-}" != --inside ]; then
  stash=$(mktemp -d)
  rc=0
  unshare --user --map-root-user --mount "$0" --inside "$stash" "$@" || rc=$?
  rmdir "$stash" 2>/dev/null || true
  exit "$rc"
fi
stash=$2
shift 2
mount -t tmpfs none "$stash" || { echo "without_mpi.sh: cannot mount in a user namespace" >&2; exit 97; }
mkdir "$stash/orig" "$stash/farm"
mount --bind "$libdir" "$stash/orig"
# The farm is made before it covers the directory: every program run below still finds its libraries.
for f in "$stash/orig"/* "$stash/orig"/.[!.]*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  name=${f##*/}
  case $name in
    libmpi*|libopen-pal*|libopen-rte*|libompitrace*|libmca_common*|libpmix*|openmpi|pmix2) continue ;;
  esac
  ln -s "$f" "$stash/farm/$name"
done
mount --bind "$stash/farm" "$libdir"
IFS=: read -r -a hide <<<"${WITHOUT_MPI_HIDE:-}"
for d in "${hide[@]}"; do
  [ -n "$d" ] && mount -t tmpfs none "$d"
done
exec "$@"

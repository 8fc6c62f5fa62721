#!/usr/bin/env bash
# Prints the Debian packages that own the shared libraries the given executables load (one name a line, sorted),
# so the Dockerfile's runtime stage installs exactly what the binaries need while the build package list stays in
# scripts/setup alone. Libraries found through alternatives symlinks (libblas.so.3 -> OpenBLAS) are resolved to
# the real file first. Usage: deploy/runtime-packages.sh build/diloco-coordinator build/diloco-worker ...
set -euo pipefail
(($#)) || { echo "usage: $0 EXECUTABLE..." >&2; exit 2; }

owner() {  # owner PATH: the package owning PATH, trying the usrmerge twin (/lib <-> /usr/lib) too
  local p=$1 alt
  case "$p" in /usr/*) alt=${p#/usr} ;; *) alt=/usr$p ;; esac
  for candidate in "$p" "$alt"; do
    dpkg-query -S "$candidate" 2>/dev/null | head -1 | cut -d: -f1 && return 0
  done
  return 1
}

deps=$(ldd "$@")
if grep -q "not found" <<<"$deps"; then
  echo "$0: unresolved libraries:" >&2
  grep "not found" <<<"$deps" >&2
  exit 1
fi
# "lib.so => /path (addr)" lines, and the loader's "/path (addr)" line; not the "FILE:" headers of several files.
libs=$(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' <<<"$deps" | sort -u)
[ -n "$libs" ] || { echo "$0: ldd found no shared libraries in $*" >&2; exit 1; }
packages=()
status=0
for lib in $libs; do
  real=$(readlink -f "$lib")
  if pkg=$(owner "$real") || pkg=$(owner "$lib"); then
    packages+=("$pkg")
  else
    echo "$0: no Debian package owns $lib ($real)" >&2
    status=1
  fi
done
printf '%s\n' "${packages[@]}" | sort -u
exit "$status"

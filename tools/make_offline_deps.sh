#!/usr/bin/env bash
# Builds a relocatable dependency prefix from this machine's Debian packages, for
# building bonsai on a machine that has a compiler (and CUDA) but no package
# manager and no network (the GPU machine; docs/building.md, "Offline build").
#
#   tools/make_offline_deps.sh [PREFIX]        # default: <repo>/.deps (ignored by git)
#
# Copies the installed files (dpkg -L) of the header, library, CMake-config and
# pkg-config packages bonsai needs, plus pkgconf itself, keeping their paths
# relative to /usr, then makes them relocatable:
#   - .pc files: prefix=/usr -> prefix=${pcfiledir}/<up to PREFIX>
#   - CMake configs are already relocatable
#   - PREFIX/env.sh: PKG_CONFIG_*, PATH and LD_LIBRARY_PATH for the prefix
# Then on the other machine:
#   source .deps/env.sh
#   cmake -S . -B build/x -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.deps -DCMAKE_BUILD_TYPE=Release
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-$repo/.deps}
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)

# headers / CMake configs / .pc files, and the shared libraries they (and bonsai's
# executables) load at run time that a CUDA image may lack.
packages=(
  libfmt-dev libfmt9
  libspdlog-dev libspdlog1.10
  nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev libbenchmark1debian
  libpcre2-dev libpcre2-8-0
  libedit-dev libedit2 libbsd0 libmd0 libtinfo6
  pkgconf pkgconf-bin libpkgconf3
)

rm -rf "$prefix"
mkdir -p "$prefix"
for p in "${packages[@]}"; do
  if ! dpkg -s "$p" >/dev/null 2>&1; then
    echo "make_offline_deps: package $p is not installed here (apt-get install $p)" >&2
    exit 1
  fi
  # Files under /usr (or /lib, which is /usr/lib on merged-/usr systems), not docs or man pages.
  while IFS= read -r f; do
    case "$f" in
      /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/* | /usr/src/*) continue ;;
      /usr/*) rel=${f#/usr/} ;;
      /lib/*) rel=lib/${f#/lib/} ;;
      *) continue ;;
    esac
    if [ -L "$f" ] || [ -f "$f" ]; then
      mkdir -p "$prefix/$(dirname "$rel")"
      cp -a "$f" "$prefix/$rel"
    fi
  done < <(dpkg -L "$p")
done

# pkg-config files: prefix relative to the file's own folder.
while IFS= read -r pc; do
  dir=$(dirname "${pc#"$prefix"/}")
  up=$(echo "$dir" | awk -F/ '{s=""; for (i = 1; i <= NF; ++i) s = s (i > 1 ? "/" : "") ".."; print s}')
  sed -i "s|^prefix=/usr\$|prefix=\${pcfiledir}/$up|" "$pc"
done < <(find "$prefix" -name '*.pc')

# CMake configs need no edit: they compute their prefix from their own location (the
# absolute /usr paths in them only apply when loaded from /usr itself).

# pkg-config is a link to pkgconf on Debian; make sure the prefix has both names.
[ -e "$prefix/bin/pkg-config" ] || ln -s pkgconf "$prefix/bin/pkg-config"

cat >"$prefix/env.sh" <<EOF
# source this file before configuring bonsai against this prefix
_deps=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
export PKG_CONFIG_LIBDIR=\$_deps/lib/$arch/pkgconfig:\$_deps/share/pkgconfig
export PKG_CONFIG_PATH=\$PKG_CONFIG_LIBDIR
export PATH=\$_deps/bin:\$PATH
export LD_LIBRARY_PATH=\$_deps/lib/$arch\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
EOF

# Keep the prefix out of git.
exclude="$repo/.git/info/exclude"
if [ -d "$repo/.git" ] && ! grep -qx '/.deps/' "$exclude" 2>/dev/null; then
  mkdir -p "$(dirname "$exclude")"
  echo '/.deps/' >>"$exclude"
fi
echo "make_offline_deps: $(du -sh "$prefix" | cut -f1) in $prefix"

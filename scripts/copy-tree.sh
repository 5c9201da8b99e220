#!/bin/sh
# Copies the source tree SRC to DEST (emptied first): in a git checkout the
# files git tracks plus the untracked ones it does not ignore, elsewhere
# everything but build/, .git and gpu-bundle/. Builds that must not touch
# the source tree (sanitizers, the GPU bundle) work on such a copy.
# usage: scripts/copy-tree.sh SRC DEST
set -u
[ $# -eq 2 ] || { echo "usage: $0 SRC DEST" >&2; exit 2; }
src=$1 dest=$2
rm -rf "$dest" && mkdir -p "$dest" || exit 1
if command -v git >/dev/null 2>&1 && git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" ls-files -z --cached --others --exclude-standard |
    (cd "$src" && xargs -0 cp --parents -t "$dest")
else
  (cd "$src" && tar cf - --exclude=./build --exclude=./.git --exclude=./gpu-bundle .) | (cd "$dest" && tar xf -)
fi

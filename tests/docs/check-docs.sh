#!/bin/sh
# The documentation's checks: the manual builds without a warning, the
# generated pages hold what they must (every public function, every
# setting), the settings page's table is base/params.def's, and every
# command the README shows exists. One PASS/FAIL/SKIP line per check.
#
# usage: tests/docs/check-docs.sh BUILDDIR   (hora-info built there)
set -u
builddir=$(cd "${1:-.}" && pwd)
srcdir=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
page="$srcdir/docs/settings.md"

# ---- The settings page's table is hora-info --settings-md's (then the
# python and test rows, written by hand; `make docs-settings` rewrites it).
awk '/<!-- settings-table-begin -->/{on=1;next}/<!-- settings-table-end -->/{on=0}on' \
  "$page" >"$work/page-table.md"
if "$builddir/hora-info" --settings-md >"$work/table.md" &&
   head -n "$(wc -l <"$work/table.md")" "$work/page-table.md" | diff -u "$work/table.md" - >"$work/diff"; then
  echo "PASS docs/settings_table_matches_params_def"
else
  echo "FAIL docs/settings_table_matches_params_def: docs/settings.md differs from hora-info --settings-md (make docs-settings)"
  head -n 20 "$work/diff"
fi
# Every row has the header's cells (the Horovod column included: the
# python and test rows are written by hand).
bad_rows=$(sed 's/\\|//g' "$work/page-table.md" | awk -F'|' 'NR == 1 { n = NF } NF != n { print NR ": " $2 }')
if [ -z "$bad_rows" ]; then
  echo "PASS docs/settings_rows_have_every_column"
else
  echo "FAIL docs/settings_rows_have_every_column: rows of another width:" $bad_rows
fi
# The HOROVOD_* variables hora ignores at warn level are named on the page.
missing=$("$builddir/hora-info" --horovod | awk '$2 == "warn:" { print $1 }' |
  while read -r v; do grep -qF "\`$v\`" "$page" || echo "$v"; done)
if [ -z "$missing" ] && "$builddir/hora-info" --horovod | grep -q "^HOROVOD_AUTOTUNE"; then
  echo "PASS docs/settings_page_names_ignored_horovod_variables"
else
  echo "FAIL docs/settings_page_names_ignored_horovod_variables: not in docs/settings.md:" $missing
fi
# Every HORA_* variable a test script or program reads is in the table too.
missing=$(find "$srcdir/tests" "$srcdir/scripts" "$srcdir/examples" \( -name '*.sh' -o -name '*.c' \) -print0 |
  xargs -0 grep -ohE '[$][{]HORA_[A-Z0-9_]+|getenv[(]"HORA_[A-Z0-9_]+' | sed 's/.*HORA_/HORA_/' | sort -u |
  while read -r v; do grep -q "^| \`$v\` |" "$work/page-table.md" || echo "$v"; done)
if [ -z "$missing" ]; then
  echo "PASS docs/settings_table_names_every_test_setting"
else
  echo "FAIL docs/settings_table_names_every_test_setting: not in docs/settings.md's table:" $missing
fi

# ---- `make docs` builds the manual with warnings as errors (into a scratch
# folder, so the check leaves no output in the tree).
if ! command -v sphinx-build >/dev/null 2>&1 ||
   ! /usr/bin/python3 -c 'import myst_parser' 2>/dev/null; then
  echo "SKIP docs/manual_builds_without_warnings: sphinx-build or myst_parser missing (scripts/install-deps.sh installs them)"
  echo "SKIP docs/reference_has_every_public_function: the manual was not built"
  echo "SKIP docs/settings_page_has_every_setting: the manual was not built"
else
  if make -s -C "$builddir" docs DOCS_BUILDDIR="$work" >"$work/sphinx.log" 2>&1 &&
     [ -s "$work/html/index.html" ]; then
    echo "PASS docs/manual_builds_without_warnings"
  else
    echo "FAIL docs/manual_builds_without_warnings: make docs (sphinx-build -W) failed"
    tail -n 20 "$work/sphinx.log"
  fi
  # Every HORA_EXTERN function of the public headers is in the reference.
  names=$(cat "$srcdir"/include/hora.h "$srcdir"/include/hora_mpi.h "$srcdir"/include/hora_cuda.h |
    grep -oE 'HORA_EXTERN[^(]*[^a-z0-9_]hora_[a-z0-9_]+[(]' | grep -oE 'hora_[a-z0-9_]+[(]$' | tr -d '(' | sort -u)
  count=$(echo "$names" | grep -c .)
  missing=$(echo "$names" | while read -r f; do
    grep -qw "$f" "$work/html/api.html" 2>/dev/null || echo "$f"; done)
  if [ -z "$missing" ] && [ "$count" -gt 50 ]; then
    echo "PASS docs/reference_has_every_public_function ($count functions)"
  else
    echo "FAIL docs/reference_has_every_public_function: not in api.html (of $count):" $missing
  fi
  # Every setting of base/params.def is on the built settings page.
  missing=$(grep -oE '^\| `HORA_[A-Z0-9_]+`' "$work/table.md" | tr -d '|` ' | while read -r v; do
    grep -qw "$v" "$work/html/settings.html" 2>/dev/null || echo "$v"; done)
  if [ -z "$missing" ] && [ -s "$work/table.md" ]; then
    echo "PASS docs/settings_page_has_every_setting"
  else
    echo "FAIL docs/settings_page_has_every_setting: not in settings.html:" $missing
  fi
fi

# ---- Every command the README's ```sh blocks show exists: the first word
# of each command (after any VAR=value) is a file of the tree, a program
# the build makes, a shell builtin or a program on PATH. Slurm's commands
# count only where Slurm is installed.
awk '/^```sh/{on=1;next}/^```/{on=0}on' "$srcdir/README.md" |
  sed -e 's/[[:space:]]#.*//' -e '/^[[:space:]]*#/d' |
  awk '{ if (cont) line = line " " $0; else line = $0 }
       /\\$/ { sub(/\\$/, "", line); cont = 1; next }
       { cont = 0; print line }' |
  sed -e 's/&&/\n/g' -e 's/||/\n/g' -e 's/;/\n/g' -e 's/|/\n/g' >"$work/commands"
bad='' absent='' n=0
while read -r line; do
  set -f
  # shellcheck disable=SC2086
  set -- $line
  set +f
  while [ $# -gt 0 ] && expr "$1" : '[A-Za-z_][A-Za-z0-9_]*=' >/dev/null; do shift; done
  [ $# -gt 0 ] || continue
  cmd=$1 n=$((n + 1))
  case "$cmd" in
    */*) [ -e "$srcdir/$cmd" ] || [ -e "$builddir/$cmd" ] || bad="$bad $cmd" ;;
    srun|sbatch) command -v "$cmd" >/dev/null 2>&1 || absent="$absent $cmd" ;;
    *) command -v "$cmd" >/dev/null 2>&1 || [ -x "$builddir/$cmd" ] || bad="$bad $cmd" ;;
  esac
done <"$work/commands"
if [ -n "$bad" ] || [ "$n" -eq 0 ]; then
  echo "FAIL docs/readme_commands_exist: not found:$bad"
elif [ -n "$absent" ]; then
  echo "PASS docs/readme_commands_exist ($n commands; Slurm not installed here, so not:$absent)"
else
  echo "PASS docs/readme_commands_exist ($n commands)"
fi

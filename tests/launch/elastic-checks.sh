# The verdicts tests/launch/check-elastic.sh and check-elastic-defects.sh
# share, sourced by both: they read $work, $steps and the script's own
# show NAME (what a failing check prints of the job).
# survivors CHECK NAME SIZE WHO...: each of WHO exited 0 and ended at SIZE
# with right sums; the others (killed) did not print a result.
survivors() {
  check=$1 name=$2 size=$3
  shift 3
  bad=""
  for who in "$@"; do
    rc=$(cat "$work/$name.$who.rc" 2>/dev/null || echo none)
    if [ "$rc" != 0 ] || ! grep -q "size $size resets [0-9]* step $steps\$" "$work/$name.$who"; then
      bad="$bad $who(rc $rc)"
    fi
    # Every survivor of a reset logs the change.
    if ! grep -q "resets 0 " "$work/$name.$who"; then
      grep -q "elastic: membership .*this process is rank" "$work/$name.$who.err" ||
        bad="$bad $who(no membership line)"
    fi
  done
  # One membership: every survivor names the same epoch and members.
  views=$(for who in "$@"; do grep '^membership ' "$work/$name.$who"; done | sort -u)
  [ "$(echo "$views" | wc -l)" = 1 ] || bad="$bad (different memberships: $(echo "$views" | tr '\n' ';'))"
  if [ -z "$bad" ]; then
    echo "PASS elastic/$check: ranks $* went on and ended with $size ranks, all in $views"
  else
    echo "FAIL elastic/$check: not as expected:$bad"
    show "$name"
  fi
}

# failed CHECK NAME PATTERN WHO...: each of WHO exited non-zero, its output matching PATTERN
failed() {
  check=$1 name=$2 pattern=$3
  shift 3
  bad=""
  for who in "$@"; do
    rc=$(cat "$work/$name.$who.rc" 2>/dev/null || echo none)
    if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -Eq "$pattern" "$work/$name.$who"; then
      bad="$bad $who(rc $rc)"
    fi
  done
  if [ -z "$bad" ]; then
    echo "PASS elastic/$check: $* failed with: $(grep -Eho "$pattern" "$work/$name.$1" | head -n 1)"
  else
    echo "FAIL elastic/$check: expected a failure matching '$pattern':$bad"
    show "$name"
  fi
}

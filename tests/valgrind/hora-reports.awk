# The reports of valgrind logs that belong to hora: MPI, PMIx and libevent
# report their own lost blocks and uninitialised bytes at every run; a
# report counts as hora's when one of its first frames past the allocator
# is a hora function (hora_*, hora__*) or a test's code.
# usage: awk -f hora-reports.awk LOG...
function flush() {
  if (n && mine) { print rec; found++ }
  rec = ""; n = 0; mine = 0; frames = 0
}
{ sub(/^==[0-9]+== ?/, "") }
/^$/ { flush(); next }
{
  rec = rec $0 "\n"; n++
  if ($0 ~ /^ *(at|by) 0x/) {
    if ($0 ~ /vgpreload|[(](strdup|malloc|calloc|realloc)[.]c|: (malloc|calloc|realloc|strdup|strndup|posix_memalign|aligned_alloc) /) next
    frames++
    if (frames <= 3 && $0 ~ /: (hora_|hora__|mt_|test_|main )|tests\//) mine = 1
  }
}
END { flush() }

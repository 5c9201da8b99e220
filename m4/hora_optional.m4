# HORA_CHECK_OPTIONAL_LIB(NAME, DESCRIPTION, DEFAULT-DIR, HEADER, LIB, FUNCTION,
#                         [EXTRA-CPPFLAGS], [EXTRA-LIBS])
# Adds --with-NAME[=DIR]. Default "check": used when found. "yes" or a DIR:
# configure stops with a clear message when it cannot be used. "no": off.
# Sets hora_NAME_found=yes|no, hora_NAME_dir, and substitutes
# NAME_CPPFLAGS, NAME_LDFLAGS and NAME_LIBS (upper-cased).
AC_DEFUN([HORA_CHECK_OPTIONAL_LIB], [
  m4_pushdef([UP], m4_toupper([$1]))
  AC_ARG_WITH([$1],
    [AS_HELP_STRING([--with-$1@<:@=DIR@:>@], [use $2 (default: check; DIR is its prefix)])],
    [], [with_$1=check])
  hora_$1_found=no
  hora_$1_dir=
  UP[]_CPPFLAGS=
  UP[]_LDFLAGS=
  UP[]_LIBS=
  AS_IF([test "$with_$1" != no], [
    AS_CASE([$with_$1],
      [yes|check], [hora_$1_dir="$3"],
      [hora_$1_dir="$with_$1"])
    hora_try_cppflags=
    hora_try_ldflags=
    AS_IF([test -n "$hora_$1_dir"], [
      hora_try_cppflags="-I$hora_$1_dir/include"
      for d in lib64 lib lib/x86_64-linux-gnu; do
        AS_IF([test -d "$hora_$1_dir/$d"], [hora_try_ldflags="$hora_try_ldflags -L$hora_$1_dir/$d -Wl,-rpath,$hora_$1_dir/$d"])
      done
    ])
    save_CPPFLAGS=$CPPFLAGS; save_LDFLAGS=$LDFLAGS; save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS $hora_try_cppflags $7"
    LDFLAGS="$LDFLAGS $hora_try_ldflags"
    LIBS="-l$5 $8 $LIBS"
    AC_MSG_CHECKING([for $2 ($4, -l$5)${hora_$1_dir:+ in $hora_$1_dir}])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <$4>]], [[(void)&$6;]])],
      [hora_$1_found=yes], [hora_$1_found=no])
    dnl An explicit DIR must hold the header itself, not just let the
    dnl compiler fall back to the system's copy.
    AS_CASE([$with_$1],
      [yes|check], [],
      [AS_IF([test "$hora_$1_found" = yes && test ! -f "$with_$1/include/$4"], [hora_$1_found=no])])
    AC_MSG_RESULT([$hora_$1_found])
    CPPFLAGS=$save_CPPFLAGS; LDFLAGS=$save_LDFLAGS; LIBS=$save_LIBS
    AS_IF([test "$hora_$1_found" = yes], [
      UP[]_CPPFLAGS="$hora_try_cppflags"
      UP[]_LDFLAGS="$hora_try_ldflags"
      UP[]_LIBS="-l$5"
    ], [
      hora_$1_dir=
      AS_IF([test "$with_$1" != check],
        [AS_CASE([$with_$1],
           [yes], [AC_MSG_ERROR([--with-$1 was given but $2 cannot be used: $4 or -l$5 not found${3:+ in $3} or the default paths])],
           [AC_MSG_ERROR([--with-$1=$with_$1 was given but $2 cannot be used: $with_$1/include/$4 or -l$5 in $with_$1/lib* not found])])])
    ])
  ])
  AC_SUBST(UP[]_CPPFLAGS)
  AC_SUBST(UP[]_LDFLAGS)
  AC_SUBST(UP[]_LIBS)
  m4_popdef([UP])
])

/* A tiny test runner. Assertions fail the current test (and stop it) even
 * in release builds; skips say why. Each test prints one line:
 *   PASS name | FAIL name: why | SKIP name: why
 */
#ifndef HORA_TEST_RUNNER_H
#define HORA_TEST_RUNNER_H

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

struct test_case {
  const char *name;
  void (*fn)(void);
};

extern jmp_buf test_jump;
extern char test_why[512];
extern int test_skipped;

#define TEST(name)           \
  void test_##name(void); \
  void test_##name(void)

#define FAIL(...)                                                                            \
  do {                                                                                       \
    snprintf(test_why, sizeof(test_why), __VA_ARGS__);                                       \
    longjmp(test_jump, 1);                                                                   \
  } while (0)

#define ASSERT(cond)                                                                         \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      FAIL("%s:%d: assertion failed: %s", __FILE__, __LINE__, #cond);                        \
    }                                                                                        \
  } while (0)

#define ASSERT_EQ_INT(a, b)                                                                  \
  do {                                                                                       \
    long long a_ = (long long)(a), b_ = (long long)(b);                                      \
    if (a_ != b_) {                                                                          \
      FAIL("%s:%d: %s == %lld, expected %s == %lld", __FILE__, __LINE__, #a, a_, #b, b_);    \
    }                                                                                        \
  } while (0)

#define ASSERT_STR_CONTAINS(hay, needle)                                                     \
  do {                                                                                       \
    const char *h_ = (hay);                                                                  \
    if (!h_ || !strstr(h_, (needle))) {                                                      \
      FAIL("%s:%d: '%s' does not contain '%s'", __FILE__, __LINE__, h_ ? h_ : "(null)",      \
           (needle));                                                                        \
    }                                                                                        \
  } while (0)

#define SKIP(...)                                                                            \
  do {                                                                                       \
    snprintf(test_why, sizeof(test_why), __VA_ARGS__);                                       \
    test_skipped = 1;                                                                        \
    longjmp(test_jump, 1);                                                                   \
  } while (0)

#endif

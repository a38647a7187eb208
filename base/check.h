// Invariant checks. The three failure tiers of this project:
//   1. The environment said no (full disk, bad request, no GPU): return absl::Status,
//      with a message a user can act on. Never a CHECK.
//   2. Our own invariant broke: TIERD_CHECK. On in every build, including release;
//      prints the condition and location, then aborts (a core beats corrupt data).
//   3. Costly whole-structure checks: TIERD_DCHECK, compiled out under NDEBUG.
#ifndef TIERD_BASE_CHECK_H_
#define TIERD_BASE_CHECK_H_

namespace tierd::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              const char* detail);
}  // namespace tierd::internal

#define TIERD_CHECK(condition)                                                   \
  do {                                                                           \
    if (__builtin_expect(!(condition), 0))                                       \
      ::tierd::internal::CheckFailed(__FILE__, __LINE__, #condition, nullptr);   \
  } while (0)

// Checks that an absl::Status-like expression is ok; prints its message if not.
#define TIERD_CHECK_OK(expression)                                                   \
  do {                                                                               \
    const auto& tierd_check_status_ = (expression);                                  \
    if (__builtin_expect(!tierd_check_status_.ok(), 0))                              \
      ::tierd::internal::CheckFailed(__FILE__, __LINE__, #expression,                \
                                     std::string(tierd_check_status_.ToString()).c_str()); \
  } while (0)

#ifdef NDEBUG
#define TIERD_DCHECK(condition) \
  do {                          \
  } while (false && (condition))
#else
#define TIERD_DCHECK(condition) TIERD_CHECK(condition)
#endif

#endif  // TIERD_BASE_CHECK_H_

// SMLA_ASAN / SMLA_TSAN: 1 under AddressSanitizer / ThreadSanitizer, from GCC's macros or
// Clang's __has_feature (Clang 14 defines neither of GCC's).
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define SMLA_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define SMLA_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(SMLA_ASAN)
#define SMLA_ASAN 1
#endif
#if __has_feature(thread_sanitizer) && !defined(SMLA_TSAN)
#define SMLA_TSAN 1
#endif
#endif

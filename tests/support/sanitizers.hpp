// Whether this test binary runs under AddressSanitizer or ThreadSanitizer: g++
// says so with __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, clang with
// __has_feature. A sanitizer catches a fault itself and exits with its report,
// so death tests of faults expect that report rather than the signal; and
// ThreadSanitizer's layout leaves less address space, and checks every byte the
// simulator's device work touches, so some scenarios run smaller under it.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define GPUMEM_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GPUMEM_TEST_TSAN 1
#endif
#endif
#ifndef GPUMEM_TEST_TSAN
#define GPUMEM_TEST_TSAN 0
#endif

#if defined(__SANITIZE_ADDRESS__) || GPUMEM_TEST_TSAN
#define GPUMEM_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GPUMEM_TEST_SANITIZED 1
#endif
#endif
#ifndef GPUMEM_TEST_SANITIZED
#define GPUMEM_TEST_SANITIZED 0
#endif

// Clang thread-safety annotations (-Wthread-safety): which mutex guards which member, and
// which functions must or must not hold it. They expand to nothing for other compilers; the
// clang-tsa build in CI checks them.
#pragma once

#if defined(__clang__)
#define KVC_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVC_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) KVC_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY KVC_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) KVC_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) KVC_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) KVC_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) KVC_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) KVC_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) KVC_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) KVC_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) KVC_THREAD_ANNOTATION(assert_capability(x))
#define NO_THREAD_SAFETY_ANALYSIS KVC_THREAD_ANNOTATION(no_thread_safety_analysis)

// kiln native extension: the C ABI boundary shared by every translation unit.
//
// Errors. Each exported function returns nullptr on success or a malloc'd, NUL-terminated
// error string that Rust takes ownership of and frees (the whole string, once) with
// kiln_free_string. Its first byte is the error's kind (a kiln::ErrorKind code, never 0) and
// the message follows: "\x02CUDA out of memory. Tried to allocate ...". src/ffi.rs (check,
// ErrorKind::from_code) decodes it; the codes there must match these. No C++ exception ever
// crosses into Rust: KILN_TRY/KILN_CATCH wrap every body, and current_error() sorts what was
// thrown into a kind by its type, never by its text. (libtorch's CPU allocator fails with a
// plain c10::Error, a CAFFE_ENFORCE; Rust's decoding recognises that one by its text.)
//
// Callbacks into Rust (a checkpointed block, a captured CUDA graph function) return 0, or a
// kind code with the message in their `err` buffer; throw_error rethrows that as the matching
// c10 exception, so the kind survives the round trip through Rust and back.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>

namespace kiln {

// The kinds of error Rust tells apart (crate::ErrorKind). 0 is not a kind: it ends a C string.
enum class ErrorKind : unsigned char {
  Other = 1,            // any other c10::Error or std::exception
  OutOfMemory = 2,      // c10::OutOfMemoryError (CUDA's caching allocator), std::bad_alloc
  InvalidArgument = 3,  // c10::ValueError, c10::IndexError, c10::TypeError
  NotImplemented = 4,   // c10::NotImplementedError (e.g. no kernel for this backend)
  Distributed = 5,      // a collective or the rendezvous failed (c10::DistError, or any
                        // exception out of a collective: see KILN_DIST_CATCH)
};

// The error string of the ABI: the kind byte, then the message.
inline char* error_string(ErrorKind kind, const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 2));
  if (out != nullptr) {
    out[0] = static_cast<char>(kind);
    std::memcpy(out + 1, message.c_str(), message.size() + 1);
  }
  return out;
}

// The error string of the exception being handled; call only inside a catch block.
inline char* current_error() noexcept {
  try {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    return error_string(ErrorKind::OutOfMemory, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    return error_string(ErrorKind::NotImplemented, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    return error_string(ErrorKind::InvalidArgument, e.what_without_backtrace());
  } catch (const c10::IndexError& e) {
    return error_string(ErrorKind::InvalidArgument, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    return error_string(ErrorKind::InvalidArgument, e.what_without_backtrace());
  } catch (const c10::DistError& e) {
    return error_string(ErrorKind::Distributed, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return error_string(ErrorKind::Other, e.what_without_backtrace());
  } catch (const std::bad_alloc& e) {
    return error_string(ErrorKind::OutOfMemory, e.what());
  } catch (const std::exception& e) {
    return error_string(ErrorKind::Other, e.what());
  } catch (...) {
    return error_string(ErrorKind::Other, "unknown C++ exception");
  }
}

// Throws `message` as the c10 exception of kind `code` (a callback's return value; an unknown
// code is Other).
[[noreturn]] inline void throw_error(int code, const std::string& message) {
  switch (static_cast<ErrorKind>(code)) {
    case ErrorKind::OutOfMemory:
      C10_THROW_ERROR(OutOfMemoryError, message);
    case ErrorKind::InvalidArgument:
      C10_THROW_ERROR(ValueError, message);
    case ErrorKind::NotImplemented:
      C10_THROW_ERROR(NotImplementedError, message);
    case ErrorKind::Distributed:
      C10_THROW_ERROR(DistError, message);
    default:
      C10_THROW_ERROR(Error, message);
  }
}

// The error string of an exception out of a collective: c10d's own (c10::DistError: a
// timeout, an unreachable store) and what Gloo throws (a peer that left: std::exceptions that
// are not c10's) are Distributed; libtorch's other errors keep their kinds.
inline char* current_dist_error() noexcept {
  try {
    throw;
  } catch (const c10::Error&) {
    return current_error();
  } catch (const std::bad_alloc&) {
    return current_error();
  } catch (const std::exception& e) {
    return error_string(ErrorKind::Distributed, e.what());
  } catch (...) {
    return error_string(ErrorKind::Distributed, "unknown C++ exception in a collective");
  }
}

}  // namespace kiln

#define KILN_TRY try {
#define KILN_CATCH                  \
  }                                 \
  catch (...) {                     \
    return kiln::current_error();   \
  }                                 \
  return nullptr;
#define KILN_DIST_CATCH                  \
  }                                      \
  catch (...) {                          \
    return kiln::current_dist_error();   \
  }                                      \
  return nullptr;

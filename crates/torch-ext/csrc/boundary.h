// kiln native extension: the C ABI boundary shared by every translation unit.
//
// Each exported function returns nullptr on success or a malloc'd, NUL-terminated error
// message that Rust takes ownership of and frees with kiln_free_string. No C++ exception
// ever crosses into Rust: KILN_TRY/KILN_CATCH wrap every body.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace kiln {

inline char* error_string(const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, message.c_str(), message.size() + 1);
  }
  return out;
}

}  // namespace kiln

#define KILN_TRY try {
#define KILN_CATCH                                                   \
  }                                                                  \
  catch (const c10::Error& e) {                                      \
    return kiln::error_string(e.what_without_backtrace());           \
  }                                                                  \
  catch (const std::exception& e) {                                  \
    return kiln::error_string(e.what());                             \
  }                                                                  \
  catch (...) {                                                      \
    return kiln::error_string("unknown C++ exception");              \
  }                                                                  \
  return nullptr;

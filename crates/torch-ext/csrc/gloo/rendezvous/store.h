// kiln's stand-in for gloo's rendezvous store interface (see ../context.h for why and when this
// is safe). GLOO_STORE_HAS_STORE_V2 is deliberately left undefined: c10d's inline GlooStore
// would then not match libtorch's vtable, so kiln never constructs a GlooStore.
#pragma once
#include <chrono>
#include <string>
#include <vector>
namespace gloo {
namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string&, const std::vector<char>&) = 0;
  virtual std::vector<char> get(const std::string&) = 0;
  virtual void wait(const std::vector<std::string>&) = 0;
  virtual void wait(const std::vector<std::string>&, const std::chrono::milliseconds&) = 0;
};
}  // namespace rendezvous
}  // namespace gloo

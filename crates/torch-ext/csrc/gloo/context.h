// kiln's own stand-ins for the gloo declarations that c10d's ProcessGroupGloo.hpp needs (the
// torch wheel ships c10d's headers but not gloo's; Debian's gloo is another, layout-different
// version). Safe only while kiln treats every gloo object as opaque: it never constructs, reads
// or destroys one, and reaches gloo only through c10d's own functions compiled into libtorch.
// ProcessGroupGloo and its Options hold gloo types only behind shared_ptr/unique_ptr, so their
// layout does not depend on these. Recheck on a torch upgrade (docs: shared/notes/distributed.md).
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>
namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
class Context {  // never instantiated here
 public:
  void setTimeout(std::chrono::milliseconds timeout);  // defined in libtorch_cpu
};
}  // namespace gloo

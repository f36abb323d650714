// kiln native extension: facts about a saved TorchScript module that tch does not expose
// (whether it was saved in training mode, which methods it has).

#include <torch/script.h>

#include "boundary.h"

extern "C" {

// Loads the TorchScript file `path` on the CPU and reports whether the module was saved in
// training mode and whether it has a method named `method`.
char* kiln_script_inspect(const char* path, const char* method, bool* training,
                          bool* has_method, int64_t* parameters) {
  KILN_TRY
  torch::jit::Module module = torch::jit::load(std::string(path), c10::Device(c10::kCPU));
  *training = module.is_training();
  *has_method = module.find_method(std::string(method)).has_value();
  int64_t count = 0;
  for (const auto& p : module.parameters()) {
    (void)p;
    count += 1;
  }
  *parameters = count;
  KILN_CATCH
}

}  // extern "C"

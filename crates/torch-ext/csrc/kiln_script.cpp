// kiln native extension: facts about a saved TorchScript module that tch does not expose
// (whether it was saved in training mode, which methods it has, its parameter count, and the
// arguments its forward takes).

#include <torch/script.h>

#include "boundary.h"

extern "C" {

// Loads the TorchScript file `path` on the CPU and reports whether the module was saved in
// training mode, whether it has a method named `method`, its parameter count, and its
// forward's arguments after `self` as "name\ttype\tdefault?\n" lines (type as TorchScript
// writes it: "Tensor", "Dict[str, Tensor]"; default? is 1 where the argument has a default) in
// a malloc'd string the caller frees with kiln_free_string.
char* kiln_script_inspect(const char* path, const char* method, bool* training,
                          bool* has_method, int64_t* parameters, char** forward_args) {
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
  std::string text;
  if (auto forward = module.find_method("forward")) {
    const auto& arguments = forward->function().getSchema().arguments();
    for (size_t i = 1; i < arguments.size(); ++i) {
      const auto& a = arguments[i];
      text += a.name() + "\t" + a.type()->annotation_str() + "\t" +
              (a.default_value().has_value() ? "1" : "0") + "\n";
    }
  }
  *forward_args = static_cast<char*>(std::malloc(text.size() + 1));
  TORCH_CHECK(*forward_args != nullptr, "out of memory for the forward's arguments");
  std::memcpy(*forward_args, text.c_str(), text.size() + 1);
  KILN_CATCH
}

}  // extern "C"

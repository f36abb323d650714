// kiln native extension: AOTInductor model packages (a .pt2 that torch._inductor compiled),
// loaded and run inside kiln's error boundary. kiln compiles them itself and loads them only
// from its own cache.
#include <ATen/core/grad_mode.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "boundary.h"
#include "tensors.h"

using torch::inductor::AOTIModelPackageLoader;

extern "C" {

// Loads the package at `path` for CUDA device `device_index` (-1: the CPU, or the package's
// own device); `*out` becomes an owned handle (free it with kiln_aoti_free).
char* kiln_aoti_load(const char* path, int device_index, void** out) {
  KILN_TRY
  *out = new AOTIModelPackageLoader(path, "model", false, 1,
                                    static_cast<c10::DeviceIndex>(device_index));
  KILN_CATCH
}

void kiln_aoti_free(void* handle) { delete static_cast<AOTIModelPackageLoader*>(handle); }

// Runs the package on `n` inputs; writes up to `cap` outputs (each a `new at::Tensor` the
// caller owns) and their count. More outputs than `cap` is an error (nothing is written).
char* kiln_aoti_run(void* handle, const at::Tensor* const* inputs, size_t n, at::Tensor** out,
                    size_t cap, size_t* n_out) {
  KILN_TRY
  auto* loader = static_cast<AOTIModelPackageLoader*>(handle);
  auto args = kiln::tensor_list(inputs, n);
  std::vector<at::Tensor> results = loader->run(args);
  TORCH_CHECK(results.size() <= cap, "the compiled package returned ", results.size(),
              " outputs; expected at most ", cap);
  for (size_t i = 0; i < results.size(); ++i) {
    out[i] = new at::Tensor(std::move(results[i]));
  }
  *n_out = results.size();
  KILN_CATCH
}

// The package's metadata as "key=value\n" lines in a malloc'd string the caller frees with
// kiln_free_string (AOTI_DEVICE_KEY, AOTI_PLATFORM, AOTI_CPU_ISA, …).
char* kiln_aoti_metadata(void* handle, char** out) {
  KILN_TRY
  auto* loader = static_cast<AOTIModelPackageLoader*>(handle);
  std::string text;
  for (const auto& [key, value] : loader->get_metadata()) {
    text += key + "=" + value + "\n";
  }
  *out = static_cast<char*>(std::malloc(text.size() + 1));
  TORCH_CHECK(*out != nullptr, "out of memory for the package's metadata");
  std::memcpy(*out, text.c_str(), text.size() + 1);
  KILN_CATCH
}

// param.grad += weight * grad (or param.grad = weight * grad when it has none): a compiled
// step returns gradients as outputs, and micro-batches of one step add theirs up.
char* kiln_accumulate_grads(const at::Tensor* const* params, const at::Tensor* const* grads,
                            size_t n, double weight) {
  KILN_TRY
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < n; ++i) {
    at::Tensor param = *params[i];
    const at::Tensor& g = *grads[i];
    TORCH_CHECK(g.sizes() == param.sizes(), "gradient ", i, " has shape ", g.sizes(),
                "; its parameter has shape ", param.sizes());
    at::Tensor& slot = param.mutable_grad();
    at::Tensor scaled = g.to(param.dtype());
    if (weight != 1.0) {
      scaled = scaled.mul(weight);
    }
    if (slot.defined()) {
      slot.add_(scaled);
    } else {
      // The step's outputs are fresh tensors (a joint graph's gradients never alias its
      // inputs), so the first micro-batch's becomes the gradient, laid out as its parameter.
      slot = scaled.contiguous(param.suggest_memory_format());
    }
  }
  KILN_CATCH
}

}  // extern "C"

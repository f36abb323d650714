// kiln native extension: libtorch functionality that tch does not expose (global math flags,
// autocast state, the fused AdamW kernel, library loading), behind a C ABI for Rust.
#include "boundary.h"
#include "tensors.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/headeronly/version.h>

#include <dlfcn.h>

#include <optional>
#include <vector>

namespace {

at::DeviceType device_type(int code) {
  switch (code) {
    case 0:
      return at::kCPU;
    case 1:
      return at::kCUDA;
    default:
      TORCH_CHECK_VALUE(false, "unknown device type code ", code);
  }
}

at::ScalarType scalar_type(int code) {
  switch (code) {
    case 0:
      return at::kHalf;
    case 1:
      return at::kBFloat16;
    case 2:
      return at::kFloat;
    default:
      TORCH_CHECK_VALUE(false, "unknown autocast dtype code ", code);
  }
}

int scalar_type_code(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return 0;
    case at::kBFloat16:
      return 1;
    case at::kFloat:
      return 2;
    default:
      return -1;
  }
}

}  // namespace

extern "C" {

void kiln_free_string(char* s) { std::free(s); }

const char* kiln_torch_version() { return TORCH_VERSION; }

// ---- global math flags ------------------------------------------------------------------

char* kiln_set_float32_matmul_precision(const char* precision) {
  KILN_TRY
  at::globalContext().setFloat32MatmulPrecision(precision);
  KILN_CATCH
}

// 0 = highest, 1 = high, 2 = medium.
char* kiln_float32_matmul_precision(int* out) {
  KILN_TRY
  *out = static_cast<int>(at::globalContext().float32MatmulPrecision());
  KILN_CATCH
}

// Flag codes: 0 TF32 on cuBLAS, 1 TF32 on cuDNN, 2 cuDNN benchmark, 3 cuDNN deterministic.
char* kiln_set_flag(int flag, bool value) {
  KILN_TRY
  auto& ctx = at::globalContext();
  switch (flag) {
    case 0:
      ctx.setAllowTF32CuBLAS(value);
      break;
    case 1:
      ctx.setAllowTF32CuDNN(value);
      break;
    case 2:
      ctx.setBenchmarkCuDNN(value);
      break;
    case 3:
      ctx.setDeterministicCuDNN(value);
      break;
    default:
      TORCH_CHECK_VALUE(false, "unknown flag code ", flag);
  }
  KILN_CATCH
}

char* kiln_get_flag(int flag, bool* out) {
  KILN_TRY
  auto& ctx = at::globalContext();
  switch (flag) {
    case 0:
      *out = ctx.allowTF32CuBLAS();
      break;
    case 1:
      *out = ctx.allowTF32CuDNN();
      break;
    case 2:
      *out = ctx.benchmarkCuDNN();
      break;
    case 3:
      *out = ctx.deterministicCuDNN();
      break;
    default:
      TORCH_CHECK_VALUE(false, "unknown flag code ", flag);
  }
  KILN_CATCH
}

char* kiln_set_deterministic_algorithms(bool enabled, bool warn_only) {
  KILN_TRY
  at::globalContext().setDeterministicAlgorithms(enabled, warn_only);
  KILN_CATCH
}

char* kiln_deterministic_algorithms(bool* enabled, bool* warn_only) {
  KILN_TRY
  *enabled = at::globalContext().deterministicAlgorithms();
  *warn_only = at::globalContext().deterministicAlgorithmsWarnOnly();
  KILN_CATCH
}

// ---- autocast (per thread) --------------------------------------------------------------

char* kiln_autocast_set_enabled(int device, bool enabled) {
  KILN_TRY
  at::autocast::set_autocast_enabled(device_type(device), enabled);
  KILN_CATCH
}

char* kiln_autocast_is_enabled(int device, bool* out) {
  KILN_TRY
  *out = at::autocast::is_autocast_enabled(device_type(device));
  KILN_CATCH
}

char* kiln_autocast_set_dtype(int device, int dtype) {
  KILN_TRY
  at::autocast::set_autocast_dtype(device_type(device), scalar_type(dtype));
  KILN_CATCH
}

char* kiln_autocast_dtype(int device, int* out) {
  KILN_TRY
  *out = scalar_type_code(at::autocast::get_autocast_dtype(device_type(device)));
  KILN_CATCH
}

// Entering an autocast region: returns the new nesting depth.
char* kiln_autocast_enter(int* depth) {
  KILN_TRY
  *depth = at::autocast::increment_nesting();
  KILN_CATCH
}

// Leaving one: the cast cache is cleared when the outermost region ends, as torch.autocast does.
char* kiln_autocast_exit(int* depth) {
  KILN_TRY
  *depth = at::autocast::decrement_nesting();
  if (*depth == 0) {
    at::autocast::clear_cache();
  }
  KILN_CATCH
}

// ---- fused AdamW ------------------------------------------------------------------------

char* kiln_fused_adamw(const at::Tensor* const* params, const at::Tensor* const* grads,
                       const at::Tensor* const* exp_avgs,
                       const at::Tensor* const* exp_avg_sqs,
                       const at::Tensor* const* max_exp_avg_sqs, size_t n_max,
                       const at::Tensor* const* state_steps, size_t n, double lr,
                       double beta1, double beta2, double weight_decay, double eps,
                       bool amsgrad, bool maximize, const at::Tensor* grad_scale,
                       const at::Tensor* found_inf, const at::Tensor* lr_tensor) {
  KILN_TRY
  std::optional<at::Tensor> scale;
  if (grad_scale != nullptr) scale = *grad_scale;
  std::optional<at::Tensor> inf;
  if (found_inf != nullptr) inf = *found_inf;
  auto p = kiln::tensor_list(params, n);
  auto g = kiln::tensor_list(grads, n);
  auto m = kiln::tensor_list(exp_avgs, n);
  auto v = kiln::tensor_list(exp_avg_sqs, n);
  auto vmax = kiln::tensor_list(max_exp_avg_sqs, n_max);
  auto steps = kiln::tensor_list(state_steps, n);
  at::NoGradGuard no_grad;
  if (lr_tensor != nullptr) {
    // The learning rate read from the device: a CUDA graph replays the step with its current
    // value (the overload torch.optim.AdamW(capturable=True) uses).
    at::_fused_adamw_(p, g, m, v, vmax, steps, *lr_tensor, beta1, beta2, weight_decay, eps,
                      amsgrad, maximize, scale, inf);
  } else {
    at::_fused_adamw_(p, g, m, v, vmax, steps, lr, beta1, beta2, weight_decay, eps, amsgrad,
                      maximize, scale, inf);
  }
  KILN_CATCH
}

// ---- CPU threads ------------------------------------------------------------------------

char* kiln_set_num_threads(int n) {
  KILN_TRY
  at::set_num_threads(n);
  KILN_CATCH
}

// libtorch allows this only before any inter-op parallel work has started.
char* kiln_set_num_interop_threads(int n) {
  KILN_TRY
  at::set_num_interop_threads(n);
  KILN_CATCH
}

char* kiln_num_threads(int* intra, int* inter) {
  KILN_TRY
  *intra = at::get_num_threads();
  *inter = at::get_num_interop_threads();
  KILN_CATCH
}

// ---- accelerator memory (the current accelerator: CUDA here) ----------------------------

// The current accelerator, initialised: its caching allocator knows its devices only once
// the accelerator is (lazily) initialised, which the first allocation does; before that, asking
// it for a device's statistics fails with "Invalid device argument" (seen on an H200).
static void init_accelerator() {
  auto accelerator = at::accelerator::getAccelerator(true).value();
  TORCH_CHECK(at::accelerator::isAccelerator(accelerator), "no accelerator");
  at::globalContext().lazyInitDevice(accelerator);
}

// out: allocated, allocated peak, reserved, reserved peak (bytes), number of OOMs.
char* kiln_memory_stats(int device, int64_t* out) {
  KILN_TRY
  init_accelerator();
  auto stats = at::accelerator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  constexpr auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  out[0] = stats.allocated_bytes[all].current;
  out[1] = stats.allocated_bytes[all].peak;
  out[2] = stats.reserved_bytes[all].current;
  out[3] = stats.reserved_bytes[all].peak;
  out[4] = stats.num_ooms;
  KILN_CATCH
}

char* kiln_reset_peak_memory(int device) {
  KILN_TRY
  init_accelerator();
  at::accelerator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
  KILN_CATCH
}

char* kiln_empty_cache() {
  KILN_TRY
  init_accelerator();
  at::accelerator::emptyCache();
  KILN_CATCH
}

// ---- CUDA build facts (through ATen's hooks: no CUDA headers needed) ------------------

// The CUDA runtime and cuDNN versions libtorch was compiled with (e.g. 13000, 91900); throws
// (so returns an error) when this libtorch has no CUDA library loaded.
char* kiln_cuda_build_versions(long* cudart, long* cudnn) {
  KILN_TRY
  const auto& hooks = at::detail::getCUDAHooks();
  *cudart = hooks.versionCUDART();
  *cudnn = hooks.hasCuDNN() ? hooks.versionCuDNN() : 0;
  KILN_CATCH
}

// ---- libraries --------------------------------------------------------------------------

// Writes the path of the loaded libtorch_cpu (found from one of its symbols) into `buf`.
char* kiln_libtorch_cpu_path(char* buf, size_t len) {
  KILN_TRY
  Dl_info info{};
  void* symbol = reinterpret_cast<void*>(&at::globalContext);
  TORCH_CHECK(dladdr(symbol, &info) != 0 && info.dli_fname != nullptr,
              "dladdr found no library for at::globalContext");
  std::string path(info.dli_fname);
  TORCH_CHECK(path.size() < len, "library path longer than ", len, " bytes");
  std::memcpy(buf, path.c_str(), path.size() + 1);
  KILN_CATCH
}

// dlopens a library globally, so that its static initialisers (CUDA hooks) register.
char* kiln_dlopen_global(const char* path) {
  KILN_TRY
  void* handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  TORCH_CHECK(handle != nullptr, "dlopen(", path, ") failed: ", dlerror());
  KILN_CATCH
}

// ---- host staging buffers --------------------------------------------------------------

// A new CPU tensor of `shape` and dtype `kind` (0 = float32, 1 = int64) holding a copy of the
// `bytes` bytes at `data` (uninitialized where `data` is null); in page-locked (pinned) memory
// when `pinned`, so a later
// non-blocking copy to a CUDA device is truly asynchronous. Pinned memory needs a CUDA device:
// without one this returns libtorch's error, and the caller falls back to pageable memory.
char* kiln_host_tensor(const void* data, size_t bytes, const int64_t* shape, size_t ndim,
                       int kind, bool pinned, at::Tensor** out) {
  KILN_TRY
  TORCH_CHECK_VALUE(kind == 0 || kind == 1, "unsupported host tensor kind ", kind);
  auto options =
      at::TensorOptions().dtype(kind == 0 ? at::kFloat : at::kLong).pinned_memory(pinned);
  at::Tensor t = at::empty(at::IntArrayRef(shape, ndim), options);
  TORCH_CHECK_VALUE(t.nbytes() == bytes, "host tensor of ", t.nbytes(), " bytes for ", bytes,
                    " bytes of data");
  if (bytes > 0 && data != nullptr) std::memcpy(t.data_ptr(), data, bytes);
  *out = new at::Tensor(std::move(t));
  KILN_CATCH
}

// A CPU tensor of `shape` and dtype `kind` (0 = float32, 1 = int64) over memory owned by the
// caller, without copying: libtorch calls `free_fn(ctx)` when the last reference to the tensor's
// storage goes away, on whichever thread that happens.
char* kiln_tensor_from_owned(void* data, const int64_t* shape, size_t ndim, int kind,
                             void (*free_fn)(void*), void* ctx, at::Tensor** out) {
  KILN_TRY
  TORCH_CHECK_VALUE(kind == 0 || kind == 1, "unsupported tensor kind ", kind);
  auto options = at::TensorOptions().dtype(kind == 0 ? at::kFloat : at::kLong);
  at::Tensor t = at::from_blob(
      data, at::IntArrayRef(shape, ndim), [free_fn, ctx](void*) { free_fn(ctx); }, options);
  *out = new at::Tensor(std::move(t));
  KILN_CATCH
}

}  // extern "C"

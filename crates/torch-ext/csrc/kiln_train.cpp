// kiln native extension: training kernels tch does not bind (they take tensor lists), and a
// fast dropout mask for the CPU.
#include "boundary.h"
#include "tensors.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>

namespace {

std::optional<at::Tensor> optional_tensor(const at::Tensor* t) {
  if (t == nullptr) return std::nullopt;
  return *t;
}

// SplitMix64's finaliser: a counter-based generator, so element i's draw depends only on
// (seed, offset + i) and the mask is the same for any thread count.
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kDropoutKey = 0x6A09E667F3BCC909ULL;

// The dropout generator: a 32-bit avalanche hash (Wellons' lowbias32) of the element's 64-bit
// counter, mixed with the key in two rounds. 32-bit multiplies vectorise on AVX2 and AVX-512,
// where SplitMix's 64-bit ones do not, and the loops below are compiled for each and picked at
// run time (target_clones). Element i is kept when its top 24 bits are >= p * 2^24.
inline uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

inline uint32_t dropout_bits(uint64_t counter, uint32_t k0, uint32_t k1) {
  const uint32_t lo = static_cast<uint32_t>(counter);
  const uint32_t hi = static_cast<uint32_t>(counter >> 32);
  return lowbias32(lowbias32(lo ^ k0) ^ hi ^ k1);
}

struct DropoutParams {
  uint64_t offset;
  uint32_t k0, k1, threshold;
  float scale;
};

DropoutParams dropout_params(double p, uint64_t seed, uint64_t offset) {
  const uint64_t key = mix(seed ^ kDropoutKey);
  return {offset, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32),
          static_cast<uint32_t>(p * 16777216.0), static_cast<float>(1.0 / (1.0 - p))};
}

// out[i] = keep(i) ? in[i] * scale : 0 for i in [begin, end), float32.
__attribute__((target_clones("avx512f", "avx2", "default"))) void dropout_f32(
    const float* in, float* out, int64_t begin, int64_t end, DropoutParams d) {
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t r = dropout_bits(d.offset + static_cast<uint64_t>(i), d.k0, d.k1) >> 8;
    out[i] = r >= d.threshold ? in[i] * d.scale : 0.0f;
  }
}

// The same for bfloat16 held as raw bits (round to nearest even on the way back).
__attribute__((target_clones("avx512f", "avx2", "default"))) void dropout_bf16(
    const uint16_t* in, uint16_t* out, int64_t begin, int64_t end, DropoutParams d) {
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t r = dropout_bits(d.offset + static_cast<uint64_t>(i), d.k0, d.k1) >> 8;
    // Branch-free so that it vectorises: scale everything, then zero the dropped lanes.
    const uint32_t keep = r >= d.threshold ? 0xFFFFU : 0U;
    const float v = __builtin_bit_cast(float, static_cast<uint32_t>(in[i]) << 16) * d.scale;
    uint32_t bits = __builtin_bit_cast(uint32_t, v);
    bits += 0x7FFFU + ((bits >> 16) & 1U);
    out[i] = static_cast<uint16_t>((bits >> 16) & keep);
  }
}

// A mask of 0 / scale values in float32, [begin, end).
__attribute__((target_clones("avx512f", "avx2", "default"))) void dropout_mask_f32(
    float* out, int64_t begin, int64_t end, DropoutParams d) {
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t r = dropout_bits(d.offset + static_cast<uint64_t>(i), d.k0, d.k1) >> 8;
    out[i] = r >= d.threshold ? d.scale : 0.0f;
  }
}

// out[i] = x[i] / (1 - p) where element i is kept, 0 where it is dropped; the same (seed,
// offset) always drops the same elements of a contiguous tensor.
at::Tensor apply_dropout(const at::Tensor& input, double p, uint64_t seed, uint64_t offset) {
  at::Tensor x = input.contiguous();
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int64_t numel = x.numel();
  const DropoutParams d = dropout_params(p, seed, offset);
  if (x.scalar_type() == at::kFloat) {
    const float* in = x.const_data_ptr<float>();
    float* o = out.data_ptr<float>();
    at::parallel_for(0, numel, 32768,
                     [&](int64_t begin, int64_t end) { dropout_f32(in, o, begin, end, d); });
  } else if (x.scalar_type() == at::kBFloat16) {
    const auto* in = reinterpret_cast<const uint16_t*>(x.const_data_ptr<at::BFloat16>());
    auto* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    at::parallel_for(0, numel, 32768,
                     [&](int64_t begin, int64_t end) { dropout_bf16(in, o, begin, end, d); });
  } else {
    // Other dtypes: the float32 mask, multiplied in that dtype.
    at::Tensor mask = at::empty(x.sizes(), x.options().dtype(at::kFloat));
    float* m = mask.data_ptr<float>();
    at::parallel_for(0, numel, 32768,
                     [&](int64_t begin, int64_t end) { dropout_mask_f32(m, begin, end, d); });
    out = x * mask.to(x.scalar_type());
  }
  return out;
}

// Dropout as an autograd function that stores nothing: backward regenerates the mask from
// (seed, offset), so the forward and the backward are one pass each over the tensor.
struct KilnDropout : public torch::autograd::Function<KilnDropout> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double p,
                            int64_t seed, int64_t offset) {
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = seed;
    ctx->saved_data["offset"] = offset;
    return apply_dropout(x, p, static_cast<uint64_t>(seed), static_cast<uint64_t>(offset));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const double p = ctx->saved_data["p"].toDouble();
    const auto seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    const auto offset = static_cast<uint64_t>(ctx->saved_data["offset"].toInt());
    return {apply_dropout(grads[0], p, seed, offset), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// torch._amp_foreach_non_finite_check_and_unscale_: grads *= inv_scale in place, and
// found_inf (a one-element float tensor) is set to 1 if any gradient has an inf or NaN.
char* kiln_amp_unscale(const at::Tensor* const* grads, size_t n, const at::Tensor* found_inf,
                       const at::Tensor* inv_scale) {
  KILN_TRY
  auto g = kiln::tensor_list(grads, n);
  at::NoGradGuard no_grad;
  at::Tensor inf = *found_inf;
  at::_amp_foreach_non_finite_check_and_unscale_(g, inf, *inv_scale);
  KILN_CATCH
}

// torch._foreach_add_(tensors, other): adds the one-element tensor `other` to every tensor in
// place, in one launch per device and dtype (the optimizer's step counts: one kernel where a
// loop would launch one per parameter).
char* kiln_foreach_add_(const at::Tensor* const* tensors, size_t n, const at::Tensor* other) {
  KILN_TRY
  auto t = kiln::tensor_list(tensors, n);
  at::NoGradGuard no_grad;
  at::_foreach_add_(t, *other);
  KILN_CATCH
}

// torch._foreach_lerp_(ends_at, towards, weight): ends_at += weight * (towards - ends_at) for
// every pair, in one launch per device and dtype (an EMA of the weights: weight = 1 - decay).
char* kiln_foreach_lerp_(const at::Tensor* const* ends_at, const at::Tensor* const* towards,
                         size_t n, double weight) {
  KILN_TRY
  auto e = kiln::tensor_list(ends_at, n);
  auto t = kiln::tensor_list(towards, n);
  at::NoGradGuard no_grad;
  at::_foreach_lerp_(e, t, at::Scalar(weight));
  KILN_CATCH
}

// torch._foreach_copy_(dst, src): every dst[i] takes src[i]'s values, in one launch per device
// and dtype.
char* kiln_foreach_copy_(const at::Tensor* const* dst, const at::Tensor* const* src, size_t n) {
  KILN_TRY
  auto d = kiln::tensor_list(dst, n);
  auto s = kiln::tensor_list(src, n);
  at::NoGradGuard no_grad;
  at::_foreach_copy_(d, s);
  KILN_CATCH
}

// torch._amp_update_scale_ in place on `scale` and `growth_tracker`.
char* kiln_amp_update_scale(const at::Tensor* scale, const at::Tensor* growth_tracker,
                            const at::Tensor* found_inf, double growth, double backoff,
                            int64_t interval) {
  KILN_TRY
  at::NoGradGuard no_grad;
  at::Tensor s = *scale;
  at::Tensor tracker = *growth_tracker;
  at::_amp_update_scale_(s, tracker, *found_inf, growth, backoff, interval);
  KILN_CATCH
}

// torch._fused_sgd_ (CPU and CUDA): momentum buffers are updated in place; on the first step
// the kernel initialises them from the gradients.
char* kiln_fused_sgd(const at::Tensor* const* params, const at::Tensor* const* grads,
                     const at::Tensor* const* momentum_buffers, size_t n, double weight_decay,
                     double momentum, double lr, double dampening, bool nesterov, bool maximize,
                     bool is_first_step, const at::Tensor* grad_scale,
                     const at::Tensor* found_inf) {
  KILN_TRY
  auto p = kiln::tensor_list(params, n);
  auto g = kiln::tensor_list(grads, n);
  auto m = kiln::tensor_list(momentum_buffers, momentum == 0.0 ? 0 : n);
  at::NoGradGuard no_grad;
  at::_fused_sgd_(p, g, m, weight_decay, momentum, lr, dampening, nesterov, maximize,
                  is_first_step, optional_tensor(grad_scale), optional_tensor(found_inf));
  KILN_CATCH
}

// The global L2 norm of `grads` (a new one-element float tensor, on their device, no host
// sync); if max_norm > 0 the gradients are scaled in place so that it is at most max_norm,
// as torch.nn.utils.clip_grad_norm_ does.
char* kiln_clip_grad_norm(const at::Tensor* const* grads, size_t n, double max_norm,
                          at::Tensor** total_norm) {
  KILN_TRY
  auto g = kiln::tensor_list(grads, n);
  at::NoGradGuard no_grad;
  TORCH_CHECK_VALUE(n > 0, "no gradients to clip");
  auto norms = at::_foreach_norm(g, 2.0);
  at::Tensor total = at::linalg_vector_norm(at::stack(norms).to(at::kFloat), 2.0);
  if (max_norm > 0.0) {
    at::Tensor coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
    at::_foreach_mul_(g, coef);
  }
  *total_norm = new at::Tensor(std::move(total));
  KILN_CATCH
}

// A dropout mask shaped and typed like `like` (CPU): each element is 0 with probability p and
// 1/(1-p) otherwise, drawn from (seed, offset + element index). Multiplying by it is dropout.
char* kiln_dropout_mask(const at::Tensor* like, double p, uint64_t seed, uint64_t offset,
                        at::Tensor** out) {
  KILN_TRY
  TORCH_CHECK_VALUE(like->device().is_cpu(), "kiln_dropout_mask is for CPU tensors");
  TORCH_CHECK_VALUE(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got ", p);
  const DropoutParams d = dropout_params(p, seed, offset);
  at::Tensor mask = at::empty(like->sizes(), like->options().dtype(at::kFloat).requires_grad(false));
  float* m = mask.data_ptr<float>();
  at::parallel_for(0, mask.numel(), 32768,
                   [&](int64_t begin, int64_t end) { dropout_mask_f32(m, begin, end, d); });
  *out = new at::Tensor(mask.to(like->scalar_type()));
  KILN_CATCH
}

// Drops every parameter's gradient (optimizer.zero_grad(set_to_none=True)): the next backward
// writes fresh gradients instead of adding into zeroed ones, which saves a memset per tensor.
char* kiln_clear_grads(const at::Tensor* const* params, size_t n) {
  KILN_TRY
  for (size_t i = 0; i < n; ++i) {
    at::Tensor p = *params[i];
    p.mutable_grad().reset();
  }
  KILN_CATCH
}

// Dropout of a CPU tensor in one pass, differentiable (see KilnDropout): the elements dropped
// are those kiln_dropout_mask(x, p, seed, offset) zeroes.
char* kiln_dropout(const at::Tensor* x, double p, uint64_t seed, uint64_t offset,
                   at::Tensor** out) {
  KILN_TRY
  TORCH_CHECK_VALUE(x->device().is_cpu(), "kiln_dropout is for CPU tensors");
  TORCH_CHECK_VALUE(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got ", p);
  at::Tensor y = KilnDropout::apply(*x, p, static_cast<int64_t>(seed), static_cast<int64_t>(offset));
  *out = new at::Tensor(std::move(y));
  KILN_CATCH
}

// ---- random number generator state (for checkpoints) -----------------------------------------

// The default CPU generator's state as a uint8 tensor.
char* kiln_cpu_rng_state(at::Tensor** out) {
  KILN_TRY
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  *out = new at::Tensor(gen.get_state());
  KILN_CATCH
}

char* kiln_set_cpu_rng_state(const at::Tensor* state) {
  KILN_TRY
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(*state);
  KILN_CATCH
}

// The default generator of CUDA device `index` (through libtorch's CUDA hooks: an error, not a
// crash, where libtorch_cuda is not loaded or the device does not exist).
static at::Generator cuda_generator(int index) {
  TORCH_CHECK_INDEX(index >= 0, "CUDA device index must be non-negative, got ", index);
  return at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
}

char* kiln_cuda_rng_state(int index, at::Tensor** out) {
  KILN_TRY
  auto gen = cuda_generator(index);
  std::lock_guard<std::mutex> lock(gen.mutex());
  *out = new at::Tensor(gen.get_state());
  KILN_CATCH
}

char* kiln_set_cuda_rng_state(int index, const at::Tensor* state) {
  KILN_TRY
  auto gen = cuda_generator(index);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(*state);
  KILN_CATCH
}

// ---- memory format (channels-last for convolutions) ---------------------------------------

// The channels-last layout of a 4-D (NHWC) or 5-D (NDHWC, channels-last-3d) tensor.
static at::MemoryFormat channels_last_for(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.dim() == 4 || t.dim() == 5,
                    "channels-last needs a 4-D or 5-D tensor, got ", t.dim(), " dimensions");
  return t.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
}

// A channels-last copy of a 4-D or 5-D tensor (the tensor itself when it already is).
char* kiln_to_channels_last(const at::Tensor* t, at::Tensor** out) {
  KILN_TRY
  *out = new at::Tensor(t->contiguous(channels_last_for(*t)));
  KILN_CATCH
}

// Re-lays a 4-D or 5-D parameter out channels-last in place (its identity and autograd state
// stay). A clone, not `contiguous`: a weight of one input channel already counts as
// channels-last in its contiguous strides, and `contiguous` keeps those, which oneDNN reads as
// the standard layout (its convolution then runs that way, about twice as slow in 3-D).
char* kiln_param_to_channels_last(const at::Tensor* p) {
  KILN_TRY
  at::MemoryFormat format = channels_last_for(*p);
  at::NoGradGuard no_grad;
  at::Tensor param = *p;
  param.set_data(param.clone(format));
  KILN_CATCH
}

// Re-lays a parameter out in the standard contiguous format in place (undoing
// kiln_param_to_channels_last; its identity and autograd state stay).
char* kiln_param_to_contiguous(const at::Tensor* p) {
  KILN_TRY
  at::NoGradGuard no_grad;
  at::Tensor param = *p;
  param.set_data(param.clone(at::MemoryFormat::Contiguous));
  KILN_CATCH
}

char* kiln_is_channels_last(const at::Tensor* t, bool* out) {
  KILN_TRY
  *out = (t->dim() == 4 && t->is_contiguous(at::MemoryFormat::ChannelsLast)) ||
         (t->dim() == 5 && t->is_contiguous(at::MemoryFormat::ChannelsLast3d));
  KILN_CATCH
}

}  // extern "C"

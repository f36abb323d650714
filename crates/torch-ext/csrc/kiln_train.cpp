// kiln native extension: training kernels tch does not bind (they take tensor lists), and a
// fast dropout mask for the CPU.
#include "boundary.h"
#include "tensors.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <cstdint>
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
  TORCH_CHECK(n > 0, "no gradients to clip");
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
  TORCH_CHECK(like->device().is_cpu(), "kiln_dropout_mask is for CPU tensors");
  TORCH_CHECK(p >= 0.0 && p < 1.0, "dropout probability must be in [0, 1), got ", p);
  at::Tensor mask = at::empty(like->sizes(), like->options().requires_grad(false));
  const int64_t numel = mask.numel();
  // Keep an element when its 24-bit draw is at or above p * 2^24.
  const uint32_t threshold = static_cast<uint32_t>(p * 16777216.0);
  const uint64_t key = mix(seed ^ 0x6A09E667F3BCC909ULL);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, mask.scalar_type(), "kiln_dropout_mask",
                                  [&] {
                                    const scalar_t keep = static_cast<scalar_t>(1.0 / (1.0 - p));
                                    const scalar_t drop = static_cast<scalar_t>(0.0);
                                    scalar_t* data = mask.data_ptr<scalar_t>();
                                    at::parallel_for(0, numel, 32768, [&](int64_t begin,
                                                                          int64_t end) {
                                      for (int64_t i = begin; i < end; ++i) {
                                        const uint64_t r =
                                            mix(key + (offset + static_cast<uint64_t>(i)) *
                                                          0x9E3779B97F4A7C15ULL);
                                        data[i] = static_cast<uint32_t>(r >> 40) >= threshold
                                                      ? keep
                                                      : drop;
                                      }
                                    });
                                  });
  *out = new at::Tensor(std::move(mask));
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

// ---- memory format (channels-last for convolutions) ---------------------------------------

// A channels-last copy of a 4-D tensor (the tensor itself when it already is).
char* kiln_to_channels_last(const at::Tensor* t, at::Tensor** out) {
  KILN_TRY
  TORCH_CHECK(t->dim() == 4, "channels-last needs a 4-D tensor, got ", t->dim(), " dimensions");
  *out = new at::Tensor(t->contiguous(at::MemoryFormat::ChannelsLast));
  KILN_CATCH
}

// Re-lays a 4-D parameter out channels-last in place (its identity and autograd state stay).
char* kiln_param_to_channels_last(const at::Tensor* p) {
  KILN_TRY
  TORCH_CHECK(p->dim() == 4, "channels-last needs a 4-D tensor, got ", p->dim(), " dimensions");
  at::NoGradGuard no_grad;
  at::Tensor param = *p;
  param.set_data(param.contiguous(at::MemoryFormat::ChannelsLast));
  KILN_CATCH
}

char* kiln_is_channels_last(const at::Tensor* t, bool* out) {
  KILN_TRY
  *out = t->dim() == 4 && t->is_contiguous(at::MemoryFormat::ChannelsLast);
  KILN_CATCH
}

}  // extern "C"

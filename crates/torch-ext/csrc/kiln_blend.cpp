// kiln native extension: the sliding window's stitch on the CPU. A batch of window outputs is
// weighted and added into the running sums in one pass over the rows the batch covers, so each
// row of the sums is read and written once per batch (in cache while every window covering it
// adds its part), not once per window. The sums start uninitialised: a row is zeroed when a
// window first reaches it (its flag in `ready`), which saves a pass over them.
#include "boundary.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

// s[x] += w[x] * o[x * step] for x < n (a window output's row: step 1 when contiguous, the
// channel count when channels-last).
__attribute__((target_clones("avx512f", "avx2", "default"))) void weighted_add_row(
    float* __restrict s, const float* __restrict w, const float* __restrict o, int64_t step,
    int64_t n) {
  if (step == 1) {
    for (int64_t x = 0; x < n; ++x) s[x] += w[x] * o[x];
  } else {
    for (int64_t x = 0; x < n; ++x) s[x] += w[x] * o[x * step];
  }
}

// c[x] += w[x] for x < n.
__attribute__((target_clones("avx512f", "avx2", "default"))) void add_row(
    float* __restrict c, const float* __restrict w, int64_t n) {
  for (int64_t x = 0; x < n; ++x) c[x] += w[x];
}

// Sizes and strides in three spatial dimensions (a 2-D window gets a leading one of size 1).
struct Dims {
  int64_t d[3];
};

Dims spatial(at::IntArrayRef sizes, int64_t fill) {
  const int64_t rank = static_cast<int64_t>(sizes.size()) - 2;
  Dims out{{fill, fill, fill}};
  for (int64_t k = 0; k < rank; ++k) out.d[3 - rank + k] = sizes[2 + k];
  return out;
}

struct Blend {
  float* sum;          // [K, P0, P1, P2], contiguous
  float* count;        // [P0, P1, P2], contiguous
  uint8_t* ready;      // [P0, P1]: 1 once row (z, y) of the sums is zeroed
  const float* weight;  // [o0, o1, o2], contiguous
  const float* outs;   // [n, K, o0, o1, o2], strides below
  int64_t K;
  Dims padded, window, stride;  // stride: of a window's output in z, y, x
  int64_t stride_n, stride_c;
  std::vector<Dims> at;  // each window's start in the sums

  // Row (z, y) of the sums: every window covering it adds its weighted output and its weight,
  // in window order.
  void row(int64_t z, int64_t y) const {
    const int64_t plane = padded.d[0] * padded.d[1] * padded.d[2];
    const int64_t row_at = (z * padded.d[1] + y) * padded.d[2];
    bool zeroed = ready[z * padded.d[1] + y] != 0;
    for (size_t i = 0; i < at.size(); ++i) {
      const int64_t wz = z - at[i].d[0], wy = y - at[i].d[1];
      if (wz < 0 || wz >= window.d[0] || wy < 0 || wy >= window.d[1]) continue;
      if (!zeroed) {
        for (int64_t c = 0; c < K; ++c) std::fill_n(sum + c * plane + row_at, padded.d[2], 0.0f);
        std::fill_n(count + row_at, padded.d[2], 0.0f);
        ready[z * padded.d[1] + y] = 1;
        zeroed = true;
      }
      const int64_t x0 = at[i].d[2], n = window.d[2];
      const float* w = weight + (wz * window.d[1] + wy) * n;
      const float* o = outs + static_cast<int64_t>(i) * stride_n + wz * stride.d[0] +
                       wy * stride.d[1];
      for (int64_t c = 0; c < K; ++c) {
        weighted_add_row(sum + c * plane + row_at + x0, w, o + c * stride_c, stride.d[2], n);
      }
      add_row(count + row_at + x0, w, n);
    }
  }
};

// The checks that keep every write inside the sums.
void check(const at::Tensor& sum, const at::Tensor& count, const at::Tensor& outs,
           const at::Tensor& weight, const int64_t* starts, size_t n) {
  const int64_t rank = sum.dim() - 2;
  TORCH_CHECK_VALUE(rank == 2 || rank == 3, "blend: the sums are [1, K, *spatial] with 2 or 3 "
                    "spatial dimensions, not ", sum.sizes());
  for (const at::Tensor* t : {&sum, &count, &outs, &weight}) {
    TORCH_CHECK_VALUE(t->device().is_cpu() && t->scalar_type() == at::kFloat,
                      "blend: every tensor is float32 on the CPU; one is ",
                      t->scalar_type(), " on ", t->device());
    TORCH_CHECK_VALUE(t->dim() == rank + 2, "blend: ", t->sizes(), " has not ", rank + 2,
                      " dimensions");
  }
  TORCH_CHECK_VALUE(sum.numel() > 0 && outs.numel() > 0, "blend: empty sums ", sum.sizes(),
                    " or outputs ", outs.sizes());
  TORCH_CHECK_VALUE(sum.is_contiguous() && count.is_contiguous() && weight.is_contiguous(),
                    "blend: the sums, the summed weights and the weight must be contiguous");
  TORCH_CHECK_VALUE(sum.size(0) == 1 && count.size(0) == 1 && count.size(1) == 1 &&
                        weight.size(0) == 1 && weight.size(1) == 1,
                    "blend: the sums are [1, K, ...], the summed weights and the weight [1, 1, "
                    "...]");
  TORCH_CHECK_VALUE(outs.size(0) == static_cast<int64_t>(n) && outs.size(1) == sum.size(1),
                    "blend: ", n, " window starts and ", sum.size(1), " channels, but outputs ",
                    outs.sizes());
  for (int64_t k = 2; k < rank + 2; ++k) {
    TORCH_CHECK_VALUE(count.size(k) == sum.size(k) && weight.size(k) == outs.size(k),
                      "blend: the sums ", sum.sizes(), ", summed weights ", count.sizes(),
                      ", weight ", weight.sizes(), " and outputs ", outs.sizes(), " disagree");
    for (size_t i = 0; i < n; ++i) {
      const int64_t s = starts[i * rank + (k - 2)];
      TORCH_CHECK_INDEX(s >= 0 && s + outs.size(k) <= sum.size(k), "blend: window ", i,
                        " starts at ", s, " in dimension ", k - 2, "; its ", outs.size(k),
                        " voxels do not fit in ", sum.size(k));
    }
  }
}

}  // namespace

extern "C" {

// sum[:, window] += weight * outs[i] and count[window] += weight for each window i of a batch,
// at starts[i * rank ..] in the sums (rank 2 or 3), in window order per voxel. `ready` flags the
// rows of the sums already zeroed (all rows but the last dimension: `ready_len` of them); a row
// not yet zeroed is, when a window first reaches it.
char* kiln_blend_windows(const at::Tensor* sum, const at::Tensor* count, const at::Tensor* outs,
                         const at::Tensor* weight, const int64_t* starts, size_t n,
                         uint8_t* ready, size_t ready_len) {
  KILN_TRY
  check(*sum, *count, *outs, *weight, starts, n);
  const int64_t rank = sum->dim() - 2;
  const int64_t rows = sum->numel() / (sum->size(1) * sum->size(-1));
  TORCH_CHECK_VALUE(static_cast<int64_t>(ready_len) == rows, "blend: ", ready_len,
                    " row flags for sums of ", sum->sizes(), " (", rows, " rows)");
  Blend b{sum->data_ptr<float>(), count->data_ptr<float>(), ready, weight->data_ptr<float>(),
          outs->data_ptr<float>(),  sum->size(1),           spatial(sum->sizes(), 1),
          spatial(outs->sizes(), 1), spatial(outs->strides(), 0), outs->stride(0),
          outs->stride(1),          {}};
  Dims lo{{INT64_MAX, INT64_MAX, INT64_MAX}}, hi{{0, 0, 0}};
  for (size_t i = 0; i < n; ++i) {
    Dims a{{0, 0, 0}};
    for (int64_t k = 0; k < rank; ++k) a.d[3 - rank + k] = starts[i * rank + k];
    for (int k = 0; k < 3; ++k) {
      lo.d[k] = std::min(lo.d[k], a.d[k]);
      hi.d[k] = std::max(hi.d[k], a.d[k] + b.window.d[k]);
    }
    b.at.push_back(a);
  }
  const int64_t ys = hi.d[1] - lo.d[1];
  at::parallel_for(0, (hi.d[0] - lo.d[0]) * ys, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) b.row(lo.d[0] + r / ys, lo.d[1] + r % ys);
  });
  KILN_CATCH
}

}  // extern "C"

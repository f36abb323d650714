// kiln native extension: the sliding window's stitch on the CPU. A batch of window outputs is
// weighted and added into the running sums in one pass over the rows the batch covers, so each
// row of the sums is read and written once per batch (in cache while every window covering it
// adds its part), not once per window. Each row knows how many windows are yet to reach it: the
// sums start uninitialised, and a row is zeroed when its first window reaches it and divided by
// its summed weights when its last one has added, which saves a pass over them at each end.
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

// s[x] /= c[x] for x < n.
__attribute__((target_clones("avx512f", "avx2", "default"))) void divide_row(
    float* __restrict s, const float* __restrict c, int64_t n) {
  for (int64_t x = 0; x < n; ++x) s[x] /= c[x];
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
  uint32_t* left;      // [P0, P1]: the windows yet to reach row (z, y) of the sums
  const uint32_t* planned;  // [P0, P1]: all the windows that reach it
  const float* weight;  // [o0, o1, o2], contiguous
  const float* outs;   // [n, K, o0, o1, o2], strides below
  int64_t K;
  Dims padded, window, stride;  // stride: of a window's output in z, y, x
  int64_t stride_n, stride_c;
  std::vector<Dims> at;  // each window's start in the sums

  // Whether the window `i` covers row (z, y), and where in the window the row is.
  bool covers(size_t i, int64_t z, int64_t y, int64_t* wz, int64_t* wy) const {
    *wz = z - at[i].d[0];
    *wy = y - at[i].d[1];
    return *wz >= 0 && *wz < window.d[0] && *wy >= 0 && *wy < window.d[1];
  }

  // Row (z, y) of the sums: zeroed if no window reached it before; every window of the batch
  // covering it adds its weighted output and its weight, in window order; divided by the
  // summed weights if no window is left to reach it.
  void row(int64_t z, int64_t y) const {
    const int64_t plane = padded.d[0] * padded.d[1] * padded.d[2];
    const int64_t r = z * padded.d[1] + y, row_at = r * padded.d[2], n = window.d[2];
    bool zeroed = left[r] != planned[r], added = false;
    for (size_t i = 0; i < at.size(); ++i) {
      int64_t wz = 0, wy = 0;
      if (!covers(i, z, y, &wz, &wy)) continue;
      if (!zeroed) {
        for (int64_t c = 0; c < K; ++c) std::fill_n(sum + c * plane + row_at, padded.d[2], 0.0f);
        std::fill_n(count + row_at, padded.d[2], 0.0f);
        zeroed = true;
      }
      const int64_t x0 = at[i].d[2];
      const float* w = weight + (wz * window.d[1] + wy) * n;
      const float* o = outs + static_cast<int64_t>(i) * stride_n + wz * stride.d[0] +
                       wy * stride.d[1];
      for (int64_t c = 0; c < K; ++c) {
        weighted_add_row(sum + c * plane + row_at + x0, w, o + c * stride_c, stride.d[2], n);
      }
      add_row(count + row_at + x0, w, n);
      --left[r];
      added = true;
    }
    if (!added || left[r] != 0) return;
    for (int64_t c = 0; c < K; ++c) {
      divide_row(sum + c * plane + row_at, count + row_at, padded.d[2]);
    }
  }

  // An error unless every row of the region [lo, hi) has as many windows left as the batch
  // has covering it.
  void check_planned(const Dims& lo, const Dims& hi) const {
    for (int64_t z = lo.d[0]; z < hi.d[0]; ++z) {
      for (int64_t y = lo.d[1]; y < hi.d[1]; ++y) {
        uint32_t covering = 0;
        for (size_t i = 0; i < at.size(); ++i) {
          int64_t wz = 0, wy = 0;
          covering += covers(i, z, y, &wz, &wy) ? 1 : 0;
        }
        const int64_t r = z * padded.d[1] + y;
        TORCH_CHECK_VALUE(covering <= left[r], "blend: row ", r, " of the sums is reached by ",
                          covering, " windows of this batch but ", left[r],
                          " are left of those planned for it");
      }
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
// at starts[i * rank ..] in the sums (rank 2 or 3), in window order per voxel. Per row of the
// sums (all dimensions but the last: `rows` of them), `planned` is how many windows of the run
// reach it and `left` how many have not yet: a row is zeroed when its first window reaches it,
// and sum[:, row] /= count[row] once none is left. A batch reaching a row more often than it has
// windows left is refused before anything is written.
char* kiln_blend_windows(const at::Tensor* sum, const at::Tensor* count, const at::Tensor* outs,
                         const at::Tensor* weight, const int64_t* starts, size_t n,
                         uint32_t* left, const uint32_t* planned, size_t rows) {
  KILN_TRY
  check(*sum, *count, *outs, *weight, starts, n);
  const int64_t rank = sum->dim() - 2;
  const int64_t sum_rows = sum->numel() / (sum->size(1) * sum->size(-1));
  TORCH_CHECK_VALUE(static_cast<int64_t>(rows) == sum_rows, "blend: ", rows,
                    " row plans for sums of ", sum->sizes(), " (", sum_rows, " rows)");
  Blend b{sum->data_ptr<float>(), count->data_ptr<float>(), left, planned,
          weight->data_ptr<float>(), outs->data_ptr<float>(), sum->size(1),
          spatial(sum->sizes(), 1), spatial(outs->sizes(), 1), spatial(outs->strides(), 0),
          outs->stride(0), outs->stride(1), {}};
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
  b.check_planned(lo, hi);
  const int64_t ys = hi.d[1] - lo.d[1];
  at::parallel_for(0, (hi.d[0] - lo.d[0]) * ys, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) b.row(lo.d[0] + r / ys, lo.d[1] + r % ys);
  });
  KILN_CATCH
}

}  // extern "C"

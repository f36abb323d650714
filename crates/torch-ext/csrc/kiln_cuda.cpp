// kiln native extension: the parts that need CUDA headers. Compiled only when the libtorch has
// CUDA and the headers are found (the pip venv ships them in nvidia/cu13/include); the Rust
// side then sets cfg(kiln_cuda).
#include "boundary.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <memory>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

extern "C" {

char* kiln_cuda_device_count(int* out) {
  KILN_TRY
  *out = static_cast<int>(c10::cuda::device_count());
  KILN_CATCH
}

// Name, UUID (16 bytes), total memory and compute capability of CUDA device `index`, as
// libtorch sees it.
char* kiln_cuda_device_properties(int index, char* name, size_t name_len, unsigned char* uuid,
                                  uint64_t* total_mem, int* major, int* minor) {
  KILN_TRY
  int count = static_cast<int>(c10::cuda::device_count());
  TORCH_CHECK_INDEX(index >= 0 && index < count, "CUDA device index ", index,
                    " out of range (this process sees ", count, " device(s))");
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(index);
  std::string n(prop->name);
  if (n.size() >= name_len) n.resize(name_len - 1);
  std::memcpy(name, n.c_str(), n.size() + 1);
  std::memcpy(uuid, prop->uuid.bytes, 16);
  *total_mem = static_cast<uint64_t>(prop->totalGlobalMem);
  *major = prop->major;
  *minor = prop->minor;
  KILN_CATCH
}

// Caps the caching allocator of CUDA device `index` at `fraction` of its memory (an
// allocation beyond it raises out-of-memory), like torch.cuda.set_per_process_memory_fraction.
char* kiln_cuda_set_memory_fraction(double fraction, int index) {
  KILN_TRY
  TORCH_CHECK_VALUE(fraction > 0.0 && fraction <= 1.0, "memory fraction must be in (0, 1], got ",
                    fraction);
  int count = static_cast<int>(c10::cuda::device_count());
  TORCH_CHECK_INDEX(index >= 0 && index < count, "CUDA device index ", index, " out of range");
  c10::cuda::CUDACachingAllocator::init(count);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                     static_cast<c10::DeviceIndex>(index));
  KILN_CATCH
}

// ---- host-to-device copies on a side stream ---------------------------------------------

// Starts copying host tensor `src` (pinned, for a truly asynchronous copy) to CUDA device
// `index` on a copy stream from libtorch's pool, so it overlaps the compute stream's work.
// `*out` is the device tensor; `*event` marks the copy's end. The tensor must not be used before
// kiln_cuda_copy_finish makes the compute stream wait for the event.
char* kiln_cuda_copy_start(const at::Tensor* src, int index, at::Tensor** out, void** event) {
  KILN_TRY
  int count = static_cast<int>(c10::cuda::device_count());
  TORCH_CHECK_INDEX(index >= 0 && index < count, "CUDA device index ", index, " out of range");
  auto device = static_cast<c10::DeviceIndex>(index);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
  // Device-generic guard and event (dispatched through libtorch's CUDA guard), so this file
  // calls no CUDA runtime function itself and needs no -lcudart.
  at::Tensor copied;
  {
    c10::StreamGuard guard(side.unwrap());
    copied = src->to(at::Device(at::kCUDA, device), /*non_blocking=*/true);
  }
  auto done = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
  done->record(side.unwrap());
  *out = new at::Tensor(std::move(copied));
  *event = done.release();
  KILN_CATCH
}

// Makes device `index`'s current (compute) stream wait for the copy behind `event`, tells the
// caching allocator the tensor is used on that stream, and frees the event.
char* kiln_cuda_copy_finish(void* event, const at::Tensor* tensor, int index) {
  KILN_TRY
  std::unique_ptr<c10::Event> done(static_cast<c10::Event*>(event));
  c10::Stream current =
      c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index)).unwrap();
  done->block(current);
  tensor->record_stream(current);
  KILN_CATCH
}

// Frees an event whose copy is abandoned.
void kiln_cuda_event_free(void* event) { delete static_cast<c10::Event*>(event); }

}  // extern "C"

// ---- CUDA graphs ------------------------------------------------------------------------

// The Rust side of a captured function (the same contract as kiln_autograd.cpp's BlockCall):
// computes `*out` from `input` (heap `at::Tensor`s; Rust owns `input`, hands `out` over).
using GraphCall = int (*)(void* ctx, at::Tensor* input, at::Tensor** out, char* err,
                          size_t err_len);

namespace {

// One captured graph: replay reads `input` and writes `output`, both fixed in place.
struct Graph {
  at::cuda::CUDAGraph graph;
  at::Tensor input;
  at::Tensor output;
};

at::Tensor call_rust(GraphCall call, void* ctx, const at::Tensor& input) {
  std::array<char, 2048> err{};
  at::Tensor* out = nullptr;
  const int rc = call(ctx, new at::Tensor(input), &out, err.data(), err.size());
  if (rc != 0) kiln::throw_error(rc, std::string("the captured function failed: ") + err.data());
  TORCH_CHECK(out != nullptr, "the captured function failed: it returned no tensor");
  at::Tensor result = std::move(*out);
  delete out;
  return result;
}

// Makes `waiter` wait for the work queued on `on` so far.
void stream_wait(c10::cuda::CUDAStream waiter, c10::cuda::CUDAStream on) {
  c10::Event done(c10::DeviceType::CUDA);
  done.record(on.unwrap());
  done.block(waiter.unwrap());
}

}  // namespace

extern "C" {

// Captures `f(input)` as a CUDA graph, as torch.cuda.graphs does: a static copy of `example`
// is the graph's input; `warmup` eager calls on a side stream first (lazy initialisation, the
// allocator's caches), then one call under capture on that stream. `*out_graph` replays it.
// `relaxed` captures in cudaStreamCaptureModeRelaxed (torch.cuda.graph's
// capture_error_mode="relaxed"): other threads (a batch feeder) keep working, and host-side
// queries the captured code makes (an AOTInductor package asking whether its previous run has
// finished) are allowed.
char* kiln_cuda_graph_capture(const at::Tensor* example, GraphCall call, void* ctx, int warmup,
                              bool relaxed, void** out_graph) {
  KILN_TRY
  TORCH_CHECK_VALUE(example->is_cuda(), "CUDA graphs need a CUDA input; this one is on ",
                    example->device());
  const c10::DeviceIndex device = example->device().index();
  auto g = std::make_unique<Graph>();
  g->input = example->clone();
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
  stream_wait(side, c10::cuda::getCurrentCUDAStream(device));
  {
    c10::StreamGuard guard(side.unwrap());
    for (int i = 0; i < warmup; ++i) {
      (void)call_rust(call, ctx, g->input);
    }
    side.synchronize();
    g->graph.capture_begin({0, 0}, relaxed ? cudaStreamCaptureModeRelaxed
                                           : cudaStreamCaptureModeGlobal);
    try {
      g->output = call_rust(call, ctx, g->input);
    } catch (...) {
      // End the capture so the stream is usable again, then report the first error.
      try {
        g->graph.capture_end();
      } catch (...) {
      }
      throw;
    }
    g->graph.capture_end();
  }
  stream_wait(c10::cuda::getCurrentCUDAStream(device), side);
  *out_graph = g.release();
  KILN_CATCH
}

// Copies `input` (same shape and dtype as the captured one) into the graph's input, replays
// the graph on the current stream, and returns a copy of its output (the graph's own output is
// overwritten by the next replay).
char* kiln_cuda_graph_replay(void* graph, const at::Tensor* input, at::Tensor** out) {
  KILN_TRY
  auto* g = static_cast<Graph*>(graph);
  TORCH_CHECK_VALUE(input->sizes() == g->input.sizes() && input->dtype() == g->input.dtype(),
                    "a CUDA graph replays the shape and dtype it captured: ", g->input.sizes(), " ",
                    g->input.dtype(), ", not ", input->sizes(), " ", input->dtype());
  g->input.copy_(*input, /*non_blocking=*/true);
  g->graph.replay();
  *out = new at::Tensor(g->output.clone());
  KILN_CATCH
}

void kiln_cuda_graph_free(void* graph) { delete static_cast<Graph*>(graph); }

}  // extern "C"

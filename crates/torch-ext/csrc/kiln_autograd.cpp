// kiln native extension: libtorch's own profiler (kineto) with named ranges, and activation
// checkpointing as a C++ autograd function whose forward calls back into Rust.
#include "boundary.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <array>
#include <memory>
#include <set>
#include <string>
#include <utility>

namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

std::set<impl::ActivityType> activities(bool cuda) {
  std::set<impl::ActivityType> out{impl::ActivityType::CPU};
  if (cuda) {
    out.insert(impl::ActivityType::CUDA);
  }
  return out;
}

impl::ProfilerConfig profiler_config(bool record_shapes, bool profile_memory, bool with_stack) {
  return impl::ProfilerConfig(impl::ProfilerState::KINETO, record_shapes, profile_memory,
                              with_stack);
}

// ---- activation checkpointing -------------------------------------------------------------

// The Rust side of a block: computes `*out` from `input` (both heap `at::Tensor`s; Rust owns
// `input` and hands `out` over). Returns 0, or an error kind code (boundary.h) with a message in
// `err`.
using BlockCall = int (*)(void* ctx, at::Tensor* input, at::Tensor** out, char* err,
                          size_t err_len);
using BlockDrop = void (*)(void* ctx);

// Owns the Rust closure for as long as the autograd graph that may call it again lives.
struct Block : torch::CustomClassHolder {
  Block(BlockCall call, void* ctx, BlockDrop drop) : call_(call), ctx_(ctx), drop_(drop) {}
  ~Block() override { drop_(ctx_); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  at::Tensor run(const at::Tensor& input) const {
    std::array<char, 2048> err{};
    at::Tensor* out = nullptr;
    const int rc = call_(ctx_, new at::Tensor(input), &out, err.data(), err.size());
    if (rc != 0) kiln::throw_error(rc, std::string("checkpointed block failed: ") + err.data());
    TORCH_CHECK(out != nullptr, "checkpointed block failed: it returned no tensor");
    at::Tensor result = std::move(*out);
    delete out;
    return result;
  }

 private:
  BlockCall call_;
  void* ctx_;
  BlockDrop drop_;
};

// The autocast state of one device type, captured in forward and re-entered for the recompute
// (on CUDA the backward runs on another thread, whose autocast state is its own).
struct AutocastState {
  bool enabled;
  at::ScalarType dtype;
};

constexpr std::array<at::DeviceType, 2> kAutocastDevices{at::kCPU, at::kCUDA};

class AutocastRestore {
 public:
  explicit AutocastRestore(const std::array<AutocastState, 2>& wanted) {
    for (size_t i = 0; i < kAutocastDevices.size(); ++i) {
      saved_[i] = {at::autocast::is_autocast_enabled(kAutocastDevices[i]),
                   at::autocast::get_autocast_dtype(kAutocastDevices[i])};
      at::autocast::set_autocast_enabled(kAutocastDevices[i], wanted[i].enabled);
      at::autocast::set_autocast_dtype(kAutocastDevices[i], wanted[i].dtype);
    }
    at::autocast::increment_nesting();
  }
  ~AutocastRestore() {
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    for (size_t i = 0; i < kAutocastDevices.size(); ++i) {
      at::autocast::set_autocast_enabled(kAutocastDevices[i], saved_[i].enabled);
      at::autocast::set_autocast_dtype(kAutocastDevices[i], saved_[i].dtype);
    }
  }
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  std::array<AutocastState, 2> saved_{};
};

// Sets a generator to a saved state and puts its current state back on scope exit, so the
// recompute draws exactly the random numbers the forward drew and nothing else moves.
class GeneratorFork {
 public:
  GeneratorFork(at::Generator gen, const at::Tensor& state) : gen_(std::move(gen)) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    current_ = gen_.get_state();
    gen_.set_state(state);
  }
  ~GeneratorFork() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(current_);
  }
  GeneratorFork(const GeneratorFork&) = delete;
  GeneratorFork& operator=(const GeneratorFork&) = delete;

 private:
  at::Generator gen_;
  at::Tensor current_;
};

at::Tensor generator_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// forward: run the block without recording a graph, keep only its input (and the generator
// and autocast state). backward: recompute the block with a graph from the saved input, then
// backpropagate through it (re-entrantly), which accumulates the parameters' gradients and
// yields the input's.
struct Checkpoint : torch::autograd::Function<Checkpoint> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const c10::intrusive_ptr<Block>& block) {
    ctx->saved_data["block"] = c10::IValue::make_capsule(block);
    ctx->saved_data["cpu_rng"] = generator_state(at::detail::getDefaultCPUGenerator());
    if (input.device().type() != at::kCPU) {
      ctx->saved_data["device_rng"] =
          generator_state(at::globalContext().defaultGenerator(input.device()));
    }
    for (size_t i = 0; i < kAutocastDevices.size(); ++i) {
      const std::string key = "autocast" + std::to_string(i);
      ctx->saved_data[key + "_on"] = at::autocast::is_autocast_enabled(kAutocastDevices[i]);
      ctx->saved_data[key + "_dtype"] =
          static_cast<int64_t>(at::autocast::get_autocast_dtype(kAutocastDevices[i]));
    }
    ctx->save_for_backward({input});
    return block->run(input);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    auto block =
        c10::static_intrusive_pointer_cast<Block>(ctx->saved_data["block"].toCapsule());
    std::array<AutocastState, 2> autocast{};
    for (size_t i = 0; i < kAutocastDevices.size(); ++i) {
      const std::string key = "autocast" + std::to_string(i);
      autocast[i] = {ctx->saved_data[key + "_on"].toBool(),
                     static_cast<at::ScalarType>(ctx->saved_data[key + "_dtype"].toInt())};
    }
    at::Tensor x = input.detach().requires_grad_(input.requires_grad());
    at::Tensor out;
    {
      GeneratorFork cpu(at::detail::getDefaultCPUGenerator(),
                        ctx->saved_data["cpu_rng"].toTensor());
      std::unique_ptr<GeneratorFork> device;
      if (ctx->saved_data.find("device_rng") != ctx->saved_data.end()) {
        device = std::make_unique<GeneratorFork>(
            at::globalContext().defaultGenerator(input.device()),
            ctx->saved_data["device_rng"].toTensor());
      }
      AutocastRestore autocast_guard(autocast);
      at::AutoGradMode grad_mode(true);
      out = block->run(x);
    }
    if (out.requires_grad()) {
      torch::autograd::backward({out}, {grads[0]});
    }
    return {input.requires_grad() ? x.grad() : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// `block(input)` whose intermediate activations are recomputed in backward instead of kept.
// `ctx` is released with `drop` when the graph no longer needs it (or at once on failure).
char* kiln_checkpoint(const at::Tensor* input, BlockCall call, void* ctx, BlockDrop drop,
                      at::Tensor** out) {
  c10::intrusive_ptr<Block> block;
  try {
    block = c10::make_intrusive<Block>(call, ctx, drop);
  } catch (...) {
    drop(ctx);
    return kiln::error_string(kiln::ErrorKind::OutOfMemory,
                              "could not allocate the checkpointed block");
  }
  KILN_TRY
  if (!at::GradMode::is_enabled()) {
    *out = new at::Tensor(block->run(*input));
    return nullptr;
  }
  // An input that needs no gradient still gets a graph through the block, so that the
  // parameters the block uses receive theirs (the input's own is then discarded).
  const at::Tensor x = input->requires_grad() ? *input : input->detach().requires_grad_(true);
  *out = new at::Tensor(Checkpoint::apply(x, block));
  KILN_CATCH
}

// ---- profiler -----------------------------------------------------------------------------

// Readies kineto (the profiler's warm-up: nothing is recorded yet).
char* kiln_profiler_prepare(bool cuda, bool record_shapes, bool profile_memory,
                            bool with_stack) {
  KILN_TRY
  prof::prepareProfiler(profiler_config(record_shapes, profile_memory, with_stack),
                        activities(cuda));
  KILN_CATCH
}

// Starts recording operator (and with `cuda`, kernel) events on this thread.
char* kiln_profiler_start(bool cuda, bool record_shapes, bool profile_memory, bool with_stack) {
  KILN_TRY
  TORCH_CHECK(!prof::profilerEnabled(), "a profiler is already recording on this thread");
  prof::enableProfiler(profiler_config(record_shapes, profile_memory, with_stack),
                       activities(cuda));
  KILN_CATCH
}

char* kiln_profiler_is_enabled(bool* out) {
  KILN_TRY
  *out = prof::profilerEnabled();
  KILN_CATCH
}

// Stops recording; the result is handed to Rust (free it with kiln_profiler_result_free).
char* kiln_profiler_stop(void** out) {
  KILN_TRY
  TORCH_CHECK(prof::profilerEnabled(), "no profiler is recording on this thread");
  *out = prof::disableProfiler().release();
  KILN_CATCH
}

// Writes the trace as Chrome trace JSON (Perfetto, chrome://tracing).
char* kiln_profiler_result_save(void* result, const char* path) {
  KILN_TRY
  static_cast<prof::ProfilerResult*>(result)->save(path);
  KILN_CATCH
}

// How many events were recorded, how many of them were operators (ATen ops), and the peak of
// the bytes allocated while recording (from the memory events; 0 without profile_memory),
// relative to what was allocated when recording began.
char* kiln_profiler_result_stats(void* result, int64_t* events, int64_t* operators,
                                 int64_t* peak_bytes) {
  KILN_TRY
  const auto& all = static_cast<prof::ProfilerResult*>(result)->events();
  std::vector<std::pair<uint64_t, int64_t>> memory;
  int64_t ops = 0;
  for (const auto& e : all) {
    if (e.name() == "[memory]") {
      memory.emplace_back(e.startNs(), e.nBytes());
    } else if (e.scope() == static_cast<uint8_t>(at::RecordScope::FUNCTION)) {
      ++ops;
    }
  }
  std::stable_sort(memory.begin(), memory.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  int64_t current = 0;
  int64_t peak = 0;
  for (const auto& [ts, bytes] : memory) {
    current += bytes;
    peak = std::max(peak, current);
  }
  *events = static_cast<int64_t>(all.size());
  *operators = ops;
  *peak_bytes = peak;
  KILN_CATCH
}

void kiln_profiler_result_free(void* result) {
  delete static_cast<prof::ProfilerResult*>(result);
}

// A named range (at::RecordFunction in the user scope) on this thread; ended by
// kiln_range_end on the same thread.
char* kiln_range_begin(const char* name, void** out) {
  KILN_TRY
  auto range = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (range->isActive()) {
    range->before(std::string_view(name), c10::ArrayRef<const c10::IValue>{});
  }
  *out = range.release();
  KILN_CATCH
}

void kiln_range_end(void* range) {
  auto* r = static_cast<at::RecordFunction*>(range);
  r->end();
  delete r;
}

}  // extern "C"

// kiln native extension: data-parallel collectives on PyTorch's c10d (TCPStore rendezvous,
// ProcessGroupGloo wrapped in a c10d::ProcessGroup). Compiled with -DUSE_C10D_GLOO against
// kiln's own minimal gloo declarations (csrc/gloo/): no gloo object is ever touched here.
#include "boundary.h"
#include "dist.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <algorithm>
#include <limits>
#include <memory>

#include <chrono>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using kiln::Group;

std::vector<at::Tensor> list(const at::Tensor* const* ts, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(*ts[i]);
  return out;
}

}  // namespace

namespace kiln {

// The rendezvous: rank 0 hosts the TCPStore unless torchrun's agent already does; then every
// rank is a client and keys live under torchrun's per-attempt prefix.
c10::intrusive_ptr<c10d::Store> dist_store(int rank, int world, const char* addr, int port,
                                          std::chrono::milliseconds timeout, bool agent_store,
                                          const char* restart_count) {
  TORCH_CHECK_VALUE(port > 0 && port < 65536, "MASTER_PORT must be in 1..65535, got ", port);
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = rank == 0 && !agent_store;
  so.numWorkers = world;
  so.waitWorkers = !agent_store;
  so.timeout = timeout;
  so.multiTenant = true;
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(addr, so);
  if (agent_store) {
    store = c10::make_intrusive<c10d::PrefixStore>(
        std::string("/worker/attempt_") + restart_count, store);
  }
  return c10::make_intrusive<c10d::PrefixStore>("kiln/", store);
}

Group gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                 std::chrono::milliseconds timeout, const char* gloo_host) {
  auto options = std::string(gloo_host).empty()
                     ? c10d::ProcessGroupGloo::Options::create_default(timeout)
                     : c10d::ProcessGroupGloo::Options::create(timeout);
  if (!std::string(gloo_host).empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(gloo_host));
  }
  options->threads = 2;
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO,
                 c10::intrusive_ptr<c10d::Backend>(gloo));
  pg->setGroupName("kiln");
  return pg;
}

}  // namespace kiln

extern "C" {

// A process group of `world` ranks (this one `rank`) on Gloo. `gloo_host` names the address to
// bind ("127.0.0.1" for one machine); empty uses c10d's default (GLOO_SOCKET_IFNAME, else the
// hostname's address). `*out` is an owned handle for kiln_dist_free.
char* kiln_dist_connect(int rank, int world, const char* addr, int port, double timeout_s,
                        bool agent_store, const char* restart_count, const char* gloo_host,
                        void** out) {
  KILN_TRY
  TORCH_CHECK_VALUE(world >= 1 && rank >= 0 && rank < world, "rank ", rank,
                    " must be in 0..", world, " (WORLD_SIZE)");
  auto timeout = kiln::dist_millis(timeout_s);
  auto store = kiln::dist_store(rank, world, addr, port, timeout, agent_store, restart_count);
  *out = new Group(kiln::gloo_group(store, rank, world, timeout, gloo_host));
  KILN_DIST_CATCH
}

// Leaves the group: its backends shut down (NCCL's communicators are destroyed), then the
// handle is freed.
void kiln_dist_free(void* group) {
  auto* g = static_cast<Group*>(group);
  try {
    (*g)->shutdown();
  } catch (...) {
    // Leaving cannot fail; what a backend says while shutting down is of no use here.
  }
  delete g;
}

// Each tensor becomes rank `root`'s.
char* kiln_dist_broadcast(void* group, const at::Tensor* const* ts, size_t n, int root) {
  KILN_TRY
  auto& pg = *static_cast<Group*>(group);
  c10d::BroadcastOptions options;
  options.rootRank = root;
  for (size_t i = 0; i < n; ++i) {
    std::vector<at::Tensor> one{*ts[i]};
    pg->broadcast(one, options)->wait();
  }
  KILN_DIST_CATCH
}

// Each tensor becomes the sum over the ranks, divided by the world size when `mean`.
char* kiln_dist_all_reduce(void* group, const at::Tensor* const* ts, size_t n, bool mean) {
  KILN_TRY
  auto& pg = *static_cast<Group*>(group);
  auto tensors = list(ts, n);
  for (auto& t : tensors) {
    std::vector<at::Tensor> one{t};
    pg->allreduce(one)->wait();
    if (mean) t.div_(pg->getSize());
  }
  KILN_DIST_CATCH
}

// Starts summing `t` over the ranks in place (a Gloo worker does it while the caller goes on);
// `*out` is the work's handle, for kiln_dist_work_wait and kiln_dist_work_free.
char* kiln_dist_all_reduce_start(void* group, const at::Tensor* t, void** out) {
  KILN_TRY
  std::vector<at::Tensor> one{*t};
  *out = new c10::intrusive_ptr<c10d::Work>((*static_cast<Group*>(group))->allreduce(one));
  KILN_DIST_CATCH
}

// Waits for a started collective (within the group's timeout).
char* kiln_dist_work_wait(void* work) {
  KILN_TRY
  (*static_cast<c10::intrusive_ptr<c10d::Work>*>(work))->wait();
  KILN_DIST_CATCH
}

// Lets go of a work handle (the group keeps what it still needs).
void kiln_dist_work_free(void* work) {
  delete static_cast<c10::intrusive_ptr<c10d::Work>*>(work);
}

char* kiln_dist_barrier(void* group) {
  KILN_TRY
  (*static_cast<Group*>(group))->barrier()->wait();
  KILN_DIST_CATCH
}

// Checks that every rank holds parameters of the same number, shapes and kinds (c10d's own
// check, which DistributedDataParallel runs at start); every rank fails alike, naming the
// first difference.
char* kiln_dist_verify_params(void* group, const at::Tensor* const* ts, size_t n) {
  KILN_TRY
  at::NoGradGuard no_grad;
  c10d::verify_params_across_processes(*static_cast<Group*>(group), list(ts, n), std::nullopt);
  KILN_DIST_CATCH
}

// Every tensor becomes rank `root`'s, sent in flat buffers of at most `buffer_bytes`
// (DistributedDataParallel's start-of-training sync of parameters and buffers).
char* kiln_dist_broadcast_coalesced(void* group, const at::Tensor* const* ts, size_t n,
                                    int64_t buffer_bytes, int root) {
  KILN_TRY
  TORCH_CHECK_VALUE(buffer_bytes > 0, "the broadcast buffer must be positive");
  at::NoGradGuard no_grad;
  auto tensors = list(ts, n);
  c10d::broadcast_coalesced(*static_cast<Group*>(group), tensors,
                            static_cast<size_t>(buffer_bytes), root);
  KILN_DIST_CATCH
}

// c10d's DDP engine over `params`: autograd hooks all-reduce (and average) gradient buckets
// while backward runs. Buckets as DistributedDataParallel builds them: without unused
// parameters one bucket for the first step, rebuilt in the order gradients arrived
// (`first_bucket_bytes`, then `bucket_bytes` each); with them, those caps from the start.
char* kiln_dist_reducer_new(void* group, const at::Tensor* const* ts, size_t n,
                            int64_t bucket_bytes, int64_t first_bucket_bytes, bool find_unused,
                            void** out) {
  KILN_TRY
  TORCH_CHECK_VALUE(n > 0, "data-parallel training needs at least one trainable parameter");
  TORCH_CHECK_VALUE(bucket_bytes > 0 && first_bucket_bytes > 0,
                    "gradient bucket sizes must be positive");
  auto params = list(ts, n);
  std::vector<size_t> caps{std::numeric_limits<size_t>::max()};
  if (find_unused) {
    caps = {static_cast<size_t>(first_bucket_bytes), static_cast<size_t>(bucket_bytes)};
  }
  std::vector<bool> sparse(n, false);
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(params, caps, sparse);
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(limits.begin(), limits.end());
  std::vector<int64_t> byte_limits;
  for (auto l : limits) {
    byte_limits.push_back(static_cast<int64_t>(std::min<size_t>(
        l, static_cast<size_t>(std::numeric_limits<int64_t>::max()))));
  }
  *out = new std::shared_ptr<c10d::Reducer>(std::make_shared<c10d::Reducer>(
      params, buckets, *static_cast<Group*>(group), sparse, bucket_bytes, find_unused,
      /*gradient_as_bucket_view=*/false, std::unordered_map<size_t, std::string>{},
      first_bucket_bytes, /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false, byte_limits));
  KILN_DIST_CATCH
}

void kiln_dist_reducer_free(void* reducer) {
  delete static_cast<std::shared_ptr<c10d::Reducer>*>(reducer);
}

// Before a forward pass (DistributedDataParallel's pre-forward): rebuild the buckets once
// their order is known; when this micro-batch's gradients are synchronised, say so.
char* kiln_dist_reducer_before_forward(void* reducer, bool sync) {
  KILN_TRY
  auto& r = *static_cast<std::shared_ptr<c10d::Reducer>*>(reducer);
  r->rebuild_buckets();
  if (sync) r->prepare_for_forward();
  KILN_DIST_CATCH
}

// Before backward of a synchronised micro-batch: arm the hooks. `outputs` (with unused
// parameters) are where the search for parameters that got no gradient starts.
char* kiln_dist_reducer_before_backward(void* reducer, const at::Tensor* const* ts, size_t n) {
  KILN_TRY
  auto& r = *static_cast<std::shared_ptr<c10d::Reducer>*>(reducer);
  r->prepare_for_backward(list(ts, n));
  KILN_DIST_CATCH
}

}  // extern "C"

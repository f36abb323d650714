// kiln native extension: data-parallel collectives on PyTorch's c10d (TCPStore rendezvous,
// ProcessGroupGloo wrapped in a c10d::ProcessGroup). Compiled with -DUSE_C10D_GLOO against
// kiln's own minimal gloo declarations (csrc/gloo/): no gloo object is ever touched here.
#include "boundary.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace {

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

std::vector<at::Tensor> list(const at::Tensor* const* ts, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(*ts[i]);
  return out;
}

std::chrono::milliseconds millis(double seconds) {
  TORCH_CHECK_VALUE(seconds > 0, "the timeout must be positive, got ", seconds, " s");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// The rendezvous: rank 0 hosts the TCPStore unless torchrun's agent already does; then every
// rank is a client and keys live under torchrun's per-attempt prefix.
c10::intrusive_ptr<c10d::Store> store_for(int rank, int world, const char* addr, int port,
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

}  // namespace

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
  auto timeout = millis(timeout_s);
  auto store = store_for(rank, world, addr, port, timeout, agent_store, restart_count);
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
  *out = new Group(std::move(pg));
  KILN_CATCH
}

void kiln_dist_free(void* group) { delete static_cast<Group*>(group); }

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
  KILN_CATCH
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
  KILN_CATCH
}

char* kiln_dist_barrier(void* group) {
  KILN_TRY
  (*static_cast<Group*>(group))->barrier()->wait();
  KILN_CATCH
}

}  // extern "C"

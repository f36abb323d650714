// kiln native extension: what the data-parallel translation units share (kiln_dist.cpp builds
// the rendezvous and the Gloo part of a process group; kiln_nccl.cpp, compiled only where NCCL
// and CUDA headers are found, adds NCCL for CUDA tensors to such a group).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>

namespace kiln {

// The handle Rust holds for a process group (kiln_dist_free deletes it).
using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

// Seconds as a positive c10d timeout.
inline std::chrono::milliseconds dist_millis(double seconds) {
  TORCH_CHECK_VALUE(seconds > 0, "the timeout must be positive, got ", seconds, " s");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// The rendezvous store (see kiln_dist.cpp).
c10::intrusive_ptr<c10d::Store> dist_store(int rank, int world, const char* addr, int port,
                                          std::chrono::milliseconds timeout, bool agent_store,
                                          const char* restart_count);

// A process group whose CPU tensors go through Gloo, bound to `gloo_host` (empty: c10d's
// default interface).
Group gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
                 std::chrono::milliseconds timeout, const char* gloo_host);

}  // namespace kiln

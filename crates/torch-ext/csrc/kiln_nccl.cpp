// kiln native extension: data-parallel groups on CUDA — NCCL (c10d::ProcessGroupNCCL) for CUDA
// tensors beside Gloo for CPU ones, in one c10d::ProcessGroup, as PyTorch's
// "cpu:gloo,cuda:nccl". Compiled only where NCCL's and CUDA's headers are found (the wheel's
// nvidia/nccl and nvidia/cu13), with -DUSE_C10D_NCCL -DUSE_CUDA.
#include "boundary.h"
#include "dist.h"

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <string>

extern "C" {

// Like kiln_dist_connect, plus NCCL for CUDA tensors on device `device_index` (this rank's
// LOCAL_RANK; NCCL takes one rank per GPU).
char* kiln_dist_connect_nccl(int rank, int world, const char* addr, int port, double timeout_s,
                             bool agent_store, const char* restart_count, const char* gloo_host,
                             int device_index, void** out) {
  KILN_TRY
  TORCH_CHECK_VALUE(world >= 1 && rank >= 0 && rank < world, "rank ", rank,
                    " must be in 0..", world, " (WORLD_SIZE)");
  const int devices = static_cast<int>(c10::cuda::device_count());
  TORCH_CHECK_VALUE(device_index >= 0 && device_index < devices, "LOCAL_RANK ", device_index,
                    " has no GPU of its own: this machine has ", devices,
                    " (NCCL takes one rank per GPU; start at most that many ranks per machine)");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
  auto timeout = kiln::dist_millis(timeout_s);
  auto store = kiln::dist_store(rank, world, addr, port, timeout, agent_store, restart_count);
  auto pg = kiln::gloo_group(store, rank, world, timeout, gloo_host);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
      c10::make_intrusive<c10d::PrefixStore>("nccl/", store), rank, world, options);
  pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL,
                 c10::intrusive_ptr<c10d::Backend>(nccl));
  *out = new kiln::Group(std::move(pg));
  KILN_DIST_CATCH
}

}  // extern "C"

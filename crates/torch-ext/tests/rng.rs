//! The CPU generator's state round-trips. Alone in its test binary: the generator is
//! process-wide, and tests running in parallel beside it would draw from it in between.

use tch::{Kind, Tensor};

#[test]
fn the_cpu_generator_state_round_trips() {
    let state = kiln_torch_ext::rng::cpu_rng_state().unwrap();
    let a = Tensor::rand([5], (Kind::Float, tch::Device::Cpu));
    kiln_torch_ext::rng::set_cpu_rng_state(&state).unwrap();
    let b = Tensor::rand([5], (Kind::Float, tch::Device::Cpu));
    assert!(a.equal(&b), "same state, same draws");
    let bad = Tensor::zeros([3], (Kind::Uint8, tch::Device::Cpu));
    assert!(kiln_torch_ext::rng::set_cpu_rng_state(&bad).is_err());
}

#[test]
fn a_cuda_generator_that_is_not_there_is_an_error() {
    let absent = kiln_torch_ext::cuda::device_count().unwrap_or(0);
    let err = kiln_torch_ext::rng::cuda_rng_state(absent).unwrap_err();
    assert!(err.to_string().contains("CUDA RNG state"), "{err}");
    let state = Tensor::zeros([16], (Kind::Uint8, tch::Device::Cpu));
    assert!(kiln_torch_ext::rng::set_cuda_rng_state(absent, &state).is_err());
}

#[test]
#[ignore = "needs CUDA; `cargo xtask test --cuda` runs it"]
fn the_cuda_generator_state_round_trips_on_cuda() {
    assert!(
        kiln_torch_ext::cuda::device_count().unwrap_or(0) > 0,
        "this test needs a CUDA device and this machine has none"
    );
    let device = tch::Device::Cuda(0);
    let state = kiln_torch_ext::rng::cuda_rng_state(0).unwrap();
    let a = Tensor::rand([5], (Kind::Float, device)).dropout(0.5, true);
    kiln_torch_ext::rng::set_cuda_rng_state(0, &state).unwrap();
    let b = Tensor::rand([5], (Kind::Float, device)).dropout(0.5, true);
    assert!(a.equal(&b), "same state, same draws and masks");
}

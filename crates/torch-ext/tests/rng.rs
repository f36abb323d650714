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

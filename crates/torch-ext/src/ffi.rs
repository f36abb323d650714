//! Raw declarations of the C ABI in `csrc/`, and the one place C error strings become [`Error`].

use std::ffi::{CStr, c_char, c_int};

use crate::error::{Error, ErrorKind, Result};

/// The Rust side of a checkpointed block (see `csrc/kiln_autograd.cpp`): computes `*out` from
/// `input` (a heap tensor it takes ownership of), or writes a message into `err` and returns
/// non-zero.
pub type BlockCall = unsafe extern "C" fn(
    ctx: *mut std::ffi::c_void,
    input: *mut std::ffi::c_void,
    out: *mut *mut std::ffi::c_void,
    err: *mut c_char,
    err_len: usize,
) -> c_int;

/// Releases a block's context.
pub type BlockDrop = unsafe extern "C" fn(ctx: *mut std::ffi::c_void);

// SAFETY (for the whole block): every function is defined in csrc/*.cpp with exactly these C
// signatures, catches all C++ exceptions, and returns null or a malloc'd error string.
unsafe extern "C" {
    pub fn kiln_free_string(s: *mut c_char);

    pub fn kiln_aoti_load(
        path: *const c_char,
        device_index: c_int,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_aoti_free(handle: *mut std::ffi::c_void);
    pub fn kiln_aoti_run(
        handle: *mut std::ffi::c_void,
        inputs: *const *const std::ffi::c_void,
        n: usize,
        out: *mut *mut std::ffi::c_void,
        cap: usize,
        n_out: *mut usize,
    ) -> *mut c_char;
    pub fn kiln_aoti_metadata(handle: *mut std::ffi::c_void, out: *mut *mut c_char) -> *mut c_char;
    pub fn kiln_accumulate_grads(
        params: *const *const std::ffi::c_void,
        grads: *const *const std::ffi::c_void,
        n: usize,
        weight: f64,
    ) -> *mut c_char;
    pub fn kiln_torch_version() -> *const c_char;

    pub fn kiln_set_float32_matmul_precision(precision: *const c_char) -> *mut c_char;
    pub fn kiln_float32_matmul_precision(out: *mut c_int) -> *mut c_char;
    pub fn kiln_set_flag(flag: c_int, value: bool) -> *mut c_char;
    pub fn kiln_get_flag(flag: c_int, out: *mut bool) -> *mut c_char;
    pub fn kiln_set_deterministic_algorithms(enabled: bool, warn_only: bool) -> *mut c_char;
    pub fn kiln_deterministic_algorithms(enabled: *mut bool, warn_only: *mut bool) -> *mut c_char;

    pub fn kiln_autocast_set_enabled(device: c_int, enabled: bool) -> *mut c_char;
    pub fn kiln_autocast_is_enabled(device: c_int, out: *mut bool) -> *mut c_char;
    pub fn kiln_autocast_set_dtype(device: c_int, dtype: c_int) -> *mut c_char;
    pub fn kiln_autocast_dtype(device: c_int, out: *mut c_int) -> *mut c_char;
    pub fn kiln_autocast_enter(depth: *mut c_int) -> *mut c_char;
    pub fn kiln_autocast_exit(depth: *mut c_int) -> *mut c_char;

    pub fn kiln_fused_adamw(
        params: *const *const std::ffi::c_void,
        grads: *const *const std::ffi::c_void,
        exp_avgs: *const *const std::ffi::c_void,
        exp_avg_sqs: *const *const std::ffi::c_void,
        max_exp_avg_sqs: *const *const std::ffi::c_void,
        n_max: usize,
        state_steps: *const *const std::ffi::c_void,
        n: usize,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        amsgrad: bool,
        maximize: bool,
        grad_scale: *const std::ffi::c_void,
        found_inf: *const std::ffi::c_void,
        lr_tensor: *const std::ffi::c_void,
    ) -> *mut c_char;

    pub fn kiln_amp_unscale(
        grads: *const *const std::ffi::c_void,
        n: usize,
        found_inf: *const std::ffi::c_void,
        inv_scale: *const std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_foreach_add_(
        tensors: *const *const std::ffi::c_void,
        n: usize,
        other: *const std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_foreach_lerp_(
        ends_at: *const *const std::ffi::c_void,
        towards: *const *const std::ffi::c_void,
        n: usize,
        weight: f64,
    ) -> *mut c_char;
    pub fn kiln_foreach_copy_(
        dst: *const *const std::ffi::c_void,
        src: *const *const std::ffi::c_void,
        n: usize,
    ) -> *mut c_char;
    pub fn kiln_amp_update_scale(
        scale: *const std::ffi::c_void,
        growth_tracker: *const std::ffi::c_void,
        found_inf: *const std::ffi::c_void,
        growth: f64,
        backoff: f64,
        interval: i64,
    ) -> *mut c_char;
    pub fn kiln_fused_sgd(
        params: *const *const std::ffi::c_void,
        grads: *const *const std::ffi::c_void,
        momentum_buffers: *const *const std::ffi::c_void,
        n: usize,
        weight_decay: f64,
        momentum: f64,
        lr: f64,
        dampening: f64,
        nesterov: bool,
        maximize: bool,
        is_first_step: bool,
        grad_scale: *const std::ffi::c_void,
        found_inf: *const std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_clip_grad_norm(
        grads: *const *const std::ffi::c_void,
        n: usize,
        max_norm: f64,
        total_norm: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_clear_grads(params: *const *const std::ffi::c_void, n: usize) -> *mut c_char;
    pub fn kiln_to_channels_last(
        t: *const std::ffi::c_void,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_param_to_channels_last(p: *const std::ffi::c_void) -> *mut c_char;
    pub fn kiln_param_to_contiguous(p: *const std::ffi::c_void) -> *mut c_char;
    pub fn kiln_is_channels_last(t: *const std::ffi::c_void, out: *mut bool) -> *mut c_char;
    pub fn kiln_blend_windows(
        sum: *const std::ffi::c_void,
        count: *const std::ffi::c_void,
        outs: *const std::ffi::c_void,
        weight: *const std::ffi::c_void,
        starts: *const i64,
        n: usize,
        left: *mut u32,
        planned: *const u32,
        rows: usize,
    ) -> *mut c_char;
    pub fn kiln_cpu_rng_state(out: *mut *mut std::ffi::c_void) -> *mut c_char;
    pub fn kiln_set_cpu_rng_state(state: *const std::ffi::c_void) -> *mut c_char;
    pub fn kiln_dist_connect(
        rank: c_int,
        world: c_int,
        addr: *const c_char,
        port: c_int,
        timeout_s: f64,
        agent_store: bool,
        restart_count: *const c_char,
        gloo_host: *const c_char,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    #[cfg(kiln_nccl)]
    pub fn kiln_dist_connect_nccl(
        rank: c_int,
        world: c_int,
        addr: *const c_char,
        port: c_int,
        timeout_s: f64,
        agent_store: bool,
        restart_count: *const c_char,
        gloo_host: *const c_char,
        device_index: c_int,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_dist_free(group: *mut std::ffi::c_void);
    pub fn kiln_dist_broadcast(
        group: *mut std::ffi::c_void,
        ts: *const *const std::ffi::c_void,
        n: usize,
        root: c_int,
    ) -> *mut c_char;
    pub fn kiln_dist_all_reduce(
        group: *mut std::ffi::c_void,
        ts: *const *const std::ffi::c_void,
        n: usize,
        mean: bool,
    ) -> *mut c_char;
    pub fn kiln_dist_barrier(group: *mut std::ffi::c_void) -> *mut c_char;
    pub fn kiln_dist_all_reduce_start(
        group: *mut std::ffi::c_void,
        t: *const std::ffi::c_void,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_dist_work_wait(work: *mut std::ffi::c_void) -> *mut c_char;
    pub fn kiln_dist_work_free(work: *mut std::ffi::c_void);
    pub fn kiln_dist_verify_params(
        group: *mut std::ffi::c_void,
        ts: *const *const std::ffi::c_void,
        n: usize,
    ) -> *mut c_char;
    pub fn kiln_dist_broadcast_coalesced(
        group: *mut std::ffi::c_void,
        ts: *const *const std::ffi::c_void,
        n: usize,
        buffer_bytes: i64,
        root: c_int,
    ) -> *mut c_char;
    pub fn kiln_dist_reducer_new(
        group: *mut std::ffi::c_void,
        ts: *const *const std::ffi::c_void,
        n: usize,
        bucket_bytes: i64,
        first_bucket_bytes: i64,
        find_unused: bool,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_dist_reducer_free(reducer: *mut std::ffi::c_void);
    pub fn kiln_dist_reducer_before_forward(
        reducer: *mut std::ffi::c_void,
        sync: bool,
    ) -> *mut c_char;
    pub fn kiln_dist_reducer_before_backward(
        reducer: *mut std::ffi::c_void,
        ts: *const *const std::ffi::c_void,
        n: usize,
    ) -> *mut c_char;
    pub fn kiln_cuda_rng_state(index: c_int, out: *mut *mut std::ffi::c_void) -> *mut c_char;
    pub fn kiln_set_cuda_rng_state(index: c_int, state: *const std::ffi::c_void) -> *mut c_char;
    pub fn kiln_dropout(
        x: *const std::ffi::c_void,
        p: f64,
        seed: u64,
        offset: u64,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_dropout_mask(
        like: *const std::ffi::c_void,
        p: f64,
        seed: u64,
        offset: u64,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;

    pub fn kiln_set_num_threads(n: c_int) -> *mut c_char;
    pub fn kiln_set_num_interop_threads(n: c_int) -> *mut c_char;
    pub fn kiln_num_threads(intra: *mut c_int, inter: *mut c_int) -> *mut c_char;
    pub fn kiln_memory_stats(device: c_int, out: *mut i64) -> *mut c_char;
    pub fn kiln_reset_peak_memory(device: c_int) -> *mut c_char;
    pub fn kiln_empty_cache() -> *mut c_char;
    pub fn kiln_tensor_from_owned(
        data: *mut std::ffi::c_void,
        shape: *const i64,
        ndim: usize,
        kind: c_int,
        free_fn: unsafe extern "C" fn(*mut std::ffi::c_void),
        ctx: *mut std::ffi::c_void,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_host_tensor(
        data: *const std::ffi::c_void,
        bytes: usize,
        shape: *const i64,
        ndim: usize,
        kind: c_int,
        pinned: bool,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;

    pub fn kiln_cuda_build_versions(
        cudart: *mut std::ffi::c_long,
        cudnn: *mut std::ffi::c_long,
    ) -> *mut c_char;

    pub fn kiln_libtorch_cpu_path(buf: *mut c_char, len: usize) -> *mut c_char;
    pub fn kiln_checkpoint(
        input: *const std::ffi::c_void,
        call: BlockCall,
        ctx: *mut std::ffi::c_void,
        drop: BlockDrop,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;

    pub fn kiln_profiler_prepare(
        cuda: bool,
        record_shapes: bool,
        profile_memory: bool,
        with_stack: bool,
    ) -> *mut c_char;
    pub fn kiln_profiler_start(
        cuda: bool,
        record_shapes: bool,
        profile_memory: bool,
        with_stack: bool,
    ) -> *mut c_char;
    pub fn kiln_profiler_is_enabled(out: *mut bool) -> *mut c_char;
    pub fn kiln_profiler_stop(out: *mut *mut std::ffi::c_void) -> *mut c_char;
    pub fn kiln_profiler_result_save(
        result: *mut std::ffi::c_void,
        path: *const c_char,
    ) -> *mut c_char;
    pub fn kiln_profiler_result_stats(
        result: *mut std::ffi::c_void,
        events: *mut i64,
        operators: *mut i64,
        peak_bytes: *mut i64,
    ) -> *mut c_char;
    pub fn kiln_profiler_result_free(result: *mut std::ffi::c_void);
    pub fn kiln_range_begin(name: *const c_char, out: *mut *mut std::ffi::c_void) -> *mut c_char;
    pub fn kiln_range_end(range: *mut std::ffi::c_void);

    pub fn kiln_dlopen_global(path: *const c_char) -> *mut c_char;
}

#[cfg(kiln_cuda)]
unsafe extern "C" {
    pub fn kiln_cuda_set_memory_fraction(fraction: f64, index: c_int) -> *mut c_char;
    pub fn kiln_cuda_device_count(out: *mut c_int) -> *mut c_char;
    pub fn kiln_cuda_graph_capture(
        example: *const std::ffi::c_void,
        call: BlockCall,
        ctx: *mut std::ffi::c_void,
        warmup: c_int,
        relaxed: bool,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_cuda_graph_replay(
        graph: *mut std::ffi::c_void,
        input: *const std::ffi::c_void,
        out: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_cuda_graph_free(graph: *mut std::ffi::c_void);
    pub fn kiln_cuda_copy_start(
        src: *const std::ffi::c_void,
        index: c_int,
        out: *mut *mut std::ffi::c_void,
        event: *mut *mut std::ffi::c_void,
    ) -> *mut c_char;
    pub fn kiln_cuda_copy_finish(
        event: *mut std::ffi::c_void,
        tensor: *const std::ffi::c_void,
        index: c_int,
    ) -> *mut c_char;
    pub fn kiln_cuda_event_free(event: *mut std::ffi::c_void);
    pub fn kiln_cuda_device_properties(
        index: c_int,
        name: *mut c_char,
        name_len: usize,
        uuid: *mut u8,
        total_mem: *mut u64,
        major: *mut c_int,
        minor: *mut c_int,
    ) -> *mut c_char;
}

// SAFETY: defined in csrc/kiln_script.cpp with exactly this C signature; catches all C++
// exceptions.
unsafe extern "C" {
    pub fn kiln_script_inspect(
        path: *const c_char,
        method: *const c_char,
        training: *mut bool,
        has_method: *mut bool,
        parameters: *mut i64,
        forward_args: *mut *mut c_char,
    ) -> *mut c_char;
}

/// Turns the C side's error string into a `Result`, freeing it.
pub fn check(op: &'static str, err: *mut c_char) -> Result<()> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null return is a NUL-terminated string from malloc that we now own.
    let bytes = unsafe { CStr::from_ptr(err) }.to_bytes();
    let (kind, message) = decode_error(bytes);
    // SAFETY: freed exactly once, with the allocator that made it (`bytes` is not used after).
    unsafe { kiln_free_string(err) };
    Err(Error::Torch { op, kind, message })
}

/// The kind and message of an error string of the C ABI (`csrc/boundary.h`): its first byte
/// is the kind's code, the message follows. libtorch's CPU allocator fails with a plain
/// `c10::Error`, so an `Other` whose text is an allocator's is out of memory.
fn decode_error(bytes: &[u8]) -> (ErrorKind, String) {
    let (kind, text) = match bytes.split_first() {
        Some((code, text)) => (ErrorKind::from_code(*code), text),
        None => (ErrorKind::Other, bytes),
    };
    let message = String::from_utf8_lossy(text).trim().to_owned();
    let kind = match kind {
        ErrorKind::Other if crate::error::out_of_memory_text(&message) => ErrorKind::OutOfMemory,
        kind => kind,
    };
    (kind, message)
}

/// The raw `torch::Tensor*` behind a tch tensor, for passing into C++.
pub fn tensor_ptr(t: &tch::Tensor) -> *const std::ffi::c_void {
    t.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_strings_decode_into_their_kind_and_message() {
        let cpu_oom = "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't \
                       allocate memory: you tried to allocate 1125899906842624 bytes.";
        let cpu_oom_bytes = [b"\x01", cpu_oom.as_bytes()].concat();
        let cases: [(&[u8], ErrorKind, &str); 8] = [
            (b"\x01boom\n", ErrorKind::Other, "boom"),
            (
                b"\x02CUDA out of memory. Tried",
                ErrorKind::OutOfMemory,
                "CUDA out of memory. Tried",
            ),
            (
                b"\x03index 5 out of range",
                ErrorKind::InvalidArgument,
                "index 5 out of range",
            ),
            (b"\x04no kernel", ErrorKind::NotImplemented, "no kernel"),
            (
                b"\x05Connection closed by peer",
                ErrorKind::Distributed,
                "Connection closed by peer",
            ),
            (b"\x7fnew kind", ErrorKind::Other, "new kind"),
            (b"", ErrorKind::Other, ""),
            (&cpu_oom_bytes, ErrorKind::OutOfMemory, cpu_oom),
        ];
        for (bytes, kind, message) in cases {
            assert_eq!(decode_error(bytes), (kind, message.to_owned()), "{bytes:?}");
        }
    }

    #[test]
    fn kind_codes_round_trip() {
        for kind in [
            ErrorKind::Other,
            ErrorKind::OutOfMemory,
            ErrorKind::InvalidArgument,
            ErrorKind::NotImplemented,
            ErrorKind::Distributed,
        ] {
            assert_ne!(kind.code(), 0, "0 ends a C string");
            assert_eq!(ErrorKind::from_code(kind.code()), kind);
        }
    }
}

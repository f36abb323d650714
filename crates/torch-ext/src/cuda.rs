//! CUDA devices as libtorch sees them (the fallback view when NVML is missing), through the
//! part of the extension compiled with CUDA headers.
//!
//! On a libtorch without CUDA, or where the headers were missing at build time,
//! [`built_with_cuda`] is false, [`device_count`] is 0 and [`device_properties`] says why.

use crate::error::{Error, Result};

/// Name, memory and compute capability of one CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDeviceProperties {
    /// CUDA's index (after `CUDA_VISIBLE_DEVICES`).
    pub index: usize,
    pub name: String,
    /// NVML-style UUID ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"), for matching with NVML.
    pub uuid: Option<String>,
    pub total_memory_bytes: u64,
    /// (major, minor), e.g. (9, 0) for an H100.
    pub compute_capability: (u32, u32),
}

/// Formats CUDA's 16 UUID bytes the way NVML prints them; `None` for an all-zero UUID.
pub fn format_uuid(bytes: &[u8; 16]) -> Option<String> {
    if bytes.iter().all(|b| *b == 0) {
        return None;
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// Whether the CUDA part of the native extension was compiled in.
pub const fn built_with_cuda() -> bool {
    cfg!(kiln_cuda)
}

/// The CUDA runtime and cuDNN versions libtorch was compiled with, as "13.0" and "9.19.0"
/// (`None` for cuDNN when it is not compiled in); an error on a libtorch without CUDA.
pub fn build_versions() -> Result<(String, Option<String>)> {
    let (mut cudart, mut cudnn): (std::ffi::c_long, std::ffi::c_long) = (0, 0);
    // SAFETY: both outputs outlive the call.
    crate::ffi::check("cuda build_versions", unsafe {
        crate::ffi::kiln_cuda_build_versions(&mut cudart, &mut cudnn)
    })?;
    let cudart = format!("{}.{}", cudart / 1000, (cudart % 1000) / 10);
    let cudnn = (cudnn > 0).then(|| {
        // cuDNN 9 encodes major*10000 + minor*100 + patch.
        format!(
            "{}.{}.{}",
            cudnn / 10000,
            (cudnn % 10000) / 100,
            cudnn % 100
        )
    });
    Ok((cudart, cudnn))
}

/// How many CUDA devices this process sees (0 without a driver or GPU).
pub fn device_count() -> Result<usize> {
    #[cfg(kiln_cuda)]
    {
        let mut out: std::ffi::c_int = 0;
        // SAFETY: `out` outlives the call.
        crate::ffi::check("cuda device_count", unsafe {
            crate::ffi::kiln_cuda_device_count(&mut out)
        })?;
        Ok(usize::try_from(out).unwrap_or(0))
    }
    #[cfg(not(kiln_cuda))]
    {
        Ok(0)
    }
}

/// Properties of CUDA device `index`.
pub fn device_properties(index: usize) -> Result<CudaDeviceProperties> {
    #[cfg(kiln_cuda)]
    {
        use std::ffi::{CStr, c_char, c_int};
        let idx = c_int::try_from(index).map_err(|_| Error::InvalidArgument {
            op: "cuda device_properties",
            message: format!("device index {index} is out of range"),
        })?;
        let mut name = [0 as c_char; 256];
        let mut uuid = [0u8; 16];
        let (mut total, mut major, mut minor) = (0u64, 0 as c_int, 0 as c_int);
        // SAFETY: all outputs outlive the call and `name` has the length we pass.
        crate::ffi::check("cuda device_properties", unsafe {
            crate::ffi::kiln_cuda_device_properties(
                idx,
                name.as_mut_ptr(),
                name.len(),
                uuid.as_mut_ptr(),
                &mut total,
                &mut major,
                &mut minor,
            )
        })?;
        // SAFETY: the C side always NUL-terminates within the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok(CudaDeviceProperties {
            index,
            name,
            uuid: format_uuid(&uuid),
            total_memory_bytes: total,
            compute_capability: (major as u32, minor as u32),
        })
    }
    #[cfg(not(kiln_cuda))]
    {
        Err(Error::Unavailable {
            op: "cuda device_properties",
            reason: format!(
                "device {index}: kiln was built against a libtorch without CUDA (or without \
                 CUDA headers)"
            ),
        })
    }
}

/// Caps the caching allocator of CUDA device `index` at `fraction` of its memory
/// (`torch.cuda.set_per_process_memory_fraction`); allocations beyond it fail as out of memory.
pub fn set_memory_fraction(fraction: f64, index: usize) -> Result<()> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(Error::InvalidArgument {
            op: "cuda set_memory_fraction",
            message: format!("fraction must be in (0, 1], got {fraction}"),
        });
    }
    #[cfg(kiln_cuda)]
    {
        let idx = std::ffi::c_int::try_from(index).unwrap_or(std::ffi::c_int::MAX);
        // SAFETY: plain values in, error string out.
        crate::ffi::check("cuda set_memory_fraction", unsafe {
            crate::ffi::kiln_cuda_set_memory_fraction(fraction, idx)
        })
    }
    #[cfg(not(kiln_cuda))]
    {
        Err(Error::Unavailable {
            op: "cuda set_memory_fraction",
            reason: format!("device {index}: kiln was built without CUDA"),
        })
    }
}

/// Waits until the work queued on `device`'s current stream has finished, so that a clock read
/// afterwards measures the work, not its launch (benchmarks and phase timings). A no-op on the
/// CPU, whose operations are synchronous.
pub fn synchronize(device: tch::Device) -> Result<()> {
    if device.is_cuda() {
        // Reading a value back to the host waits for the stream it was queued on.
        let torch = |e: tch::TchError| Error::from_tch("cuda synchronize", &e);
        let marker = tch::Tensor::f_zeros([], (tch::Kind::Float, device)).map_err(torch)?;
        marker.f_double_value(&[]).map_err(torch)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_print_like_nvml() {
        let bytes = [
            0x5f, 0x2e, 0x1c, 0x4a, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23,
            0x45, 0x67,
        ];
        assert_eq!(
            format_uuid(&bytes).as_deref(),
            Some("GPU-5f2e1c4a-1234-5678-9abc-def001234567")
        );
        assert_eq!(format_uuid(&[0; 16]), None);
    }
}

//! What device the user asked for: `auto`, `cpu`, `cuda`, `cuda:N` or `mps`.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::SelectError;

/// A device request, before it is checked against the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(into = "String")]
pub enum DeviceRequest {
    /// The best device here: the CUDA GPU with the most free memory, then MPS, then the CPU.
    Auto,
    Cpu,
    /// A CUDA GPU; `None` means the one with the most free memory.
    Cuda(Option<usize>),
    Mps,
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(None) => f.write_str("cuda"),
            Self::Cuda(Some(i)) => write!(f, "cuda:{i}"),
            Self::Mps => f.write_str("mps"),
        }
    }
}

impl From<DeviceRequest> for String {
    fn from(r: DeviceRequest) -> String {
        r.to_string()
    }
}

impl FromStr for DeviceRequest {
    type Err = SelectError;

    fn from_str(s: &str) -> Result<Self, SelectError> {
        let lower = s.trim().to_ascii_lowercase();
        match lower.as_str() {
            "auto" => return Ok(Self::Auto),
            "cpu" => return Ok(Self::Cpu),
            "cuda" | "gpu" => return Ok(Self::Cuda(None)),
            "mps" => return Ok(Self::Mps),
            _ => {}
        }
        if let Some(index) = lower.strip_prefix("cuda:")
            && let Ok(index) = index.parse::<usize>()
        {
            return Ok(Self::Cuda(Some(index)));
        }
        Err(SelectError::BadRequest {
            request: s.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_valid_form_parses_and_prints_back() {
        for (text, request) in [
            ("auto", DeviceRequest::Auto),
            ("cpu", DeviceRequest::Cpu),
            ("cuda", DeviceRequest::Cuda(None)),
            ("cuda:0", DeviceRequest::Cuda(Some(0))),
            ("cuda:12", DeviceRequest::Cuda(Some(12))),
            ("mps", DeviceRequest::Mps),
        ] {
            assert_eq!(text.parse::<DeviceRequest>().unwrap(), request);
            assert_eq!(request.to_string(), text);
        }
        assert_eq!(
            "CUDA:1".parse::<DeviceRequest>().unwrap(),
            DeviceRequest::Cuda(Some(1))
        );
        assert_eq!(
            " gpu ".parse::<DeviceRequest>().unwrap(),
            DeviceRequest::Cuda(None)
        );
    }

    #[test]
    fn bad_strings_say_what_is_valid() {
        for bad in ["", "cuda:", "cuda:-1", "cuda:x", "tpu", "cuda0", "cpu:0"] {
            let err = bad.parse::<DeviceRequest>().unwrap_err().to_string();
            assert!(err.contains(&format!("`{bad}`")), "{err}");
            assert!(err.contains("auto, cpu, cuda, cuda:N, mps"), "{err}");
        }
    }
}

//! Named tensors to and from safetensors bytes: the weights of checkpoints, and of a compiled
//! program's initial state.

use std::path::Path;

use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use tch::{Device, Kind, Tensor};

use crate::TrainError;

fn file_error(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

fn dtype_of(kind: Kind) -> Option<Dtype> {
    Some(match kind {
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        Kind::Half => Dtype::F16,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Int64 => Dtype::I64,
        Kind::Int => Dtype::I32,
        Kind::Uint8 => Dtype::U8,
        Kind::Bool => Dtype::BOOL,
        _ => return None,
    })
}

fn kind_of(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::I64 => Kind::Int64,
        Dtype::I32 => Kind::Int,
        Dtype::U8 => Kind::Uint8,
        Dtype::BOOL => Kind::Bool,
        _ => return None,
    })
}

/// Named tensors as safetensors bytes (copied to the CPU).
pub fn to_safetensors(tensors: &[(String, Tensor)]) -> Result<Vec<u8>, TrainError> {
    let mut owned = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let dtype = dtype_of(t.kind()).ok_or_else(|| TrainError::InvalidPlan {
            key: "checkpoint",
            value: name.clone(),
            expected: format!("a tensor of a storable dtype, not {:?}", t.kind()),
        })?;
        let cpu = t.f_detach()?.f_to_device(Device::Cpu)?.f_contiguous()?;
        let bytes = cpu.numel() * t.kind().elt_size_in_bytes();
        let mut data = vec![0u8; bytes];
        cpu.f_copy_data_u8(&mut data, cpu.numel())?;
        let shape: Vec<usize> = cpu.size().iter().map(|&d| d as usize).collect();
        owned.push((name.clone(), dtype, shape, data));
    }
    let views = owned
        .iter()
        .map(|(name, dtype, shape, data)| {
            TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.clone(), v))
                .map_err(|e| TrainError::InvalidPlan {
                    key: "checkpoint",
                    value: name.clone(),
                    expected: e.to_string(),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None).map_err(|e| TrainError::InvalidPlan {
        key: "checkpoint",
        value: "safetensors".to_owned(),
        expected: e.to_string(),
    })
}

/// Named tensors from safetensors bytes, on the CPU, in file order.
pub fn from_safetensors(bytes: &[u8], path: &Path) -> Result<Vec<(String, Tensor)>, TrainError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| file_error(path, e))?;
    let mut out = vec![];
    for (name, view) in st.tensors() {
        let kind = kind_of(view.dtype())
            .ok_or_else(|| file_error(path, format!("tensor `{name}` has an unsupported dtype")))?;
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        out.push((name, Tensor::f_from_data_size(view.data(), &shape, kind)?));
    }
    Ok(out)
}

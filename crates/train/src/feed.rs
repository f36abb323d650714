//! The data edge of training: loader settings from the run plan (worker count and prefetch from
//! the hardware profile, capped by the machine's cores; batch size from the plan), and a feeder
//! that turns the loader's host batches into device tensors one batch ahead of compute.
//!
//! For a CUDA target the feeder stages each batch in pinned host memory and starts its copy on
//! a side stream as soon as the previous batch is handed out, so the copy of batch n+1 overlaps
//! the compute on batch n; the compute stream waits for the copy only when batch n+1 is taken.
//! On the CPU the batch's own buffer becomes the tensor, without a copy. A batch read by name
//! becomes one tensor per array, of the array's type.

use kiln_config::RunPlan;
use kiln_config::keys;
use kiln_data::{
    ArrayBatch, Batch, BatchBuffers, DType, DataError, FeatureBuffer, HeapBuffers, LoaderConfig,
    SamplerConfig, Targets,
};
use kiln_device::Device as KilnDevice;
use kiln_torch_ext::transfer::{self, PendingCopy};
use tch::{Device, Tensor};

use crate::TrainError;
use crate::inputs::Inputs;

/// The loader settings a run plan implies: `data.num_workers` (the profile's, capped by the
/// machine's cores, unless the user set it), `data.prefetch_factor`, `train.batch_size`.
pub fn loader_config(
    plan: &RunPlan,
    sampler: SamplerConfig,
    drop_last: bool,
) -> Result<LoaderConfig, TrainError> {
    let usize_of = |key: &'static str, v: u64| {
        usize::try_from(v).map_err(|_| TrainError::InvalidPlan {
            key,
            value: v.to_string(),
            expected: "a number this machine can count to".to_owned(),
        })
    };
    Ok(LoaderConfig {
        batch_size: usize_of(keys::train::batch_size, plan.train.batch_size)?,
        num_workers: usize_of(keys::data::num_workers, plan.data.num_workers)?,
        prefetch_factor: usize_of(keys::data::prefetch_factor, plan.data.prefetch_factor)?,
        drop_last,
        sampler,
        // Without workers, the compute threads read each batch, in parts: they wait for it.
        inline_threads: usize::try_from(tch::get_num_threads()).unwrap_or(1),
        by_name: false,
    })
}

/// The tch device for a selected kiln device.
pub fn tch_device(device: KilnDevice) -> Device {
    match device {
        KilnDevice::Cpu => Device::Cpu,
        KilnDevice::Cuda(i) => Device::Cuda(i),
        KilnDevice::Mps => Device::Mps,
    }
}

/// A block of pinned host memory that [`PinnedBuffers`] lent the loader.
struct PinnedBlock(Tensor);

/// Pinned host memory for the loader to write batches' features into, so that a CUDA copy
/// starts from them without another copy on the host: a block from libtorch's caching host
/// allocator per batch (reused once its copy is done). Where pinned memory cannot be had (no
/// CUDA), ordinary heap memory, said once.
#[derive(Debug, Default)]
pub struct PinnedBuffers {
    refused: std::sync::OnceLock<String>,
}

impl PinnedBuffers {
    /// Why pinned memory was refused, if it was (batches then use heap memory).
    pub fn refused(&self) -> Option<&str> {
        self.refused.get().map(String::as_str)
    }
}

impl BatchBuffers for PinnedBuffers {
    fn features(&self, len: usize) -> FeatureBuffer {
        if self.refused.get().is_none() {
            match transfer::host_empty_f32(&[len as i64], true) {
                Ok(block) => {
                    let ptr = block.data_ptr().cast::<f32>();
                    // SAFETY: `block` is a new contiguous f32 tensor of `len` values that only
                    // this buffer reaches; the buffer owns it, so the memory lives as long.
                    return unsafe {
                        FeatureBuffer::from_raw_parts(ptr, len, Box::new(PinnedBlock(block)))
                    };
                }
                Err(e) => {
                    tracing::warn!("pinned batch buffers unavailable, using heap memory: {e}");
                    let _ = self.refused.set(e.to_string());
                }
            }
        }
        HeapBuffers.features(len)
    }
}

/// One batch on the device.
#[derive(Debug)]
pub struct DeviceBatch {
    /// `features` of `[batch, sample_shape…]`, `f32` (`i64` for integer-id features); or, read
    /// by name, one tensor per array.
    pub inputs: Inputs,
    /// `[batch, target shape…]`: `i64` classes or `f32` values.
    pub targets: Tensor,
    /// Dataset indices of the samples, in batch order.
    pub indices: Vec<usize>,
    /// The batch's number within its epoch.
    pub number: usize,
}

#[derive(Debug)]
struct Staged {
    /// The inputs' names and copies: `features` alone, or a batch's arrays read by name.
    inputs: Vec<(String, PendingCopy)>,
    targets: PendingCopy,
    integer_features: bool,
    indices: Vec<usize>,
    number: usize,
}

/// Wraps an epoch's batches and yields them on `device`, the next one's copy already started.
#[derive(Debug)]
pub struct DeviceFeeder<I> {
    source: I,
    device: Device,
    pin: bool,
    /// Why pinning was given up, if it was.
    unpinned_because: Option<String>,
    ahead: Option<Staged>,
    /// An error met while staging the batch after the one being handed out; reported next.
    deferred: Option<TrainError>,
    started: bool,
    done: bool,
}

impl<I> DeviceFeeder<I>
where
    I: Iterator<Item = Result<Batch, DataError>>,
{
    /// Feeds `source`'s batches to `device`, staging them in pinned memory for a CUDA device.
    pub fn new(source: I, device: Device) -> Self {
        Self {
            source,
            device,
            pin: matches!(device, Device::Cuda(_)),
            unpinned_because: None,
            ahead: None,
            deferred: None,
            started: false,
            done: false,
        }
    }

    /// Whether batches are staged in pinned memory (false on the CPU, or if pinning failed).
    pub fn pinned(&self) -> bool {
        self.pin
    }

    /// Why pinned staging was given up, if it was.
    pub fn unpinned_because(&self) -> Option<&str> {
        self.unpinned_because.as_deref()
    }

    /// Whether the next batch's copy has been started (it has, after each handed-out batch,
    /// unless the epoch is over).
    pub fn has_batch_ahead(&self) -> bool {
        self.ahead.is_some()
    }

    /// Gives up pinned staging after `e`, for the rest of the run.
    fn unpin(&mut self, e: &dyn std::fmt::Display) {
        tracing::warn!("pinned staging unavailable, using pageable memory: {e}");
        self.pin = false;
        self.unpinned_because = Some(e.to_string());
    }

    /// The batch's features as a host tensor: in pinned memory for CUDA, otherwise the batch's
    /// own buffer without a copy.
    fn host_features(&mut self, batch: &mut Batch) -> Result<Tensor, TrainError> {
        let shape: Vec<i64> = batch.shape.iter().map(|&d| d as i64).collect();
        let features = std::mem::take(&mut batch.features);
        if self.pin {
            // Features the loader wrote into pinned memory (`PinnedBuffers`) are used where they
            // are (the view shares the block); others are copied into pinned memory.
            let pinned = match features.owner().downcast_ref::<PinnedBlock>() {
                Some(block) => block.0.f_view(shape.as_slice()).map_err(TrainError::from),
                None => transfer::host_tensor_f32(&features, &shape, true).map_err(Into::into),
            };
            match pinned {
                Ok(t) => return Ok(t),
                Err(e) => self.unpin(&e),
            }
        }
        Ok(transfer::tensor_from_vec_f32(features.into_vec(), &shape)?)
    }

    /// The batch's targets as a host tensor (pinned for CUDA where it can be had).
    fn host_targets(&mut self, batch: &mut Batch) -> Result<Tensor, TrainError> {
        let shape: Vec<i64> = batch.target_shape.iter().map(|&d| d as i64).collect();
        if self.pin {
            let pinned = match &batch.targets {
                Targets::Classes(v) => transfer::host_tensor_i64(v, &shape, true),
                Targets::Values(v) => transfer::host_tensor_f32(v, &shape, true),
            };
            match pinned {
                Ok(t) => return Ok(t),
                Err(e) => self.unpin(&e),
            }
        }
        Ok(
            match std::mem::replace(&mut batch.targets, Targets::Classes(vec![])) {
                Targets::Classes(v) => transfer::tensor_from_vec_i64(v, &shape)?,
                Targets::Values(v) => transfer::tensor_from_vec_f32(v, &shape)?,
            },
        )
    }

    /// A batch's arrays read by name as host tensors (pinned for CUDA where it can be had).
    fn host_arrays(
        &mut self,
        arrays: Vec<ArrayBatch>,
    ) -> Result<Vec<(String, Tensor)>, TrainError> {
        let mut out = Vec::with_capacity(arrays.len());
        for a in arrays {
            let shape: Vec<i64> = a.shape.iter().map(|&d| d as i64).collect();
            let mut t = Tensor::f_from_data_size(&a.data, &shape, kind_of(a.dtype))?;
            if self.pin {
                match t.f_pin_memory(self.device) {
                    Ok(pinned) => t = pinned,
                    Err(e) => self.unpin(&e),
                }
            }
            out.push((a.name, t));
        }
        Ok(out)
    }

    /// Takes the next batch from the source and starts its copy.
    fn stage_next(&mut self) -> Result<Option<Staged>, TrainError> {
        let Some(mut batch) = self.source.next().transpose()? else {
            return Ok(None);
        };
        let arrays = std::mem::take(&mut batch.arrays);
        let host = if arrays.is_empty() {
            let features = self.host_features(&mut batch)?;
            vec![(crate::inputs::FEATURES.to_owned(), features)]
        } else {
            self.host_arrays(arrays)?
        };
        let targets = self.host_targets(&mut batch)?;
        let mut inputs = Vec::with_capacity(host.len());
        for (name, t) in host {
            inputs.push((name, transfer::copy_to_device(&t, self.device)?));
        }
        Ok(Some(Staged {
            inputs,
            targets: transfer::copy_to_device(&targets, self.device)?,
            integer_features: batch.integer_features,
            indices: batch.indices,
            number: batch.number,
        }))
    }
}

impl<I> Iterator for DeviceFeeder<I>
where
    I: Iterator<Item = Result<Batch, DataError>>,
{
    type Item = Result<DeviceBatch, TrainError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            match self.stage_next() {
                Ok(staged) => self.ahead = staged,
                Err(e) => self.deferred = Some(e),
            }
        }
        let Some(current) = self.ahead.take() else {
            self.done = true;
            return self.deferred.take().map(Err);
        };
        // Start the next batch's copy before handing this one out: it overlaps this batch's
        // compute.
        match self.stage_next() {
            Ok(staged) => self.ahead = staged,
            Err(e) => self.deferred = Some(e),
        }
        let ids = current.integer_features;
        let finished = finish_inputs(current.inputs, ids)
            .and_then(|inputs| Ok((inputs, current.targets.finish()?)));
        Some(match finished {
            Ok((inputs, targets)) => Ok(DeviceBatch {
                inputs,
                targets,
                indices: current.indices,
                number: current.number,
            }),
            Err(e) => {
                self.done = true;
                Err(e)
            }
        })
    }
}

/// The tensor kind of an array delivered as `dtype` ([`DType::model`] types).
fn kind_of(dtype: DType) -> tch::Kind {
    match dtype {
        DType::F16 => tch::Kind::Half,
        DType::Bf16 => tch::Kind::BFloat16,
        DType::Bool => tch::Kind::Bool,
        DType::F64 => tch::Kind::Double,
        d if d.is_integer() => tch::Kind::Int64,
        _ => tch::Kind::Float,
    }
}

/// Waits for the inputs' copies; integer-id features (held in `f32`) become `i64`.
fn finish_inputs(inputs: Vec<(String, PendingCopy)>, ids: bool) -> Result<Inputs, TrainError> {
    let mut out = Vec::with_capacity(inputs.len());
    for (name, copy) in inputs {
        let t = copy.finish()?;
        let t = if ids {
            t.f_to_kind(tch::Kind::Int64)?
        } else {
            t
        };
        out.push((name, t));
    }
    Ok(Inputs::named(out))
}

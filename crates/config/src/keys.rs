//! The key table: every configuration key, defined once.
//!
//! A row is `name: Type = default => where --explain reads it, valid |v| check => "expected";`
//! (the default and the check are optional). From it, `config_keys!` makes the raw section's
//! field (its doc comment is the row's), the key in [`KEYS`], the built-in default, the parse
//! and check of the value (errors name the key, the value, what is valid and the layer that set
//! it), the `--explain` entry, and a constant naming the key (`keys::train::batch_size` is
//! `"train.batch_size"`) for code that refers to it. The plan's assembly (`plan.rs`) then
//! places each section's values in the typed [`RunPlan`](crate::RunPlan) and checks the
//! relations between keys; a value it does not use is a compile error (dead code).
//!
//! Adding a key: a row here, its field in the plan, and one line of its section's assembly.

use std::net::IpAddr;
use std::path::PathBuf;

use kiln_core::DeviceRequest;
use kiln_core::options::{
    AmpDtype, AttentionKernel, BlendMode, CudaGraphs, Determinism, InferEngineKind, LossKind,
    MatmulPrecision, MetricMode, OptimizerKind, OutputDevice, PadMode, ProfileUnit, ScheduleKind,
};

use crate::plan::{DataPlan, ModelPlan, TrainPlan};
use crate::setting::{
    BatchSize, KeepBest, LearningRate, ModelChoice, Port, Quantiles, Roi, TimeLimit, ValSteps,
    Widths, Workers, config_keys,
};

/// `model.name` as shown: the TorchScript file, or the built-in model's name.
fn model_name(model: &ModelPlan) -> String {
    match &model.script {
        Some(path) => path.display().to_string(),
        None => model.kind.to_string(),
    }
}

/// `train.batch_size` as shown: the number, or the search and where it starts.
fn batch_size_text(train: &TrainPlan) -> String {
    if train.batch_size_auto {
        format!("auto (search starts at {})", train.batch_size)
    } else {
        train.batch_size.to_string()
    }
}

/// `train.lr` as shown: the number, or the range test (with the rate it starts from, the
/// fallback). A cached answer is added by whoever can look it up (`kiln config --explain`).
fn lr_text(train: &TrainPlan) -> String {
    if train.lr_auto {
        format!(
            "auto (a range test before training; {} until then)",
            train.lr
        )
    } else {
        train.lr.to_string()
    }
}

/// `data.num_workers` as shown: the number, or the measurement and its ceiling.
fn workers_text(data: &DataPlan) -> String {
    if data.num_workers_auto {
        format!(
            "auto (measures 0 to {} on the first steps)",
            data.num_workers
        )
    } else {
        data.num_workers.to_string()
    }
}

fn val_steps_text(data: &DataPlan) -> String {
    data.val_steps
        .map_or_else(|| "horizon".to_owned(), |n| n.to_string())
}

config_keys! {
    plan = p;

    /// Which device and profile.
    device (RawDevice, DeviceValues) {
        /// auto, cpu, cuda, cuda:N or mps.
        request: DeviceRequest = "auto" => p.device_request;
        /// Use this profile by name instead of matching the GPU.
        profile: Option<String> => p.forced_profile;
        /// A directory of profile TOML files that add to or override the built-in ones.
        profiles_dir: Option<PathBuf> => p.profiles_dir;
    }

    /// libtorch's backend settings and the trainer's own performance switches.
    performance (RawPerformance, PerformanceValues) {
        tf32: bool = false => p.performance.backend.tf32;
        /// highest, high or medium (torch.set_float32_matmul_precision).
        matmul_precision: MatmulPrecision = "highest" => p.performance.backend.matmul_precision;
        cudnn_benchmark: bool = false => p.performance.backend.cudnn_benchmark;
        cudnn_deterministic: bool = false => p.performance.backend.cudnn_deterministic;
        /// off, warn or error (torch.use_deterministic_algorithms).
        deterministic: Determinism = "off" => p.performance.backend.deterministic;
        /// Share of the GPU's memory the caching allocator may take.
        memory_fraction: f64 = 0.9 => p.performance.backend.memory_fraction,
            valid |v| *v > 0.0 && *v <= 1.0 => "must be in (0, 1]";
        /// Empty the CUDA cache every N steps; 0 = never.
        empty_cache_interval: u64 = 0 => p.performance.empty_cache_interval;
        /// Convolutions channels-last (NHWC; NDHWC in 3-D). Unset, a sliding window measures
        /// both layouts and keeps the faster.
        channels_last: bool = false => p.performance.channels_last;
        /// CPU intra-op threads; 0 keeps libtorch's default.
        intra_op_threads: u64 = 0 => p.performance.backend.intra_op_threads;
        /// CPU inter-op threads; 0 keeps libtorch's default.
        inter_op_threads: u64 = 0 => p.performance.backend.inter_op_threads;
        seed: u64 = 0 => p.performance.backend.seed;
        /// Keep memory a run frees for its next tensors (glibc's mmap threshold 256 MiB, trim
        /// threshold 1 GiB) instead of giving it back to the system and faulting it in again;
        /// false leaves the C allocator as it is.
        malloc_tuning: bool = true => p.performance.backend.malloc_tuning;
    }

    /// The loader and the data split.
    data (RawData, DataValues) {
        /// Loader threads: a number (0 reads batches on the training thread), or "auto" to
        /// measure whole training steps at 0, 1, 2, 4, … up to the profile's count (capped by
        /// the cores) on the first steps and keep the fastest.
        num_workers: Workers = "auto" => workers_text(&p.data);
        prefetch_factor: u64 = 2 => p.data.prefetch_factor,
            valid |v| *v >= 1 => "must be at least 1";
        /// Share of the dataset held out for validation, in [0, 1).
        val_fraction: f64 = 0.1 => p.data.val_fraction,
            valid |v| (0.0..1.0).contains(v) => "must be in [0, 1)";
        /// For a windowed time-series dataset (instead of `val_fraction`): the last N steps of
        /// every series are for validation (0: none), or "horizon", the dataset's horizon.
        val_steps: ValSteps = "horizon" => val_steps_text(&p.data);
        /// Size of the built-in synthetic dataset (train and validation together).
        synthetic_samples: u64 = 8192 => p.data.synthetic_samples,
            valid |v| *v >= 1 => "must be at least 1";
    }

    /// The model and its sizes.
    model (RawModel, ModelValues) {
        /// transformer, mlp, convnet or unet3d, or the path of your own model: a torch.export program
        /// (.pt2) or a TorchScript file (.pt).
        name: ModelChoice = "transformer" => model_name(&p.model);
        /// The output the loss uses, for a program returning a dict (its key) or a tuple (an
        /// index).
        output: Option<String> => p.model.output;
        /// Parameters of your program kept at their exported values (no gradient, not
        /// trained): names or prefixes of dotted names, comma separated ("encoder,head.bias").
        freeze: Option<String> => p.model.freeze;
        /// The dataset arrays your TorchScript module's forward arguments get, in order, comma
        /// separated ("x,cat"); by default each argument gets the array of its own name.
        inputs: Option<String> => p.model.inputs;
        /// The quantile levels of your forecaster's last output dimension, comma separated
        /// ("0.1,0.5,0.9"): a windowed run then reports the quantile loss per horizon step,
        /// its MAE and RMSE judge the median, and `kiln infer` names a column per level.
        quantiles: Option<Quantiles> => p.model.quantiles;
        dropout: f64 = 0.1 => p.model.dropout,
            valid |v| (0.0..1.0).contains(v) => "must be in [0, 1)";
        d_model: u64 = 256 => p.model.d_model, valid |v| *v >= 1 => "must be at least 1";
        heads: u64 = 8 => p.model.heads, valid |v| *v >= 1 => "must be at least 1";
        layers: u64 = 4 => p.model.layers, valid |v| *v >= 1 => "must be at least 1";
        ff: u64 = 1024 => p.model.ff, valid |v| *v >= 1 => "must be at least 1";
        /// MLP hidden widths, comma separated ("256,256"; one width may be a plain number).
        hidden: Widths = "256,256" => p.model.hidden;
        /// Conv net channels per stage, comma separated ("32,64,128"); for unet3d, per level of
        /// its encoder (its own default "16,32,64").
        channels: Widths = "32,64,128" => p.model.channels;
        /// Recompute each transformer layer's activations in backward instead of keeping them.
        activation_checkpointing: bool = false => p.model.activation_checkpointing;
        /// The attention kernel: fused (PyTorch's scaled_dot_product_attention), math (the
        /// explicit product) or auto: for your program on the CPU, whichever kiln measures
        /// faster at its attention shapes when it compiles the step.
        attention: AttentionKernel = "auto" => p.model.attention;
    }

    /// The training loop.
    train (RawTrain, TrainValues) [early_stopping: RawEarlyStopping, ema: RawEma] {
        /// A number, or "auto" to search for one on this machine.
        batch_size: BatchSize = 32 => batch_size_text(&p.train);
        /// fp32, fp16 or bf16 (none is accepted for fp32).
        amp: AmpDtype = "fp32" => p.train.amp;
        epochs: u64 = 3 => p.train.epochs, valid |v| *v >= 1 => "must be at least 1";
        /// End the run after this many optimizer steps, counted over resumes (0: no limit);
        /// with `epochs`, whichever comes first ends it, and the schedule follows that one.
        max_steps: u64 = 0 => p.train.max_steps.unwrap_or(0);
        /// End the run after this much training time, counted over resumes: seconds, "90m",
        /// "1h30m", "DD:HH:MM:SS", or 0 / "off" for no limit.
        max_time: TimeLimit = 0 => TimeLimit(p.train.max_time);
        /// A number > 0, or "auto" for a learning-rate range test before training.
        lr: LearningRate = 1e-3 => lr_text(&p.train);
        /// adamw or sgd.
        optimizer: OptimizerKind = "adamw" => p.train.optimizer;
        weight_decay: f64 = 0.01 => p.train.weight_decay,
            valid |v| *v >= 0.0 => "must be a number >= 0";
        momentum: f64 = 0.9 => p.train.momentum,
            valid |v| (0.0..1.0).contains(v) => "must be in [0, 1)";
        grad_accum_steps: u64 = 1 => p.train.grad_accum_steps,
            valid |v| *v >= 1 => "must be at least 1";
        /// Clip the global gradient norm to this; 0 = off.
        clip_grad_norm: f64 = 1.0 => p.train.clip_grad_norm,
            valid |v| *v >= 0.0 => "must be a number >= 0";
        /// constant or cosine (linear warmup, then cosine decay to min_lr).
        schedule: ScheduleKind = "cosine" => p.train.schedule;
        warmup_steps: u64 = 50 => p.train.warmup_steps;
        min_lr: f64 = 0.0 => p.train.min_lr, valid |v| *v >= 0.0 => "must be a number >= 0";
        loss_scale_init: f64 = 65536.0 => p.train.loss_scale.init,
            valid |v| *v > 0.0 => "must be > 0";
        loss_scale_growth: f64 = 2.0 => p.train.loss_scale.growth,
            valid |v| *v > 1.0 => "must be > 1";
        loss_scale_backoff: f64 = 0.5 => p.train.loss_scale.backoff,
            valid |v| *v > 0.0 && *v < 1.0 => "must be in (0, 1)";
        loss_scale_growth_interval: u64 = 2000 => p.train.loss_scale.growth_interval,
            valid |v| *v >= 1 => "must be at least 1";
        /// Print a progress line every N optimizer steps when not on a terminal.
        log_interval: u64 = 50 => p.train.log_interval,
            valid |v| *v >= 1 => "must be at least 1";
        /// Stop after this many consecutive steps with non-finite gradients (fp32/bf16).
        max_bad_steps: u64 = 10 => p.train.max_bad_steps,
            valid |v| *v >= 1 => "must be at least 1";
        /// auto, cross_entropy, mse, l1, huber, bce_with_logits or module.
        loss: LossKind = "auto" => p.train.loss;
        /// off, auto or on: replay an exported program's whole train step (its compiled step
        /// and fused AdamW) as one CUDA graph (auto: where it applies; on: an error where not).
        cuda_graphs: CudaGraphs = "off" => p.train.cuda_graphs;
    }

    /// When and how many checkpoints a run keeps.
    checkpoint (RawCheckpoint, CheckpointValues) {
        enabled: bool = true => p.checkpoint.enabled;
        /// Also checkpoint every N optimizer steps (0: only at the end of each epoch).
        every_steps: u64 = 0 => p.checkpoint.every_steps;
        /// Also checkpoint when this many seconds of training have passed since the last one
        /// (0: off), so that a kill loses at most that much.
        every_seconds: u64 = 1800 => p.checkpoint.every_seconds;
        /// How many of the most recent checkpoints to keep.
        keep_last: u64 = 2 => p.checkpoint.keep_last, valid |v| *v >= 1 => "must be at least 1";
        /// Also keep the best checkpoint: true (by the task's metric: validation accuracy, or
        /// the validation loss without one), false, or a metric's name (val_loss, val_mae, …).
        keep_best: KeepBest = true => p.checkpoint.keep_best;
    }

    /// Inference.
    infer (RawInfer, InferValues) [sliding_window: RawSlidingWindow] {
        batch_size: u64 = 64 => p.infer.batch_size, valid |v| *v >= 1 => "must be at least 1";
        /// fp32, fp16 or bf16 (none is accepted for fp32).
        precision: AmpDtype = "fp32" => p.infer.precision;
        /// auto, on or off: replay CUDA graphs for static input shapes.
        cuda_graphs: CudaGraphs = "auto" => p.infer.cuda_graphs;
        /// auto, libtorch, compiled (an exported program's package) or onnxruntime: auto
        /// measures those that can run the model.
        engine: InferEngineKind = "auto" => p.infer.engine;
        /// Run a checkpoint's EMA weights (`train.ema.decay`) instead of its raw weights.
        ema: bool = false => p.infer.ema;
    }

    /// The inference server.
    serve (RawServe, ServeValues) {
        /// The address `kiln serve` binds.
        host: IpAddr = "127.0.0.1" => p.serve.host;
        port: Port = 8080 => p.serve.port;
        /// How long the first request of a batch waits for more, in milliseconds.
        max_wait_ms: f64 = 2.0 => p.serve.max_wait.as_secs_f64() * 1e3,
            valid |v| (0.0..=10_000.0).contains(v) => "must be in [0, 10000] milliseconds";
        /// Requests that may wait for a batch; beyond this the server answers 503.
        queue_capacity: u64 = 1024 => p.serve.queue_capacity,
            valid |v| *v >= 1 => "must be at least 1";
        /// The largest request body accepted.
        max_body_bytes: u64 = 16 * 1024 * 1024 => p.serve.max_body_bytes,
            valid |v| *v >= 1 => "must be at least 1";
        /// Seconds a request may take to arrive, from its first byte to its body's last: past
        /// it the server answers 408 and closes the connection (an idle connection is closed
        /// after as long, without an answer).
        read_timeout_s: f64 = 30.0 => p.serve.read_timeout.as_secs_f64(),
            valid |v| *v > 0.0 && *v <= 86_400.0 => "must be in (0, 86400] seconds";
        /// Connections open at once; beyond this a new connection gets 503 with Retry-After and
        /// is closed.
        max_connections: u64 = 1024 => p.serve.max_connections,
            valid |v| *v >= 1 => "must be at least 1";
    }

    /// The profiler's schedule and what it records.
    profiling (RawProfiling, ProfilingValues) {
        /// Steps (or epochs) to skip before each profiling cycle.
        wait: u64 = 1 => p.profiling.wait;
        /// Steps (or epochs) the profiler runs without keeping events, before recording.
        warmup: u64 = 1 => p.profiling.warmup;
        /// Steps (or epochs) recorded per cycle; 0 = profiling off.
        active: u64 = 0 => p.profiling.active;
        /// Cycles to run; 0 = until training ends.
        repeat: u64 = 1 => p.profiling.repeat;
        /// steps or epochs: what wait, warmup and active count.
        unit: ProfileUnit = "steps" => p.profiling.unit;
        record_shapes: bool = true => p.profiling.record_shapes;
        profile_memory: bool = true => p.profiling.profile_memory;
        with_stack: bool = false => p.profiling.with_stack;
    }

    /// Data-parallel training, when a launcher (torchrun, SLURM, `kiln train --nproc-per-node`)
    /// sets RANK and WORLD_SIZE.
    distributed (RawDistributed, DistributedValues) {
        /// Seconds a rank waits for the others (rendezvous, collectives) before it fails.
        timeout_s: f64 = 300.0 => p.distributed.timeout.as_secs_f64(),
            valid |v| *v > 0.0 && *v <= 86_400.0 => "must be in (0, 86400] seconds";
        /// Gradient bucket size in MiB (PyTorch DDP's bucket_cap_mb).
        bucket_cap_mb: f64 = 25.0 => p.distributed.bucket_cap_mb,
            valid |v| *v > 0.0 && *v <= 4096.0 => "must be in (0, 4096] MiB";
        /// The first gradient bucket's size in MiB (PyTorch DDP: 1).
        first_bucket_mb: f64 = 1.0 => p.distributed.first_bucket_mb,
            valid |v| *v > 0.0 && *v <= 4096.0 => "must be in (0, 4096] MiB";
        /// Look for parameters that get no gradient in a step (slower; PyTorch DDP's
        /// find_unused_parameters).
        find_unused_parameters: bool = false => p.distributed.find_unused_parameters;
    }
    /// The run's name and where its directory goes.
    run (RawRun, RunValues) {
        name: String = "kiln" => p.run.name,
            valid |v| !v.is_empty() && !v.contains(['/', '\\'])
                => "must be a non-empty name without path separators";
        output_dir: PathBuf = "runs" => p.run.output_dir;
        /// Write TensorBoard event files (scalars, hyperparameters) into the run directory.
        tensorboard: bool = true => p.run.tensorboard;
    }

    @nested {
        /// Early stopping: the run ends when a validation metric has not improved for
        /// `patience` epochs in a row.
        early_stopping = train.early_stopping (RawEarlyStopping, EarlyStoppingValues) {
            /// The validation metric watched: false (off), true (the task's own, as
            /// `checkpoint.keep_best` picks it) or a metric's name (val_loss, val_accuracy, …).
            metric: KeepBest = false => p.train.early_stopping.metric;
            /// auto, min or max: whether the metric should fall or rise (auto: its own way).
            mode: MetricMode = "auto" => p.train.early_stopping.mode;
            /// Epochs in a row without an improvement that end the run.
            patience: u64 = 3 => p.train.early_stopping.patience,
                valid |v| *v >= 1 => "must be at least 1";
            /// The least change that counts as an improvement.
            min_delta: f64 = 0.0 => p.train.early_stopping.min_delta,
                valid |v| *v >= 0.0 => "must be a number >= 0";
        }
        /// An exponential moving average of the weights, evaluated and checkpointed beside them.
        ema = train.ema (RawEma, EmaValues) {
            /// The average's decay per optimizer step, in [0, 1); 0: no average.
            decay: f64 = 0.0 => p.train.ema.decay,
                valid |v| (0.0..1.0).contains(v) => "must be in [0, 1) (0: off)";
            /// Warm the decay up as timm does, min(decay, (1 + step) / (10 + step)), so that the
            /// average lets go of the initial weights early in training.
            warmup: bool = true => p.train.ema.warmup;
        }
        /// Sliding-window inference (`kiln infer --sliding-window`): a model run over windows of
        /// an input larger than it takes, their outputs blended where they overlap.
        sliding_window = infer.sliding_window (RawSlidingWindow, SlidingWindowValues) {
            /// The window's spatial size, comma separated ("64,64,64"), or one size for every
            /// dimension; 0 or less: the input's own size in that dimension.
            roi: Roi = "64" => p.infer.sliding_window.roi;
            /// The share of a window its neighbour overlaps, in [0, 1).
            overlap: f64 = 0.25 => p.infer.sliding_window.overlap,
                valid |v| (0.0..1.0).contains(v) => "must be in [0, 1)";
            /// constant or gaussian: how overlapping windows' outputs are weighted.
            mode: BlendMode = "constant" => p.infer.sliding_window.mode;
            /// The Gaussian's standard deviation, as a share of the window's size.
            sigma_scale: f64 = 0.125 => p.infer.sliding_window.sigma_scale,
                valid |v| *v > 0.0 => "must be a number > 0";
            /// Windows per forward pass.
            batch_size: u64 = 4 => p.infer.sliding_window.batch_size,
                valid |v| *v >= 1 => "must be at least 1";
            /// constant, reflect, replicate or circular: how an input smaller than the window
            /// is padded.
            padding_mode: PadMode = "constant" => p.infer.sliding_window.padding_mode;
            /// The value constant padding fills with.
            cval: f64 = 0.0 => p.infer.sliding_window.cval;
            /// auto, device or cpu: where the stitched output lives (auto: the model's device
            /// unless the output would not fit its memory, then the CPU).
            output_device: OutputDevice = "auto" => p.infer.sliding_window.output_device;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use figment::Figment;

    use super::*;

    /// What a profile would give the `"auto"` keys.
    const STARTS: crate::plan::ProfileStarts = crate::plan::ProfileStarts {
        batch_size: 48,
        workers: 4,
    };

    #[test]
    fn the_table_gives_every_key_a_default_an_entry_and_a_constant() {
        let layer = defaults();
        let raw: RawConfig = Figment::from(layer).extract().unwrap();
        let plan = crate::plan::validate(raw, BTreeMap::new(), STARTS).unwrap();
        let entries: Vec<&str> = plan.entries().into_iter().map(|(k, _)| k).collect();
        assert_eq!(entries, KEYS);
        let shown: BTreeMap<_, _> = plan.entries().into_iter().collect();
        assert_eq!(shown["train.amp"], "fp32");
        assert_eq!(shown["device.profile"], "(none)");
        assert_eq!(shown["model.hidden"], "256,256");
        assert_eq!(shown["serve.max_wait_ms"], "2");
        assert_eq!(
            shown["data.num_workers"],
            "auto (measures 0 to 4 on the first steps)"
        );
        assert_eq!(train::batch_size, "train.batch_size");
        assert_eq!(serve::max_wait_ms, "serve.max_wait_ms");
        assert_eq!(KEYS.len(), 102);
    }

    #[test]
    fn only_optional_keys_may_be_left_without_a_value() {
        // Without the defaults layer, the first required key is reported missing.
        let raw = RawConfig::default();
        let err = crate::plan::validate(raw, BTreeMap::new(), STARTS).unwrap_err();
        assert_eq!(
            err.to_string(),
            "configuration: `device.request` has no value in any layer"
        );
    }
}

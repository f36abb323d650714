//! The command line: clap definitions shared by the commands.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// kiln: fast PyTorch-style training and inference on whatever hardware this is.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about, propagate_version = true)]
pub struct Cli {
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only warnings and errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Output format of the reporting commands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show kiln's version and the libtorch it runs on (location, CUDA support).
    Version,
    /// Everything to check when "the GPU is not detected": libtorch, CUDA, NVML, CPU, and the
    /// device and profile a run would use.
    Doctor {
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// List the hardware profiles, show one, or see which one a GPU gets.
    Profiles {
        #[command(subcommand)]
        action: Option<ProfilesAction>,
        /// A directory of profile TOML files that add to or override the built-in ones.
        #[arg(
            long,
            value_name = "DIR",
            env = "KILN_DEVICE__PROFILES_DIR",
            global = true
        )]
        profiles_dir: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t, global = true)]
        format: Format,
    },
    /// Show the resolved configuration of a run; with --explain, where each value came from.
    Config {
        /// Show the layer (default, profile, file, environment, command line) of every value.
        #[arg(long)]
        explain: bool,
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Train a model (the main job).
    Train {
        #[command(flatten)]
        train: TrainArgs,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Run `train.lr = auto`'s learning-rate range test alone, for the model and data `kiln
    /// train` would train (after `train.batch_size = auto`'s search where set): print the rate,
    /// cache it for later runs, and write the curve (lr_find.json, lr_find.png) into --out.
    LrFind {
        #[command(flatten)]
        train: TrainArgs,
        #[command(flatten)]
        config: ConfigArgs,
        /// Where the curve goes (default: run.output_dir).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Run a trained kiln checkpoint or a TorchScript module over inputs, in batches at the
    /// profile's inference batch size and precision; report throughput, latency and the
    /// deviation from fp32.
    Infer {
        #[command(flatten)]
        model: ModelArgs,
        /// The inputs: a prepared dataset directory, a .npy array [samples, …] or a CSV file.
        #[arg(long, value_name = "PATH")]
        inputs: PathBuf,
        /// Write the outputs here (.npy, .safetensors or .csv; never overwritten).
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// At reduced precision, skip the fp32 comparison run.
        #[arg(long)]
        no_compare: bool,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
        /// Run the model over windows of one input [C, *spatial] (.npy, 2-D or 3-D) larger than
        /// it takes, blended where they overlap (the infer.sliding_window.* settings).
        #[arg(long)]
        sliding_window: bool,
        /// With --sliding-window: write the class map (the arg-max over the output's channels)
        /// instead of the blended scores.
        #[arg(long, requires = "sliding_window")]
        class_map: bool,
        /// With --sliding-window: write the softmax over the output's channels (a sigmoid where
        /// there is one channel) of the blended outputs instead of the outputs themselves.
        #[arg(long, requires = "sliding_window", conflicts_with = "class_map")]
        probabilities: bool,
    },
    /// Write a trained kiln checkpoint (or run) or a TorchScript module as ONNX or TorchScript
    /// that takes any batch size, or an exported program's run as a program (.pt2) or ONNX,
    /// checked before it is written (ONNX in ONNX Runtime); never overwrites.
    Export {
        /// A kiln checkpoint or run directory (its newest good checkpoint), or a TorchScript
        /// .pt file.
        #[arg(long, value_name = "PATH")]
        model: PathBuf,
        /// The file to write (it must not exist).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// The format written (default: from --out's extension, .onnx, .pt or .pt2).
        #[arg(long, value_enum)]
        format: Option<ExportFormat>,
        /// For an exported program's run written as a program: eval (dropout off, batch norm
        /// on its running statistics) or train (as it was exported, to train further).
        #[arg(long, value_enum, default_value_t)]
        mode: ExportMode,
        /// The shape of one sample, e.g. 784 or 64,469 (needed for a TorchScript file;
        /// checkpoints know theirs).
        #[arg(long, value_name = "D,D,…", value_delimiter = ',')]
        input_shape: Option<Vec<usize>>,
        /// Write ONNX with int8 Linear/MatMul weights (ONNX Runtime's dynamic quantization),
        /// published only if it scores as the fp32 model does on --check-data.
        #[arg(long, value_enum)]
        quantize: Option<Quantize>,
        /// With --quantize: a prepared dataset (kiln data prepare) both models are run on; the
        /// int8 one must keep accuracy within 1 point, MAE within 2% or Dice within 0.01.
        #[arg(long, value_name = "DIR")]
        check_data: Option<PathBuf>,
        /// A configuration file (TOML, YAML or JSON).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Set any key (repeatable; later wins).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
    },
    /// Serve a kiln checkpoint or a TorchScript module over HTTP with dynamic batching.
    Serve {
        #[command(flatten)]
        model: ModelArgs,
        /// The shape of one input sample, e.g. 784 or 64,469 (needed for TorchScript modules;
        /// checkpoints know theirs).
        #[arg(long, value_name = "D,D,…", value_delimiter = ',')]
        input_shape: Option<Vec<usize>>,
        /// Address to bind (= --set serve.host=…; default 127.0.0.1, this machine only).
        #[arg(long, value_name = "IP")]
        host: Option<String>,
        /// Port (= --set serve.port=…; 0 = any free port).
        #[arg(long, value_name = "N")]
        port: Option<String>,
        /// How long a batch waits for more requests, in ms (= --set serve.max_wait_ms=…).
        #[arg(long, value_name = "MS")]
        max_wait_ms: Option<String>,
    },
    /// Time one model's forward pass (or a whole train step) on a random batch on this
    /// machine's device: ms per iteration (mean, p50, p95, min, max), samples/s, peak memory.
    ProfileModel(ProfileModelArgs),
    /// Check every CUDA path kiln has (doctor, backend flags, memory fraction and statistics,
    /// the pinned feeder, bf16/fp16 training, checkpoint and resume, the automatic batch size,
    /// out-of-memory retry, activation checkpointing, profiler traces, CUDA graphs, serving,
    /// profile-model, compiled training, ONNX Runtime, sliding windows, NCCL, the train and
    /// infer benchmarks) with small sizes, each step in its own
    /// process, and write report.json and report.md. Without a GPU it runs what it can on the
    /// CPU and lists the CUDA steps as not run.
    GpuCheck(crate::gpu_check::GpuCheckArgs),
    /// Turn CSV or .npy files into a sharded dataset, or check one.
    Data {
        #[command(subcommand)]
        action: DataAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum DataAction {
    /// Write CSV or .npy data as memory-mapped shards with a kiln-dataset.json manifest.
    Prepare(Box<PrepareArgs>),
    /// Open a dataset directory, check every shard against its manifest, and summarize it.
    Inspect {
        /// The dataset directory (holds kiln-dataset.json).
        dir: PathBuf,
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
}

/// Where `kiln data prepare` reads from and what it writes.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).multiple(true).args(["csv", "features", "target"])))]
#[command(group(clap::ArgGroup::new("npy_target").args(["labels", "targets"])))]
pub struct PrepareArgs {
    /// A CSV file with a header row: numeric feature columns and a label column (or target
    /// columns).
    #[arg(long, value_name = "FILE", conflicts_with = "features")]
    pub csv: Option<PathBuf>,
    /// The CSV's label column (integers, or class names numbered in sorted order).
    #[arg(long, value_name = "NAME", default_value = "label", requires = "csv")]
    pub label_column: String,
    /// The CSV's real-valued target columns, comma-separated, for regression: each row's target
    /// is their f32 values, [columns] (instead of a --label-column class).
    #[arg(
        long,
        value_name = "A,B,…",
        value_delimiter = ',',
        requires = "csv",
        conflicts_with = "label_column"
    )]
    pub target_columns: Option<Vec<String>>,
    /// The CSV's feature columns, comma-separated (default: every column but the label or
    /// targets).
    #[arg(long, value_name = "A,B,…", value_delimiter = ',', requires = "csv")]
    pub feature_columns: Option<Vec<String>>,
    /// The CSV's field delimiter.
    #[arg(long, value_name = "CHAR", default_value_t = ',', requires = "csv")]
    pub delimiter: char,
    /// A .npy array of features, [samples, …] (any little-endian numeric type; kept on disk),
    /// with --labels or --targets.
    #[arg(long, value_name = "FILE")]
    pub features: Option<PathBuf>,
    /// A .npy array of integer labels, [samples].
    #[arg(long, value_name = "FILE", requires = "features")]
    pub labels: Option<PathBuf>,
    /// A .npy array of targets, [samples, …] of any per-sample shape: an integer array is
    /// classes (one label, or a class map such as [H, W] masks), a float array values
    /// (regression [H], multi-label [C] of 0/1).
    #[arg(long, value_name = "FILE", requires = "features")]
    pub targets: Option<PathBuf>,
    /// A named input array, NAME=FILE.npy of [samples, …] (any per-sample shape, [samples] for
    /// one value), kept in its element type; with --csv, NAME=COLUMN,COLUMN… ([columns] per
    /// row, i64 where every value is an integer, else f32). Repeat it for each input, and give
    /// --target. Names are letters, digits and _, and become the model's input names.
    #[arg(
        long = "array",
        value_name = "NAME=FILE",
        conflicts_with_all = ["features", "target_columns", "feature_columns"],
        requires = "target"
    )]
    pub arrays: Vec<String>,
    /// The named target array with --array, NAME=FILE.npy, or with --csv NAME=COLUMN[,…]:
    /// integer classes (or, in one CSV column, class names) or real values, as for --targets.
    #[arg(
        long,
        value_name = "NAME=FILE",
        conflicts_with_all = ["features", "target_columns", "feature_columns"]
    )]
    pub target: Option<String>,
    /// The number of classes of integer --targets or --target (default: the largest class + 1).
    #[arg(long, value_name = "N")]
    pub classes: Option<usize>,
    /// The --features are integer ids (token ids) that reach the model as int64; they must be
    /// an integer array with every value within ±2^24. Without it integer features (u8 pixels)
    /// are numbers.
    #[arg(long, requires = "features")]
    pub integer_features: bool,
    #[command(flatten)]
    pub windows: WindowArgs,
    /// The dataset directory to create; it must not exist yet.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Samples per shard.
    #[arg(long, value_name = "N", default_value_t = 65_536)]
    pub shard_samples: usize,
    /// The shard file format.
    #[arg(long = "shard-format", value_enum, default_value_t)]
    pub shard_format: ShardFormatArg,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

/// `kiln data prepare --windows`: time-series windows over a long-format CSV.
#[derive(Debug, Clone, Args)]
pub struct WindowArgs {
    /// Build time-series windows for a forecaster from the long-format --csv or --parquet table
    /// (one row per series and time step), with --time, --group, --target (its columns),
    /// --encoder-length and --horizon. Series are stored once; windows are read from them.
    #[arg(long, requires_all = ["time", "group", "target", "encoder_length", "horizon"])]
    pub windows: bool,
    /// With --windows: a long-format Parquet table instead of --csv (snappy, zstd or lz4).
    #[arg(
        long,
        value_name = "FILE",
        requires = "windows",
        conflicts_with = "csv"
    )]
    pub parquet: Option<PathBuf>,
    /// With --windows: the integer time-index column (consecutive steps within a series).
    #[arg(long, value_name = "COLUMN", requires = "windows")]
    pub time: Option<String>,
    /// With --windows: the column(s) naming a series (an entity), comma-separated.
    #[arg(
        long,
        value_name = "A,B,…",
        value_delimiter = ',',
        requires = "windows"
    )]
    pub group: Vec<String>,
    /// With --windows: real columns known in advance (prices, calendar), comma-separated.
    #[arg(
        long,
        value_name = "A,B,…",
        value_delimiter = ',',
        requires = "windows"
    )]
    pub known: Vec<String>,
    /// With --windows: real columns observed only up to the present, comma-separated (a target
    /// may be among them, to give the model its scaled history).
    #[arg(
        long,
        value_name = "A,B,…",
        value_delimiter = ',',
        requires = "windows"
    )]
    pub unknown: Vec<String>,
    /// With --windows: categorical columns constant within a series, comma-separated.
    #[arg(
        long = "static",
        value_name = "A,B,…",
        value_delimiter = ',',
        requires = "windows"
    )]
    pub statics: Vec<String>,
    /// With --windows: time steps of history in a window.
    #[arg(long, value_name = "STEPS", requires = "windows")]
    pub encoder_length: Option<usize>,
    /// With --windows: the shortest history, for windows at a series' end that allow no full
    /// one (padded to --encoder-length, with `encoder_length` and `encoder_mask` saying how
    /// much is history); default: every window has the full --encoder-length.
    #[arg(long, value_name = "STEPS", requires = "encoder_length")]
    pub min_encoder_length: Option<usize>,
    /// With --windows: time steps a window predicts.
    #[arg(long, value_name = "STEPS", requires = "windows")]
    pub horizon: Option<usize>,
    /// With --windows: scale the targets among the reals per series (mean and standard
    /// deviation of the series' training part), or not.
    #[arg(long, value_enum, default_value_t, requires = "windows")]
    pub normalize: NormalizeArg,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NormalizeArg {
    #[default]
    None,
    Group,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ShardFormatArg {
    #[default]
    Safetensors,
    Npy,
}

#[derive(Debug, Subcommand)]
pub enum ProfilesAction {
    /// List every profile (the default).
    List,
    /// Show one profile's values.
    Show {
        /// The profile's name, e.g. h100.
        name: String,
    },
    /// Which profile a GPU gets, and the settings that result.
    Match {
        #[command(flatten)]
        gpu: GpuArgs,
        /// CPU cores of the machine (caps the data workers); default: this machine's.
        #[arg(long)]
        cpus: Option<usize>,
    },
}

/// A GPU described on the command line.
#[derive(Debug, Clone, Args)]
pub struct GpuArgs {
    /// The GPU's name as NVML reports it, e.g. "NVIDIA H100 80GB HBM3".
    #[arg(long = "gpu-name", value_name = "NAME")]
    pub name: String,
    /// Its memory in GiB (default: its profile's).
    #[arg(long, value_name = "GIB")]
    pub memory_gib: Option<f64>,
    /// Its compute capability, e.g. 8.6 (default: its profile's).
    #[arg(long, value_name = "X.Y")]
    pub compute_capability: Option<String>,
}

/// What `kiln train` trains, beyond the configuration keys.
#[derive(Debug, Clone, Default, Args)]
pub struct TrainArgs {
    /// The model: transformer, mlp, convnet or unet3d (kiln's reference models), or your own PyTorch
    /// model as a program saved with torch.export.save(torch.export.export(model.train(), …),
    /// "model.pt2"), or as an older TorchScript file (model.pt) (= --set model.name=…).
    #[arg(long, value_name = "NAME|FILE.pt2|FILE.pt")]
    pub model: Option<String>,
    /// The loss: auto (from the dataset's target), cross_entropy, mse, l1, huber,
    /// bce_with_logits, or module (the TorchScript module's own loss(output, target) method)
    /// (= --set train.loss=…).
    #[arg(long, value_name = "LOSS")]
    pub loss: Option<String>,
    /// A dataset made by `kiln data prepare` (default: the model's synthetic dataset).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Epochs to train (= --set train.epochs=…).
    #[arg(long, value_name = "N")]
    pub epochs: Option<String>,
    /// fp32, fp16 or bf16 (= --set train.amp=fp32|fp16|bf16).
    #[arg(long, value_name = "P")]
    pub precision: Option<String>,
    /// Name of the run; its directory is runs/<name>-<timestamp> (= --set run.name=…).
    #[arg(long, value_name = "NAME")]
    pub run_name: Option<String>,
    /// Continue from a checkpoint: alone, the newest good one of the newest run of this name;
    /// with PATH, that checkpoint or run directory.
    #[arg(long, value_name = "PATH", num_args = 0..=1)]
    pub resume: Option<Option<PathBuf>>,
    /// Train data-parallel on N ranks of this machine: starts N copies of this command with
    /// RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as torchrun does.
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub nproc_per_node: Option<usize>,
}

impl TrainArgs {
    /// The friendly flags as (flag, key, value) for the command-line layer.
    pub fn flags(&self) -> Vec<(String, String, String)> {
        given([
            ("--model", "model.name", &self.model),
            ("--loss", "train.loss", &self.loss),
            ("--epochs", "train.epochs", &self.epochs),
            ("--precision", "train.amp", &self.precision),
            ("--run-name", "run.name", &self.run_name),
        ])
    }
}

/// The friendly flags that were given, as (flag, key, value) for the command-line layer.
pub fn given<const N: usize>(
    flags: [(&str, &str, &Option<String>); N],
) -> Vec<(String, String, String)> {
    flags
        .into_iter()
        .filter_map(|(flag, key, value)| {
            value
                .as_ref()
                .map(|v| (flag.to_owned(), key.to_owned(), v.clone()))
        })
        .collect()
}

/// What `kiln export` writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// A TorchScript module (`torch.jit.load` in Python, `tch::CModule` in Rust).
    #[default]
    Torchscript,
    /// ONNX (opset 17, dynamic batch), for ONNX Runtime and other serving stacks; exported by
    /// PyTorch in the provisioned Python.
    Onnx,
    /// A `torch.export` ExportedProgram (`.pt2`) holding the trained weights, for a run that
    /// trained one (`torch.export.load` in Python).
    Program,
}

/// What `kiln export --quantize` reduces the weights to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Quantize {
    /// int8 weights of Linear and MatMul layers, activations quantized on the fly.
    Int8,
}

/// The mode of a program `kiln export` writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum ExportMode {
    /// Dropout off, batch norm on its running statistics: for inference.
    #[default]
    Eval,
    /// As it was exported (train mode), to train further.
    Train,
}

/// The model `kiln infer` and `kiln serve` run, and their configuration.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// A kiln checkpoint or run directory, or a TorchScript file (torch.jit.script/trace).
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
    /// Samples per batch (= --set infer.batch_size=…; default: the profile's).
    #[arg(long, value_name = "N")]
    pub batch_size: Option<String>,
    /// fp32, fp16 or bf16 (= --set infer.precision=…; default: the profile's).
    #[arg(long, value_name = "P")]
    pub precision: Option<String>,
    /// auto, on or off (= --set infer.cuda_graphs=…).
    #[arg(long, value_name = "MODE")]
    pub cuda_graphs: Option<String>,
    /// auto, libtorch, compiled (an exported program) or onnxruntime (= --set infer.engine=…).
    #[arg(long, value_name = "ENGINE")]
    pub engine: Option<String>,
    /// A configuration file (TOML, YAML or JSON).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set any key: --set infer.batch_size=64 (repeatable; later wins).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Device: auto, cpu, cuda, cuda:N or mps (= --set device.request=…).
    #[arg(long)]
    pub device: Option<String>,
    /// Use this profile instead of matching the GPU (= --set device.profile=…).
    #[arg(long)]
    pub profile: Option<String>,
}

impl ModelArgs {
    /// The configuration part as [`ConfigArgs`] (no simulation: inference runs here).
    pub fn config_args(&self) -> ConfigArgs {
        ConfigArgs {
            config: self.config.clone(),
            sets: self.sets.clone(),
            ..ConfigArgs::default()
        }
    }

    /// The friendly flags as (flag, key, value) for the command-line layer.
    pub fn flags(&self) -> Vec<(String, String, String)> {
        given([
            ("--device", "device.request", &self.device),
            ("--profile", "device.profile", &self.profile),
            ("--batch-size", "infer.batch_size", &self.batch_size),
            ("--precision", "infer.precision", &self.precision),
            ("--cuda-graphs", "infer.cuda_graphs", &self.cuda_graphs),
            ("--engine", "infer.engine", &self.engine),
        ])
    }
}

/// What `kiln profile-model` runs in each iteration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum ProfileMode {
    /// The forward pass in eval mode, without autograd.
    #[default]
    Infer,
    /// A whole train step: forward, loss, backward, optimizer step.
    Train,
}

/// The precision of a profile; auto is the resolved configuration's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    Fp32,
    Bf16,
    Fp16,
    /// The profile's (infer.precision, or train.amp with --mode train), unless set otherwise.
    #[default]
    Auto,
}

/// What `kiln profile-model` profiles, and how.
#[derive(Debug, Clone, Args)]
pub struct ProfileModelArgs {
    /// A built-in model (transformer, mlp, convnet or unet3d: random weights, sized by the model.*
    /// settings), a kiln run or checkpoint directory, or a TorchScript file. A built-in name
    /// wins over a file of that name: write ./mlp for the file.
    #[arg(long, value_name = "MODEL")]
    pub model: PathBuf,
    /// The shape of one sample: 784, 64,469 or 64 469 (default: the built-in model's synthetic
    /// data, or the checkpoint's; needed for TorchScript).
    #[arg(
        long,
        value_name = "D",
        num_args = 1..,
        value_delimiter = ',',
        value_parser = at_least_one
    )]
    pub input_shape: Option<Vec<usize>>,
    /// Samples per batch (default: infer.batch_size, with --mode train train.batch_size; the
    /// profile's unless set).
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub batch_size: Option<usize>,
    /// Timed iterations.
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = at_least_one)]
    pub iterations: usize,
    /// Untimed iterations first (allocations, kernel selection).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub warmup: usize,
    /// What one iteration runs.
    #[arg(long, value_enum, default_value_t)]
    pub mode: ProfileMode,
    /// The weights' precision (infer) or autocast's (train); auto = the configuration's
    /// infer.precision or train.amp.
    #[arg(long, value_enum, default_value_t)]
    pub precision: PrecisionArg,
    /// Device: auto, cpu, cuda, cuda:N or mps (= --set device.request=…).
    #[arg(long)]
    pub device: Option<String>,
    /// Use this profile instead of matching the GPU (= --set device.profile=…).
    #[arg(long)]
    pub profile: Option<String>,
    /// A configuration file (TOML, YAML or JSON).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set any key: --set model.d_model=512 (repeatable; later wins).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
}

impl ProfileModelArgs {
    /// The configuration part as [`ConfigArgs`] (no simulation: profiling runs here).
    pub fn config_args(&self) -> ConfigArgs {
        ConfigArgs {
            config: self.config.clone(),
            sets: self.sets.clone(),
            ..ConfigArgs::default()
        }
    }
}

/// A whole number of at least 1, for counts and sizes.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err("must be a whole number of at least 1".to_owned()),
    }
}

/// The configuration sources of a run, and an optional machine to simulate.
#[derive(Debug, Clone, Default, Args)]
pub struct ConfigArgs {
    /// A configuration file (TOML, YAML or JSON).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set any key: --set train.batch_size=64 (repeatable; later wins).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Device: auto, cpu, cuda, cuda:N or mps (= --set device.request=…).
    #[arg(long)]
    pub device: Option<String>,
    /// Use this profile instead of matching the GPU (= --set device.profile=…).
    #[arg(long)]
    pub profile: Option<String>,
    /// Training batch size (= --set train.batch_size=…).
    #[arg(long, value_name = "N")]
    pub batch_size: Option<String>,
    /// Data-loader workers, or auto (= --set data.num_workers=…).
    #[arg(long, value_name = "N")]
    pub workers: Option<String>,
    /// Mixed precision: fp32, fp16 or bf16 (= --set train.amp=…).
    #[arg(long, value_name = "DTYPE")]
    pub amp: Option<String>,
    /// Pretend the machine has one GPU of this NVML name (see what a run would use there).
    #[arg(long, value_name = "NAME")]
    pub simulate_gpu: Option<String>,
    /// With --simulate-gpu: its memory in GiB (default: its profile's).
    #[arg(long, value_name = "GIB", requires = "simulate_gpu")]
    pub memory_gib: Option<f64>,
    /// With --simulate-gpu: its compute capability (default: its profile's).
    #[arg(long, value_name = "X.Y", requires = "simulate_gpu")]
    pub compute_capability: Option<String>,
    /// Pretend the machine has this many CPU cores (alone: a CPU-only machine).
    #[arg(long, value_name = "N")]
    pub cpus: Option<usize>,
}

impl ConfigArgs {
    /// The friendly flags as (flag, key, value) for the configuration's command-line layer.
    pub fn flags(&self) -> Vec<(String, String, String)> {
        given([
            ("--device", "device.request", &self.device),
            ("--profile", "device.profile", &self.profile),
            ("--batch-size", "train.batch_size", &self.batch_size),
            ("--workers", "data.num_workers", &self.workers),
            ("--amp", "train.amp", &self.amp),
        ])
    }

    pub fn simulating(&self) -> bool {
        self.simulate_gpu.is_some() || self.cpus.is_some()
    }
}

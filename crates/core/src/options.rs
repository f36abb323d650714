//! Every option kiln takes as a word, as an enum with one spelling: the same parse and print for
//! profiles, configuration, reports and the command line.
//!
//! Each option is declared once with `option_enum!`: its canonical name, which is what kiln
//! prints everywhere, and the other spellings it accepts on input (`none` for `fp32`, `true` for
//! `on`). Parsing ignores case and surrounding spaces.

use std::fmt;

/// A word that is not one of an option's values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    /// The text as given.
    pub value: String,
    /// What the option is, with its article ("an AMP dtype").
    pub what: &'static str,
    /// The canonical names, in order.
    pub valid: &'static [&'static str],
}

impl OptionError {
    /// What to write instead: "use fp32, fp16 or bf16".
    pub fn usage(&self) -> String {
        format!("use {}", one_of(self.valid))
    }
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` is not {}: {}", self.value, self.what, self.usage())
    }
}

impl std::error::Error for OptionError {}

/// "a", "a or b", "a, b or c".
pub fn one_of(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [only] => (*only).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Declares an option enum: the variants with their canonical names and accepted aliases, and
/// `ALL`, `NAMES`, `as_str`, `Display`, `FromStr` and serde as that one spelling.
macro_rules! option_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $canonical:literal $(| $alias:literal)*
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [Self; [$($canonical),+].len()] = [$(Self::$variant),+];
            /// The canonical names, in the order of [`Self::ALL`].
            pub const NAMES: [&'static str; [$($canonical),+].len()] = [$($canonical),+];

            /// The canonical name, as kiln prints it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => $canonical, )+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::options::OptionError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $( $canonical $(| $alias)* => Ok(Self::$variant), )+
                    _ => Err($crate::options::OptionError {
                        value: s.to_owned(),
                        what: $what,
                        valid: &Self::NAMES,
                    }),
                }
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <String as ::serde::Deserialize>::deserialize(d)?;
                text.parse().map_err(::serde::de::Error::custom)
            }
        }
    };
}

option_enum! {
    /// Internal precision of float32 matrix multiplications (`torch.set_float32_matmul_precision`).
    pub enum MatmulPrecision ("a matmul precision") {
        /// Full float32 (IEEE) arithmetic.
        Highest = "highest",
        /// TF32 tensor cores where available (or bf16x3).
        High = "high",
        /// bf16 where available: fastest, least precise.
        Medium = "medium",
    }
}

option_enum! {
    /// `torch.use_deterministic_algorithms`: the mode and whether violations only warn.
    pub enum Determinism ("a determinism mode") {
        /// Nondeterministic algorithms allowed (the default).
        Off = "off" | "false",
        /// Nondeterministic algorithms only warn.
        Warn = "warn",
        /// Nondeterministic algorithms raise an error.
        Error = "error" | "on" | "true",
    }
}

option_enum! {
    /// The precision a run computes in: float32, or autocast to a reduced dtype for eligible ops
    /// (training's `train.amp`, inference's `infer.precision`). Printed as fp32, fp16 or bf16;
    /// `none` is accepted for fp32.
    pub enum AmpDtype ("an AMP dtype") {
        /// No autocast: everything in float32.
        None = "fp32" | "none" | "float32" | "off",
        Fp16 = "fp16" | "float16" | "half",
        Bf16 = "bf16" | "bfloat16",
    }
}

option_enum! {
    /// A metric by name: one vocabulary for every setting that names one
    /// (`checkpoint.keep_best`; early stopping later). Each is the validation value of a run.
    pub enum MetricName ("a metric name") {
        /// The mean validation loss per sample (lower is better).
        Loss = "val_loss" | "loss",
        /// The share of validation targets right (higher is better).
        Accuracy = "val_accuracy" | "accuracy",
        /// The mean absolute error per target element (lower is better).
        Mae = "val_mae" | "mae",
        /// The root-mean-square error per target element (lower is better).
        Rmse = "val_rmse" | "rmse",
        /// The foreground Dice score of a segmentation (higher is better).
        Dice = "val_dice" | "dice",
    }
}

impl MetricName {
    /// Whether a larger value is better.
    pub const fn higher_is_better(self) -> bool {
        matches!(self, Self::Accuracy | Self::Dice)
    }

    /// The metric's own name, as records carry it (`accuracy`; its validation value is
    /// `val_accuracy`).
    pub fn key(self) -> &'static str {
        self.as_str().trim_start_matches("val_")
    }
}

option_enum! {
    /// `model.attention`: the attention kernel of the transformer's layers and of a
    /// `torch.export` program's compiled step.
    pub enum AttentionKernel ("an attention kernel") {
        /// Chosen for the machine: for a program on the CPU, whichever of the two is measured
        /// faster at its attention shapes; for the built-in transformer, the explicit product
        /// on the CPU in reduced precision and the fused kernel otherwise.
        Auto = "auto",
        /// PyTorch's fused kernel (scaled_dot_product_attention: flash attention).
        Fused = "fused" | "sdpa" | "flash",
        /// The explicit product: two batched matrix products and a softmax.
        Math = "math",
    }
}

option_enum! {
    /// `infer.cuda_graphs` and `train.cuda_graphs`: whether inference (a train step) is
    /// captured and replayed as a CUDA graph.
    pub enum CudaGraphs ("a CUDA graphs mode") {
        /// On CUDA with static shapes; otherwise eager, with a log line saying why.
        Auto = "auto",
        /// Required: fail when graphs cannot be used.
        On = "on" | "true",
        Off = "off" | "false",
    }
}

option_enum! {
    /// `train.early_stopping.mode`: whether the monitored metric should fall or rise.
    pub enum MetricMode ("a metric mode") {
        /// The metric's own direction: accuracy and Dice rise, losses and errors fall.
        Auto = "auto",
        Min = "min",
        Max = "max",
    }
}

option_enum! {
    /// `infer.sliding_window.mode`: how the outputs of overlapping windows are weighted.
    pub enum BlendMode ("a blending mode") {
        /// Every voxel of a window weighs the same.
        Constant = "constant",
        /// A Gaussian centred on the window: its edges weigh less.
        Gaussian = "gaussian",
    }
}

option_enum! {
    /// `infer.sliding_window.padding_mode`: how an input smaller than the window is padded.
    pub enum PadMode ("a padding mode") {
        /// With `infer.sliding_window.cval`.
        Constant = "constant",
        /// Mirrored about the edge voxel.
        Reflect = "reflect",
        /// The edge voxel repeated.
        Replicate = "replicate",
        /// Wrapped around.
        Circular = "circular",
    }
}

option_enum! {
    /// `infer.sliding_window.output_device`: where the stitched output lives.
    pub enum OutputDevice ("an output device") {
        /// The model's device, unless the output would take more than a quarter of its memory:
        /// then the CPU.
        Auto = "auto",
        /// The model's device.
        Device = "device",
        /// The CPU: windows run on the device, their outputs are added on the host.
        Cpu = "cpu",
    }
}

option_enum! {
    /// `infer.engine`: which engine runs inference.
    pub enum InferEngineKind ("an inference engine") {
        /// Measure both where both can run the model (an ONNX file kiln exported from a
        /// checkpoint that is still there) and take the faster per batch size; otherwise the
        /// one that can.
        Auto = "auto",
        Libtorch = "libtorch" | "torch",
        Onnxruntime = "onnxruntime" | "ort" | "onnx",
        /// An exported program's eval forward compiled by AOTInductor (a `.pt2`, or a run or
        /// checkpoint of one): the engine such a model runs in, where libtorch has none.
        Compiled = "compiled" | "aoti",
    }
}

option_enum! {
    /// `profiling.unit`: what `wait`, `warmup` and `active` count.
    pub enum ProfileUnit ("a profiling unit") {
        Steps = "steps" | "step",
        Epochs = "epochs" | "epoch",
    }
}

option_enum! {
    /// `train.optimizer`.
    pub enum OptimizerKind ("an optimizer") {
        AdamW = "adamw",
        Sgd = "sgd",
    }
}

option_enum! {
    /// `train.schedule`: the learning rate over a run.
    pub enum ScheduleKind ("a learning-rate schedule") {
        Constant = "constant",
        /// Linear warmup, then cosine decay to `min_lr`.
        Cosine = "cosine",
    }
}

option_enum! {
    /// `train.loss`: how the loss is computed from the model's output and the target.
    pub enum LossKind ("a loss") {
        /// From the dataset's target: cross-entropy for classes, MSE for values.
        Auto = "auto",
        CrossEntropy = "cross_entropy",
        Mse = "mse",
        L1 = "l1",
        Huber = "huber",
        BceWithLogits = "bce_with_logits",
        /// The module's own `loss(output, target)` method (TorchScript models).
        Module = "module",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T>(all: &[T])
    where
        T: Copy + PartialEq + fmt::Debug + fmt::Display + std::str::FromStr,
        T: serde::Serialize + serde::de::DeserializeOwned,
        T::Err: fmt::Debug,
    {
        for &v in all {
            let text = v.to_string();
            assert_eq!(text.parse::<T>().unwrap(), v);
            assert_eq!(
                format!(" {} ", text.to_uppercase()).parse::<T>().unwrap(),
                v
            );
            let json = serde_json::to_string(&v).unwrap();
            assert_eq!(json, format!("{text:?}"));
            assert_eq!(serde_json::from_str::<T>(&json).unwrap(), v);
        }
    }

    #[test]
    fn every_option_prints_its_canonical_name_and_parses_it_back() {
        round_trips(&MatmulPrecision::ALL);
        round_trips(&Determinism::ALL);
        round_trips(&AmpDtype::ALL);
        round_trips(&CudaGraphs::ALL);
        round_trips(&AttentionKernel::ALL);
        round_trips(&InferEngineKind::ALL);
        round_trips(&BlendMode::ALL);
        round_trips(&MetricMode::ALL);
        round_trips(&PadMode::ALL);
        round_trips(&OutputDevice::ALL);
        round_trips(&ProfileUnit::ALL);
        round_trips(&OptimizerKind::ALL);
        round_trips(&ScheduleKind::ALL);
        round_trips(&LossKind::ALL);
    }

    #[test]
    fn aliases_are_accepted_on_input_and_printed_canonically() {
        for (text, dtype) in [
            ("none", AmpDtype::None),
            ("float32", AmpDtype::None),
            ("bfloat16", AmpDtype::Bf16),
            ("Half", AmpDtype::Fp16),
        ] {
            assert_eq!(text.parse::<AmpDtype>().unwrap(), dtype);
        }
        assert_eq!(AmpDtype::None.to_string(), "fp32");
        assert_eq!("true".parse::<Determinism>().unwrap(), Determinism::Error);
        assert_eq!("false".parse::<CudaGraphs>().unwrap(), CudaGraphs::Off);
        assert_eq!(
            "ort".parse::<InferEngineKind>().unwrap(),
            InferEngineKind::Onnxruntime
        );
        assert_eq!("epoch".parse::<ProfileUnit>().unwrap(), ProfileUnit::Epochs);
    }

    #[test]
    fn a_bad_word_names_itself_and_every_valid_value() {
        let err = "fp8".parse::<AmpDtype>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "`fp8` is not an AMP dtype: use fp32, fp16 or bf16"
        );
        assert_eq!(
            "fast".parse::<MatmulPrecision>().unwrap_err().usage(),
            "use highest, high or medium"
        );
        assert_eq!(
            "x".parse::<LossKind>().unwrap_err().usage(),
            "use auto, cross_entropy, mse, l1, huber, bce_with_logits or module"
        );
        assert!(serde_json::from_str::<OptimizerKind>("\"adam\"").is_err());
        assert_eq!(one_of(&["a"]), "a");
        assert_eq!(one_of(&["a", "b"]), "a or b");
    }
}

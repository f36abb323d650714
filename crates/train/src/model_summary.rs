//! The model summary a run logs and writes into its directory (`model_summary.json`): the
//! parameters of each top-level module (the first part of each parameter's name), trainable and
//! frozen, and their size, with the totals.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use tch::nn;

use crate::TrainError;

/// One top-level module's parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModuleParameters {
    /// The first part of its parameters' names (`encoder` of `encoder.layers.0.weight`); a
    /// parameter without a dot is its own module.
    pub name: String,
    /// Parameter tensors.
    pub tensors: usize,
    /// Elements that train.
    pub trainable: usize,
    /// Elements that do not (frozen parameters and buffers).
    pub frozen: usize,
    /// Bytes all its tensors take.
    pub bytes: usize,
}

/// The model's parameters by top-level module, in the order their names sort.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelSummary {
    pub model: String,
    pub modules: Vec<ModuleParameters>,
    pub trainable: usize,
    pub frozen: usize,
    pub bytes: usize,
}

impl ModelSummary {
    /// The summary of the model `model` whose tensors `vs` holds.
    pub fn of(model: &str, vs: &nn::VarStore) -> Self {
        let mut by_module: BTreeMap<String, ModuleParameters> = BTreeMap::new();
        for (name, tensor) in vs.variables() {
            let top = name.split('.').next().unwrap_or(&name).to_owned();
            let row = by_module
                .entry(top.clone())
                .or_insert_with(|| ModuleParameters {
                    name: top,
                    tensors: 0,
                    trainable: 0,
                    frozen: 0,
                    bytes: 0,
                });
            let elements = tensor.numel();
            row.tensors += 1;
            if tensor.requires_grad() {
                row.trainable += elements;
            } else {
                row.frozen += elements;
            }
            row.bytes += elements * tensor.kind().elt_size_in_bytes();
        }
        let modules: Vec<ModuleParameters> = by_module.into_values().collect();
        Self {
            model: model.to_owned(),
            trainable: modules.iter().map(|m| m.trainable).sum(),
            frozen: modules.iter().map(|m| m.frozen).sum(),
            bytes: modules.iter().map(|m| m.bytes).sum(),
            modules,
        }
    }

    /// The summary as the log shows it: a line per module, then the totals.
    pub fn table(&self) -> String {
        let width = self.modules.iter().map(|m| m.name.len()).max().unwrap_or(0);
        let mut out = format!("model {}: parameters by top-level module\n", self.model);
        for m in &self.modules {
            out.push_str(&format!(
                "  {:width$}  {:>12} trainable  {:>10} frozen  {}\n",
                m.name,
                m.trainable,
                m.frozen,
                size(m.bytes),
            ));
        }
        out.push_str(&format!(
            "  total: {} trainable, {} frozen, {}",
            self.trainable,
            self.frozen,
            size(self.bytes)
        ));
        out
    }

    /// Writes the summary as `model_summary.json` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), TrainError> {
        let path = dir.join("model_summary.json");
        let error = |e: &dyn std::fmt::Display| TrainError::File {
            path: path.clone(),
            message: e.to_string(),
        };
        let text = serde_json::to_string_pretty(self).map_err(|e| error(&e))?;
        std::fs::write(&path, text + "\n").map_err(|e| error(&e))
    }
}

/// `bytes` in KiB or MiB, one decimal.
fn size(bytes: usize) -> String {
    let kib = bytes as f64 / 1024.0;
    if kib < 1024.0 {
        format!("{kib:.1} KiB")
    } else {
        format!("{:.1} MiB", kib / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn parameters_are_counted_per_top_level_module_trainable_or_frozen() {
        let vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let _ = nn::linear(&root / "encoder" / "layer0", 4, 3, Default::default());
        let _ = nn::linear(&root / "head", 3, 2, Default::default());
        let _ = root.zeros_no_train("scale", &[5]);
        let _ = root.var("bias", &[2], nn::Init::Const(0.0));
        let s = ModelSummary::of("toy", &vs);
        let names: Vec<&str> = s.modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["bias", "encoder", "head", "scale"]);
        let encoder = &s.modules[1];
        assert_eq!(
            (encoder.tensors, encoder.trainable, encoder.frozen),
            (2, 15, 0)
        );
        assert_eq!(encoder.bytes, 15 * 4);
        assert_eq!((s.modules[3].trainable, s.modules[3].frozen), (0, 5));
        assert_eq!((s.trainable, s.frozen), (2 + 15 + 8, 5));
        let table = s.table();
        assert!(table.contains("encoder"), "{table}");
        assert!(
            table.ends_with("total: 25 trainable, 5 frozen, 0.1 KiB"),
            "{table}"
        );
    }

    #[test]
    fn the_summary_is_written_as_json() {
        let vs = nn::VarStore::new(Device::Cpu);
        let _ = nn::linear(vs.root() / "fc", 2, 2, Default::default());
        let dir = tempfile::tempdir().unwrap();
        ModelSummary::of("toy", &vs).write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join("model_summary.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["modules"][0]["name"], "fc");
        assert_eq!(v["trainable"], 6);
    }
}

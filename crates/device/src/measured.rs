//! Answers measured on this machine and kept across runs (the automatic batch size, the
//! inference engine choice): kiln's cache directory, one JSON file of answers by key, and the
//! hardware part of such a key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::DeviceError;

/// kiln's cache directory (the one `cargo xtask setup` keeps libtorch in): `$KILN_CACHE_DIR`,
/// else `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`.
pub fn cache_dir() -> Option<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("KILN_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = set("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("kiln"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("kiln"))
}

/// Measured answers by key, in one JSON file of kiln's cache directory. A missing or
/// unreadable file is an empty cache (a damaged one is reported and replaced on the next
/// store).
#[derive(Debug)]
pub struct MeasuredCache<T> {
    path: PathBuf,
    what: &'static str,
    entries: BTreeMap<String, T>,
}

impl<T: Serialize + serde::de::DeserializeOwned> MeasuredCache<T> {
    /// Opens `<dir>/<file>`; `what` names it in messages ("batch-size cache").
    pub fn open_file(dir: &Path, file: &str, what: &'static str) -> Self {
        let path = dir.join(file);
        let entries = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                tracing::warn!(
                    "ignoring the {what} {}: {e}; it will be rewritten",
                    path.display()
                );
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        Self {
            path,
            what,
            entries,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&T> {
        self.entries.get(key)
    }

    /// Records an answer and rewrites the file atomically (temporary file, then rename).
    pub fn store(&mut self, key: &str, answer: T) -> Result<(), DeviceError> {
        self.entries.insert(key.to_owned(), answer);
        let fail = |e: &dyn std::fmt::Display| DeviceError::File {
            path: self.path.clone(),
            message: format!("could not write the {}: {e}", self.what),
        };
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
        }
        let tmp = self.path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(&self.entries).map_err(|e| fail(&e))?;
        std::fs::write(&tmp, text).map_err(|e| fail(&e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| fail(&e))?;
        Ok(())
    }
}

/// The hardware part of a cache key: the GPU and its memory, or the CPU model and the threads
/// libtorch uses.
pub fn hardware_key(device: tch::Device) -> Result<String, DeviceError> {
    Ok(match device {
        tch::Device::Cuda(i) => {
            let props = kiln_torch_ext::cuda::device_properties(i)?;
            format!(
                "{} ({:.0} GiB)",
                props.name,
                props.total_memory_bytes as f64 / f64::from(1u32 << 30)
            )
        }
        _ => format!(
            "{} × {} threads",
            crate::probe::probe_cpu().model,
            tch::get_num_threads()
        ),
    })
}

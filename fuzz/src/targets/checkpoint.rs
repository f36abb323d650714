//! `checkpoint.json`: reading a checkpoint (`checkpoint::read_meta`, `check_quick`, `load`),
//! then what `kiln infer` makes of a loaded one (its model settings as the configuration's
//! checkpoint layer through `kiln_config::load`). The tensor files beside it
//! are a real checkpoint's, from the repository's fixtures. Mutated files are resealed (their
//! `meta_sha256` recomputed) most of the time, so that mutations reach past the checksum.

use std::path::{Path, PathBuf};

use kiln_config::ConfigRequest;
use kiln_train::checkpoint::{self, Contents, Meta};
use sha2::{Digest, Sha256};

use super::{text, write};
use crate::{Grammar, Harness, Outcome, Outcomes, Rng, Target};

pub const TARGET: Target = Target {
    name: "checkpoint-json",
    about: "checkpoint.json bytes (resealed) → checkpoint::read_meta, check_quick, load; \
            infer's model settings through kiln_config::load",
    grammar: Grammar::Json,
    dictionary: &[
        b"\"kiln-checkpoint\"",
        b"\"version\"",
        b"\"files\"",
        b"\"file_bytes\"",
        b"\"model.safetensors\"",
        b"\"state.safetensors\"",
        b"\"model.pt\"",
        b"\"model.pt2\"",
        b"\"../checkpoint.json\"",
        b"\"/dev/zero\"",
        b"\"/proc/self/mem\"",
        b"\"input\"",
        b"\"sample_shape\"",
        b"\"arrays\"",
        b"\"config\"",
        b"\"key\"",
        b"\"value\"",
        b"\"model.name\"",
        b"\"model.hidden\"",
        b"\"sums\"",
        b"\"model_rng\"",
        b"\"meta_sha256\"",
        b"\"val_metrics\"",
        b"\"loss_scale\"",
    ],
    fixup: Some(reseal),
    make,
    selftest: false,
};

const V1_META: &[u8] = include_bytes!(
    "../../../crates/cli/tests/fixtures/v1-run/checkpoints/step-000000010/checkpoint.json"
);
const V1_MODEL: &[u8] = include_bytes!(
    "../../../crates/cli/tests/fixtures/v1-run/checkpoints/step-000000010/model.safetensors"
);
const V1_STATE: &[u8] = include_bytes!(
    "../../../crates/cli/tests/fixtures/v1-run/checkpoints/step-000000010/state.safetensors"
);

/// A real checkpoint (version 1, from the repository's fixtures) in `scratch/checkpoint`.
pub(crate) fn fixture_checkpoint(scratch: &Path) -> Result<PathBuf, String> {
    let dir = scratch.join("checkpoint");
    std::fs::create_dir_all(&dir).map_err(text)?;
    write(&dir.join(checkpoint::META_FILE), V1_META)?;
    write(&dir.join(checkpoint::MODEL_FILE), V1_MODEL)?;
    write(&dir.join(checkpoint::STATE_FILE), V1_STATE)?;
    Ok(dir)
}

/// The checksum kiln records for `meta`: SHA-256 of its JSON with the checksum empty.
fn digest(meta: &Meta) -> Option<String> {
    let mut copy = meta.clone();
    copy.meta_sha256 = String::new();
    let json = serde_json::to_string(&copy).ok()?;
    Some(
        Sha256::digest(json.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// Recomputes the checksum of a file that reads as a checkpoint's, three times in four.
fn reseal(rng: &mut Rng, input: &mut Vec<u8>) {
    if rng.one_in(4) {
        return;
    }
    let Ok(meta) = serde_json::from_slice::<Meta>(input) else {
        return;
    };
    let (Some(new), old) = (digest(&meta), meta.meta_sha256.as_str()) else {
        return;
    };
    let old = format!("\"{old}\"");
    let Some(at) = input.windows(old.len()).position(|w| w == old.as_bytes()) else {
        return;
    };
    input.splice(at..at + old.len(), format!("\"{new}\"").into_bytes());
}

/// A version-2 `checkpoint.json` kiln writes (`checkpoint::save`) for the fixture's tensors.
fn version_2(scratch: &Path) -> Result<Vec<u8>, String> {
    let mut meta: Meta = serde_json::from_slice(V1_META).map_err(text)?;
    let files = std::mem::take(&mut meta.files);
    meta.version = checkpoint::VERSION;
    meta.sums = Default::default();
    meta.val_metrics = [("val_loss".to_owned(), 0.5)].into();
    let model = checkpoint::from_safetensors(V1_MODEL, Path::new("model")).map_err(text)?;
    let state = checkpoint::from_safetensors(V1_STATE, Path::new("state")).map_err(text)?;
    let contents = Contents {
        model: &model,
        state: &state,
        meta,
        script: None,
        program: None,
    };
    let dir = checkpoint::save(&scratch.join("saved"), contents).map_err(text)?;
    let mut meta = checkpoint::read_meta(&dir).map_err(text)?;
    // The fixture's tensor files are the ones beside it in the harness.
    meta.files = files;
    meta.meta_sha256 = digest(&meta).ok_or("cannot encode the checkpoint")?;
    serde_json::to_vec_pretty(&meta).map_err(text)
}

struct Checkpoint {
    dir: PathBuf,
    meta: PathBuf,
    request: ConfigRequest,
    seeds: Vec<Vec<u8>>,
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    let dir = fixture_checkpoint(scratch)?;
    let seeds = vec![V1_META.to_vec(), version_2(scratch)?];
    Ok(Box::new(Checkpoint {
        meta: dir.join(checkpoint::META_FILE),
        dir,
        request: ConfigRequest::new(super::config::machine()?),
        seeds,
    }))
}

impl Harness for Checkpoint {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        write(&self.meta, input)?;
        let mut o = Outcomes::default();
        o.add(checkpoint::read_meta(&self.dir));
        o.add(checkpoint::check_quick(&self.dir));
        let loaded = checkpoint::load(&self.dir).map_err(text);
        o.add(loaded.as_ref().map(drop));
        if let Ok(ckpt) = loaded {
            let settings = kiln_infer::model::model_settings(&ckpt);
            let mut request = self.request.clone();
            request.checkpoint = Some((self.dir.display().to_string(), settings));
            o.add(kiln_config::load(&request));
        }
        o.finish()
    }
}

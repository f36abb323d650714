//! The configuration layers, each a figment provider with a readable name, so that
//! `find_metadata(key)` says which layer set a key (figment's own `Serialized` provider would
//! name itself after a Rust type).

use figment::value::{Dict, Map, Value};
use figment::{Error, Metadata, Profile, Provider};
use serde::Serialize;

/// The layers, lowest first; a later layer wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Default,
    Profile,
    /// The model settings a checkpoint was trained with (`kiln infer`/`kiln serve`).
    Checkpoint,
    File,
    Env,
    CommandLine,
}

impl Layer {
    /// Which layer a figment metadata name belongs to (the names are ours, see below).
    pub fn of(metadata: &Metadata) -> Layer {
        let name = metadata.name.as_ref();
        if name.starts_with(DEFAULTS) {
            Layer::Default
        } else if name.starts_with("profile ") {
            Layer::Profile
        } else if name.starts_with("checkpoint ") {
            Layer::Checkpoint
        } else if name.starts_with("command line") {
            Layer::CommandLine
        } else if name.contains("environment") {
            Layer::Env
        } else {
            Layer::File
        }
    }
}

const DEFAULTS: &str = "kiln's built-in defaults";

/// A layer of fixed `section.key = value` pairs under a name of our choosing.
#[derive(Debug, Clone)]
pub struct NamedLayer {
    name: String,
    values: Vec<(String, Value)>,
}

impl NamedLayer {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            values: vec![],
        }
    }

    pub fn defaults() -> Self {
        Self::new(DEFAULTS)
    }

    /// A built-in model's own defaults, where they differ from the key table's: part of the
    /// default layer (named `kiln's built-in defaults for the <model> model`), below the profile.
    pub fn model_defaults(model: &str) -> Self {
        Self::new(format!("{DEFAULTS} for the {model} model"))
    }

    /// Adds `key` (`section.key`) = `value`.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.values.push((key.to_owned(), value.into()));
        self
    }

    pub fn push(&mut self, key: &str, value: Value) {
        self.values.push((key.to_owned(), value));
    }
}

impl Provider for NamedLayer {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name.clone())
    }

    fn data(&self) -> Result<Map<Profile, Dict>, Error> {
        let mut root = Dict::new();
        for (key, value) in &self.values {
            let parts: Vec<&str> = key.split('.').collect();
            let Some((field, sections)) = parts.split_last().filter(|(_, s)| !s.is_empty()) else {
                return Err(Error::from(format!(
                    "`{key}` is not of the form section.key"
                )));
            };
            let mut dict = &mut root;
            for section in sections {
                let entry = dict
                    .entry((*section).to_owned())
                    .or_insert_with(|| Value::from(Dict::new()));
                dict = match entry {
                    Value::Dict(_, inner) => inner,
                    _ => return Err(Error::from(format!("`{section}` is not a section"))),
                };
            }
            dict.insert((*field).to_owned(), value.clone());
        }
        Ok(Profile::Default.collect(root))
    }
}

/// Parses the value of a `--set key=value`: TOML syntax where it parses (numbers, booleans,
/// quoted strings), a plain string otherwise (`--set device.request=cuda:1`).
pub fn parse_set_value(text: &str) -> Value {
    let doc = format!("v = {text}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(table) => match table.get("v") {
            Some(v) => toml_to_figment(v),
            None => Value::from(text.to_owned()),
        },
        Err(_) => Value::from(text.to_owned()),
    }
}

fn toml_to_figment(v: &toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::from(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => Value::from(*f),
        toml::Value::Boolean(b) => Value::from(*b),
        // A time or date ("01:30:00") is the text written: no key takes TOML's datetimes.
        toml::Value::Datetime(d) => Value::from(d.to_string()),
        other => Value::from(other.to_string()),
    }
}

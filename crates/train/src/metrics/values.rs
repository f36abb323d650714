//! Named metric values, in their set's order, as records, summaries and checkpoints carry them.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};

/// Metric values by name (`loss`, `accuracy`, …), the loss first. Written out (JSON) as one
/// key per value; records write them behind a prefix (`val_accuracy`: see
/// [`MetricValues::serialize_under`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricValues {
    items: Vec<(Arc<str>, f64)>,
}

impl MetricValues {
    /// Appends `name`'s value (replacing one of the same name).
    pub fn push(&mut self, name: &str, value: f64) {
        match self.items.iter_mut().find(|(n, _)| &**n == name) {
            Some(item) => item.1 = value,
            None => self.items.push((name.into(), value)),
        }
    }

    /// The value of the metric named `name` (`accuracy`), if the run reports it.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.items
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, v)| *v)
    }

    /// The mean loss (NaN where there is none).
    pub fn loss(&self) -> f64 {
        self.get("loss").unwrap_or(f64::NAN)
    }

    /// The values in order, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        self.items.iter().map(|(n, v)| (&**n, *v))
    }

    /// The values by their names behind `prefix` (`val_loss`, …), as checkpoints record them.
    pub fn named(&self, prefix: &str) -> BTreeMap<String, f64> {
        self.iter()
            .map(|(n, v)| (format!("{prefix}{n}"), v))
            .collect()
    }
}

impl MetricValues {
    /// Writes the values as a map, each name behind `prefix` (`train_`, `val_`, …).
    pub fn serialize_under<S: Serializer>(&self, prefix: &str, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.items.len()))?;
        for (name, v) in &self.items {
            map.serialize_entry(&format!("{prefix}{name}"), v)?;
        }
        map.end()
    }
}

impl Serialize for MetricValues {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.serialize_under("", s)
    }
}

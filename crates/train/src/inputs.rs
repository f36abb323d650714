//! A batch's model inputs: named tensors of `[batch, …]`. A model of one input gets one tensor,
//! `features`; a model that takes its inputs by name gets the dataset's named arrays, in the
//! dataset's order, each in the type it reaches the model as.

use tch::Tensor;

use crate::TrainError;

/// The name of the one input of a batch read as features.
pub const FEATURES: &str = kiln_data::FEATURES_TENSOR;

/// A batch's inputs, by name, in order.
#[derive(Debug)]
pub struct Inputs {
    tensors: Vec<(String, Tensor)>,
}

impl Inputs {
    /// One input, `features`.
    pub fn features(features: Tensor) -> Self {
        Self {
            tensors: vec![(FEATURES.to_owned(), features)],
        }
    }

    /// Named inputs, in order; all hold the same number of samples.
    pub fn named(tensors: Vec<(String, Tensor)>) -> Self {
        Self { tensors }
    }

    /// The inputs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.tensors.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// The input named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.iter().find(|(n, _)| *n == name).map(|(_, t)| t)
    }

    /// The inputs' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.iter().map(|(n, _)| n).collect()
    }

    /// The one input of a model that takes one tensor; an error naming the inputs where there
    /// are several.
    pub fn single(&self) -> Result<&Tensor, TrainError> {
        match &self.tensors[..] {
            [(_, t)] => Ok(t),
            _ => Err(TrainError::ShapeMismatch {
                what: "the model's inputs".to_owned(),
                expected: "one input tensor (this model takes one)".to_owned(),
                got: format!(
                    "{} named inputs ({})",
                    self.tensors.len(),
                    self.names().join(", ")
                ),
            }),
        }
    }

    /// Samples in the batch (the first dimension of its inputs).
    pub fn rows(&self) -> i64 {
        self.tensors.first().map_or(0, |(_, t)| t.size()[0])
    }

    /// The batch in pieces of `chunk` samples (the last may hold fewer), every input split alike.
    pub fn split(&self, chunk: i64) -> Result<Vec<Inputs>, TrainError> {
        let mut pieces: Vec<Vec<(String, Tensor)>> = vec![];
        for (name, t) in &self.tensors {
            for (k, part) in t.f_split(chunk, 0)?.into_iter().enumerate() {
                if pieces.len() <= k {
                    pieces.push(vec![]);
                }
                pieces[k].push((name.clone(), part));
            }
        }
        Ok(pieces.into_iter().map(Inputs::named).collect())
    }

    /// The same tensors, shared.
    pub fn shallow_clone(&self) -> Self {
        Self {
            tensors: self
                .tensors
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_cuts_every_input_alike_and_single_names_the_inputs() {
        let x = Tensor::arange(10, (tch::Kind::Float, tch::Device::Cpu)).view([5, 2]);
        let ids = Tensor::arange(5, (tch::Kind::Int64, tch::Device::Cpu));
        let inputs = Inputs::named(vec![("x".into(), x), ("ids".into(), ids)]);
        assert_eq!(inputs.rows(), 5);
        let pieces = inputs.split(2).unwrap();
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces[2].get("x").unwrap().size(), [1, 2]);
        assert_eq!(pieces[1].get("ids").unwrap().int64_value(&[0]), 2);
        assert_eq!(pieces[0].names(), ["x", "ids"]);
        let e = inputs.single().unwrap_err().to_string();
        assert!(e.contains("2 named inputs (x, ids)"), "{e}");
        let one = Inputs::features(Tensor::zeros([3, 4], (tch::Kind::Float, tch::Device::Cpu)));
        assert_eq!(one.single().unwrap().size(), [3, 4]);
    }
}

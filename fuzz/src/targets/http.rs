//! HTTP request bodies: what `POST /v1/predict` does with a body before a model sees it
//! (`serve::decode_request`: the format from `Content-Type`, a JSON or `.npy` body decoded, the
//! samples checked against the model's sample shape), for both content types on every input.

use std::path::Path;

use kiln_infer::serve::decode_request;

use crate::{Grammar, Harness, Outcome, Outcomes, Target};

pub const TARGET: Target = Target {
    name: "http-body",
    about: "request bodies → serve::decode_request as application/json and as \
            application/x-npy, for a model of sample shape [2, 3]",
    grammar: Grammar::Json,
    dictionary: &[
        b"\"inputs\"",
        b"[[[[[[[[[[",
        b"]]]]]]]]]]",
        b"1e39",
        b"-1e39",
        b"NaN",
        b"null",
        b"\x93NUMPY",
        b"'<f4'",
        b"'<f2'",
        b"'<f8'",
        b"'<i8'",
        b"(1000000000000, 2, 3)",
        b"(9223372036854775807, 3)",
    ],
    fixup: Some(super::npy::fix_header_length),
    make,
    selftest: false,
};

/// The model's sample shape and the most samples a request may hold.
const SAMPLE_SHAPE: [usize; 2] = [2, 3];
const MAX_BATCH: usize = 8;

/// Bodies as clients send them: one sample and a list, in JSON and as kiln's `.npy` writer
/// writes them (the server answers `.npy` requests with the same writer).
fn seeds() -> Result<Vec<Vec<u8>>, String> {
    let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    Ok(vec![
        br#"{"inputs": [[1, 2, 3], [4.5, -5, 6e-3]]}"#.to_vec(),
        br#"{"id": 7, "inputs": [[[1, 2, 3], [4, 5, 6]], [[0, 0, 0], [1, 1, 1]]]}"#.to_vec(),
        kiln_data::npy_f32_bytes(&SAMPLE_SHAPE, &values[..6])?,
        kiln_data::npy_f32_bytes(&[2, 2, 3], &values)?,
    ])
}

struct Http {
    seeds: Vec<Vec<u8>>,
}

fn make(_scratch: &Path) -> Result<Box<dyn Harness>, String> {
    Ok(Box::new(Http { seeds: seeds()? }))
}

impl Harness for Http {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        let mut o = Outcomes::default();
        for content_type in ["application/json", "application/x-npy; charset=x"] {
            o.add(decode_request(
                Some(content_type),
                input,
                &SAMPLE_SHAPE,
                MAX_BATCH,
            ));
        }
        o.finish()
    }
}

//! Request bodies to f32 samples (JSON nested arrays, `.npy` files) and outputs back to
//! response bodies, with the validation messages clients see.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::http::ApiError;
use super::worker::element_count;

/// The body formats the server speaks; a response uses the request's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Json,
    Npy,
}

impl Format {
    pub const JSON: &'static str = "application/json";
    pub const NPY: &'static str = "application/x-npy";

    /// The format of a `Content-Type` header value (parameters such as `charset` are ignored).
    pub fn from_content_type(value: Option<&str>) -> Result<Format, ApiError> {
        let essence = value
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase());
        match essence.as_deref() {
            Some(Self::JSON) => Ok(Format::Json),
            Some(Self::NPY) => Ok(Format::Npy),
            other => Err(ApiError::unsupported_media_type(format!(
                "unsupported content type {}; send `Content-Type: {}` with a body \
                 {{\"inputs\": [...]}}, or `Content-Type: {}` with a .npy float array",
                other.map_or_else(|| "(none given)".to_owned(), |t| format!("`{t}`")),
                Self::JSON,
                Self::NPY
            ))),
        }
    }
}

/// A decoded request body: its shape (as sent) and its values in C order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tensor {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// A request's samples, checked against the runner's sample shape.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Samples {
    pub values: Vec<f32>,
    pub n: usize,
    /// Whether the request was a list of samples (shape `[n, ...]`) rather than one sample;
    /// the response keeps the same form.
    pub list: bool,
}

/// `[n, a, b]` for a sample shape `[a, b]`.
fn list_shape(sample_shape: &[usize]) -> String {
    let mut dims = vec!["n".to_owned()];
    dims.extend(sample_shape.iter().map(usize::to_string));
    format!("[{}]", dims.join(", "))
}

/// What a request body should hold, for error messages.
pub(crate) fn expected_inputs(sample_shape: &[usize], max_batch: usize) -> String {
    format!(
        "one sample of shape {sample_shape:?}, or a list of 1 to {max_batch} samples of shape {}",
        list_shape(sample_shape)
    )
}

/// Decodes a JSON body `{"inputs": <nested numeric array>}`.
///
/// Syntax errors are 400s; well-formed JSON of the wrong form (no `inputs`, ragged arrays,
/// strings, booleans, nulls) is a 422. Both name the expected form.
pub(crate) fn decode_json(
    body: &[u8],
    sample_shape: &[usize],
    max_batch: usize,
) -> Result<Tensor, ApiError> {
    match serde_json::from_slice::<JsonRequest>(body) {
        Ok(JsonRequest(tensor)) => Ok(tensor),
        Err(e) => {
            let expected = format!(
                "expected {{\"inputs\": [...]}} holding {}",
                expected_inputs(sample_shape, max_batch)
            );
            Err(match e.classify() {
                serde_json::error::Category::Data => {
                    ApiError::invalid(format!("invalid inputs: {e}; {expected}"))
                }
                _ => ApiError::bad_request(format!("malformed JSON: {e}; {expected}")),
            })
        }
    }
}

/// Decodes a `.npy` body; float element types are converted to f32, integer ones refused.
pub(crate) fn decode_npy(body: &[u8]) -> Result<Tensor, ApiError> {
    const EXPECTED: &str = "expected a little-endian, C-order float array (f32, f64 or f16)";
    let array = kiln_data::NpyArray::parse(body).map_err(|message| {
        // kiln-data names an unsupported `descr` as "element type `...` is not supported".
        if message.contains("element type") {
            ApiError::invalid(format!(
                "unsupported .npy element type: {message}; {EXPECTED}"
            ))
        } else {
            ApiError::bad_request(format!("malformed .npy body: {message}; {EXPECTED}"))
        }
    })?;
    if array.dtype.is_integer() {
        return Err(ApiError::invalid(format!(
            "the .npy array holds {} integers; {EXPECTED}",
            array.dtype
        )));
    }
    Ok(Tensor {
        shape: array.shape.clone(),
        values: array.to_f32(),
    })
}

/// What `POST /v1/predict` makes of a request before a model sees it, without a server: the
/// format from the `Content-Type` value, the body decoded, the samples checked against
/// `sample_shape`; the number of samples, or the message the client would get. The server
/// calls the same functions in this order; this entry is public for kiln's fuzz harness.
pub fn decode_request(
    content_type: Option<&str>,
    body: &[u8],
    sample_shape: &[usize],
    max_batch: usize,
) -> Result<usize, String> {
    let format = Format::from_content_type(content_type).map_err(|e| e.message)?;
    let tensor = match format {
        Format::Json => decode_json(body, sample_shape, max_batch),
        Format::Npy => decode_npy(body),
    }
    .map_err(|e| e.message)?;
    let samples = fit_samples(tensor, sample_shape, max_batch).map_err(|e| e.message)?;
    Ok(samples.n)
}

/// Checks a decoded body against the runner's sample shape: either one sample
/// (`sample_shape`) or a list `[n, ...sample_shape]` with `1 <= n <= max_batch`.
pub(crate) fn fit_samples(
    tensor: Tensor,
    sample_shape: &[usize],
    max_batch: usize,
) -> Result<Samples, ApiError> {
    let Tensor { shape, values } = tensor;
    if shape == sample_shape {
        return Ok(Samples {
            values,
            n: 1,
            list: false,
        });
    }
    match shape.split_first() {
        Some((&n, rest)) if rest == sample_shape => {
            if n == 0 {
                Err(ApiError::invalid(format!(
                    "the request holds an empty list of samples; expected {}",
                    expected_inputs(sample_shape, max_batch)
                )))
            } else if n > max_batch {
                Err(ApiError::too_large(format!(
                    "the request holds {n} samples; at most {max_batch} samples per request \
                     (infer.batch_size); split it into several requests"
                )))
            } else {
                Ok(Samples {
                    values,
                    n,
                    list: true,
                })
            }
        }
        _ => Err(ApiError::invalid(format!(
            "wrong input shape: received shape {shape:?}; expected {}",
            expected_inputs(sample_shape, max_batch)
        ))),
    }
}

/// The JSON response body for one job's outputs.
pub(crate) fn encode_json(shape: &[usize], values: &[f32]) -> Result<Vec<u8>, ApiError> {
    #[derive(Serialize)]
    struct Response<'a> {
        outputs: Nested<'a>,
        shape: &'a [usize],
    }
    serde_json::to_vec(&Response {
        outputs: Nested { shape, values },
        shape,
    })
    .map_err(|e| ApiError::internal(format!("cannot encode the outputs as JSON: {e}")))
}

/// The `.npy` response body for one job's outputs.
pub(crate) fn encode_npy(shape: &[usize], values: &[f32]) -> Result<Vec<u8>, ApiError> {
    kiln_data::npy_f32_bytes(shape, values)
        .map_err(|e| ApiError::internal(format!("cannot encode the outputs as .npy: {e}")))
}

/// Flat C-order values serialized as nested arrays of `shape`.
struct Nested<'a> {
    shape: &'a [usize],
    values: &'a [f32],
}

impl Serialize for Nested<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Some((&len, inner)) = self.shape.split_first() else {
            return match self.values.first() {
                Some(v) => v.serialize(serializer),
                None => serializer.serialize_unit(),
            };
        };
        let stride = element_count(inner).unwrap_or(0);
        let mut seq = serializer.serialize_seq(Some(len))?;
        for i in 0..len {
            let values = self
                .values
                .get(i * stride..(i + 1) * stride)
                .unwrap_or_default();
            seq.serialize_element(&Nested {
                shape: inner,
                values,
            })?;
        }
        seq.end()
    }
}

/// `{"inputs": ...}`, decoded straight into a flat tensor (no intermediate `Value` tree).
struct JsonRequest(Tensor);

impl<'de> Deserialize<'de> for JsonRequest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RequestVisitor)
    }
}

struct RequestVisitor;

impl<'de> Visitor<'de> for RequestVisitor {
    type Value = JsonRequest;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object {\"inputs\": [...]}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonRequest, A::Error> {
        let mut builder: Option<Builder> = None;
        while let Some(key) = map.next_key::<String>()? {
            if key != "inputs" {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            if builder.is_some() {
                return Err(de::Error::duplicate_field("inputs"));
            }
            let mut b = Builder::default();
            map.next_value_seed(Level {
                depth: 0,
                builder: &mut b,
            })?;
            builder = Some(b);
        }
        let builder = builder.ok_or_else(|| de::Error::missing_field("inputs"))?;
        builder.finish().map(JsonRequest).map_err(de::Error::custom)
    }
}

/// The shape found so far while walking a nested array.
#[derive(Default)]
struct Builder {
    /// The length of the arrays at each depth (`None` until one finished at that depth).
    dims: Vec<Option<usize>>,
    /// The depth at which numbers sit, once one was seen.
    leaf_depth: Option<usize>,
    values: Vec<f32>,
}

impl Builder {
    fn finish(self) -> Result<Tensor, String> {
        let shape: Vec<usize> = self.dims.iter().map(|d| d.unwrap_or(0)).collect();
        if element_count(&shape) != Some(self.values.len()) {
            return Err(format!(
                "the inputs are not a rectangular array (shape {shape:?})"
            ));
        }
        Ok(Tensor {
            shape,
            values: self.values,
        })
    }
}

const RAGGED: &str = "the inputs are ragged: every row at the same depth must have the same \
                      length, with numbers only at the innermost level";

/// One nesting level of the inputs array.
struct Level<'a> {
    depth: usize,
    builder: &'a mut Builder,
}

impl<'de> DeserializeSeed<'de> for Level<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Level<'_> {
    fn number<E: de::Error>(self, v: f64) -> Result<(), E> {
        let b = self.builder;
        let seen_array_here = b.dims.get(self.depth).is_some_and(Option::is_some);
        if seen_array_here || b.leaf_depth.is_some_and(|l| l != self.depth) {
            return Err(E::custom(RAGGED));
        }
        b.leaf_depth = Some(self.depth);
        let x = v as f32;
        if x.is_infinite() && v.is_finite() {
            return Err(E::custom(format!("{v} is out of the f32 range")));
        }
        b.values.push(x);
        Ok(())
    }
}

impl<'de> Visitor<'de> for Level<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number or an array of numbers")
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.number(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.number(v as f64)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.number(v as f64)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Level { depth, builder } = self;
        if builder.leaf_depth.is_some_and(|l| depth >= l) {
            return Err(de::Error::custom(RAGGED));
        }
        let mut len = 0usize;
        while seq
            .next_element_seed(Level {
                depth: depth + 1,
                builder: &mut *builder,
            })?
            .is_some()
        {
            len += 1;
        }
        if builder.dims.len() <= depth {
            builder.dims.resize(depth + 1, None);
        }
        match builder.dims[depth] {
            Some(seen) if seen != len => Err(de::Error::custom(RAGGED)),
            _ => {
                builder.dims[depth] = Some(len);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(inputs: &str) -> Result<Tensor, String> {
        serde_json::from_str::<JsonRequest>(&format!(
            "{{\"other\": [1, {{}}], \"inputs\": {inputs}}}"
        ))
        .map(|r| r.0)
        .map_err(|e| e.to_string())
    }

    #[test]
    fn nested_arrays_decode_to_shape_and_values() {
        let t = parse("[[1, 2.5, -3], [4e2, 5, 6]]").unwrap();
        assert_eq!(t.shape, [2, 3]);
        assert_eq!(t.values, [1.0, 2.5, -3.0, 400.0, 5.0, 6.0]);
        let t = parse("7").unwrap();
        assert_eq!((t.shape, t.values), (vec![], vec![7.0]));
        let t = parse("[[], []]").unwrap();
        assert_eq!((t.shape, t.values), (vec![2, 0], vec![]));
        let t = parse("[[[1]], [[2]], [[3]]]").unwrap();
        assert_eq!(t.shape, [3, 1, 1]);
    }

    #[test]
    fn ragged_and_non_numeric_inputs_are_refused() {
        for ragged in [
            "[[1, 2], [3]]",
            "[[1], 2]",
            "[1, [2]]",
            "[[], [1]]",
            "[[[]], [1]]",
        ] {
            let e = parse(ragged).unwrap_err();
            assert!(e.contains("ragged"), "{ragged}: {e}");
        }
        assert!(
            parse("[1, \"2\"]")
                .unwrap_err()
                .contains("expected a number")
        );
        assert!(parse("[1e39]").unwrap_err().contains("f32 range"));
        let e = serde_json::from_str::<JsonRequest>(r#"{"inputs": [1], "inputs": [2]}"#);
        assert!(e.err().unwrap().to_string().contains("duplicate field"));
    }

    #[test]
    fn samples_fit_one_or_a_list() {
        let tensor = |shape: &[usize]| Tensor {
            shape: shape.to_vec(),
            values: vec![0.0; shape.iter().product()],
        };
        let one = fit_samples(tensor(&[2, 3]), &[2, 3], 4).unwrap();
        assert_eq!((one.n, one.list), (1, false));
        let list = fit_samples(tensor(&[3, 2, 3]), &[2, 3], 4).unwrap();
        assert_eq!((list.n, list.list), (3, true));
        let e = fit_samples(tensor(&[0, 2, 3]), &[2, 3], 4).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::UNPROCESSABLE_ENTITY);
        let e = fit_samples(tensor(&[5, 2, 3]), &[2, 3], 4).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        let e = fit_samples(tensor(&[3, 3]), &[2, 3], 4).unwrap_err();
        assert!(e.message.contains("received shape [3, 3]"), "{}", e.message);
    }

    #[test]
    fn outputs_encode_as_nested_arrays() {
        let body = encode_json(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.5]).unwrap();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"outputs":[[1.0,2.0,3.0],[4.0,5.0,6.5]],"shape":[2,3]}"#
        );
        let body = encode_json(&[], &[0.1]).unwrap();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"outputs":0.1,"shape":[]}"#
        );
    }

    #[test]
    fn content_types_are_matched_without_parameters() {
        assert_eq!(
            Format::from_content_type(Some("Application/JSON; charset=utf-8")).unwrap(),
            Format::Json
        );
        assert_eq!(
            Format::from_content_type(Some("application/x-npy")).unwrap(),
            Format::Npy
        );
        assert!(Format::from_content_type(Some("application/octet-stream")).is_err());
        assert!(Format::from_content_type(None).is_err());
    }
}

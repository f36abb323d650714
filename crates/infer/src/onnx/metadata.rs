//! Reads an ONNX file's `metadata_props` (where `kiln export` records the checkpoint a model
//! came from) without ONNX Runtime: a walk over the top-level fields of the `ModelProto`
//! protobuf message, skipping the graph, so that a kiln-exported model's checkpoint is known
//! before any engine is chosen or loaded.

use std::io::{BufReader, Read};
use std::path::Path;

use crate::InferError;

/// `ModelProto.metadata_props` (repeated `StringStringEntryProto { key = 1, value = 2 }`).
const METADATA_PROPS: u64 = 14;

/// The model's metadata as (key, value) pairs, in file order.
pub fn read(path: &Path) -> Result<Vec<(String, String)>, InferError> {
    let file = std::fs::File::open(path).map_err(|e| InferError::file(path, e))?;
    let len = file
        .metadata()
        .map_err(|e| InferError::file(path, e))?
        .len();
    let mut r = BufReader::new(file);
    let bad = |what: &str| {
        InferError::file(
            path,
            format!("not a loadable ONNX model: {what} (damaged or truncated protobuf)"),
        )
    };
    let mut props = Vec::new();
    let mut at = 0u64;
    while at < len {
        let (tag, n) = varint(&mut r).ok_or_else(|| bad("unreadable field tag"))?;
        at += n;
        let (field, wire) = (tag >> 3, tag & 7);
        match wire {
            0 => at += varint(&mut r).ok_or_else(|| bad("unreadable number"))?.1,
            1 | 5 => {
                let skip = if wire == 1 { 8 } else { 4 };
                r.seek_relative(skip)
                    .map_err(|e| InferError::file(path, e))?;
                at += skip as u64;
            }
            2 => {
                let (size, n) = varint(&mut r).ok_or_else(|| bad("unreadable length"))?;
                at += n;
                // The length is the file's to claim: past any end, it must not overflow.
                if at.checked_add(size).is_none_or(|end| end > len) {
                    return Err(bad("a field runs past the end of the file"));
                }
                if field == METADATA_PROPS {
                    let mut entry = vec![0u8; usize::try_from(size).unwrap_or(0)];
                    r.read_exact(&mut entry)
                        .map_err(|e| InferError::file(path, e))?;
                    props.push(entry_of(&entry).ok_or_else(|| bad("unreadable metadata"))?);
                } else {
                    let skip = i64::try_from(size).map_err(|_| bad("a field too large"))?;
                    r.seek_relative(skip)
                        .map_err(|e| InferError::file(path, e))?;
                }
                at += size;
            }
            _ => return Err(bad("an unknown wire type")),
        }
    }
    Ok(props)
}

/// The value of `key` in the model's metadata, if any.
pub fn get(props: &[(String, String)], key: &str) -> Option<String> {
    props.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// A base-128 varint and the bytes it took.
fn varint(r: &mut impl Read) -> Option<(u64, u64)> {
    let mut value = 0u64;
    for i in 0..10 {
        let mut byte = [0u8];
        r.read_exact(&mut byte).ok()?;
        value |= u64::from(byte[0] & 0x7f) << (7 * i);
        if byte[0] & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// A `StringStringEntryProto`'s key and value.
fn entry_of(mut bytes: &[u8]) -> Option<(String, String)> {
    let (mut key, mut value) = (String::new(), String::new());
    while !bytes.is_empty() {
        let (tag, _) = varint(&mut bytes)?;
        if tag & 7 != 2 {
            return None;
        }
        let (size, _) = varint(&mut bytes)?;
        let size = usize::try_from(size).ok()?;
        let text = String::from_utf8(bytes.get(..size)?.to_vec()).ok()?;
        bytes = &bytes[size..];
        match tag >> 3 {
            1 => key = text,
            2 => value = text,
            _ => {}
        }
    }
    Some((key, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3 | 2) as u8, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn metadata_is_found_after_the_fields_it_skips() {
        let mut entry = field(1, b"kiln.source");
        entry.extend(field(2, b"/runs/a"));
        let mut model = vec![0x08, 0x08]; // ir_version = 8
        model.extend(field(7, &[0x0a, 0x01, 0x78])); // a "graph"
        model.extend(field(METADATA_PROPS, &entry));
        model.extend([0x45, 1, 2, 3, 4]); // a fixed32 field
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.onnx");
        std::fs::write(&path, &model).unwrap();
        let props = read(&path).unwrap();
        assert_eq!(get(&props, "kiln.source").as_deref(), Some("/runs/a"));
        std::fs::write(&path, &model[..model.len() - 12]).unwrap();
        assert!(read(&path).unwrap_err().to_string().contains("truncated"));
    }

    #[test]
    fn a_length_past_any_end_is_refused_without_overflow() {
        // kiln-fuzz's onnx-metadata target: a field length of 2⁶⁴ − 1 overflowed the end's sum.
        let mut model = vec![0x08, 0x08, (7 << 3 | 2) as u8];
        model.extend([0xff; 9]);
        model.push(0x01);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.onnx");
        std::fs::write(&path, &model).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("runs past the end"), "{e}");
    }
}

//! The `.npy` format (numpy's array files): reading a header, and writing one.
//!
//! Only what datasets need: little-endian numeric types, C order, format versions 1–3.

use crate::DType;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// What a `.npy` header declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyHeader {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Where the array's data starts in the file.
    pub data_offset: usize,
}

/// Parses the header at the start of `bytes` (a whole file). The error says what is wrong, for
/// the caller to prefix with the file's name.
pub fn parse_header(bytes: &[u8]) -> Result<NpyHeader, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy file (no \\x93NUMPY magic at its start)".to_owned());
    }
    let (len, start) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => {
            return Err(format!(
                ".npy format version {v} is not supported (1, 2 or 3)"
            ));
        }
    };
    let header = bytes
        .get(start..start + len)
        .ok_or("the header is cut off: the file is truncated")?;
    let header = std::str::from_utf8(header).map_err(|_| "the header is not text")?;
    let descr = value_of(header, "descr")?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    let dtype = DType::from_npy(descr).ok_or_else(|| {
        format!(
            "element type `{descr}` is not supported (little-endian f8, f4, f2, i8, i4, i2, i1, u1, b1)"
        )
    })?;
    if value_of(header, "fortran_order")? != "False" {
        return Err("the array is in Fortran order; save it in C order".to_owned());
    }
    let shape = value_of(header, "shape")?;
    let shape = shape
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| format!("shape entry `{s}` is not a number"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Every count of elements or bytes a reader computes from the shape (the whole array's, a
    // row's) is at most this product, so none of them overflows.
    let addressable = shape
        .iter()
        .filter(|&&d| d > 0)
        .try_fold(dtype.size(), |bytes, &d| bytes.checked_mul(d));
    if addressable.is_none() {
        return Err(format!(
            "the shape {shape:?} is too large: its {dtype} data would not fit in memory's address \
             space"
        ));
    }
    Ok(NpyHeader {
        dtype,
        shape,
        data_offset: start + len,
    })
}

/// The text of `key`'s value in the header's Python dict literal.
fn value_of<'a>(header: &'a str, key: &str) -> Result<&'a str, String> {
    let missing = || format!("the header has no `{key}`");
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))
        .ok_or_else(missing)?;
    let rest = header[at + key.len() + 2..].trim_start();
    let rest = rest.strip_prefix(':').ok_or_else(missing)?.trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')').map(|i| i + 1)
    } else if let Some(q) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') {
        rest[1..].find(q).map(|i| i + 2)
    } else {
        rest.find([',', '}'])
    }
    .ok_or_else(missing)?;
    Ok(rest[..end].trim())
}

/// A version-1 header for a C-order array of `dtype` and `shape`, padded so the data starts at
/// a multiple of 64 bytes.
pub fn header(dtype: DType, shape: &[usize]) -> Result<Vec<u8>, String> {
    let descr = dtype
        .to_npy()
        .ok_or_else(|| format!("numpy has no {dtype} type; write safetensors shards instead"))?;
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut text = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let unpadded = 10 + text.len() + 1;
    text.extend(std::iter::repeat_n(
        ' ',
        unpadded.next_multiple_of(64) - unpadded,
    ));
    text.push('\n');
    let len = u16::try_from(text.len()).map_err(|_| "the shape is too long for a .npy header")?;
    let mut out = Vec::with_capacity(10 + text.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_headers_parse_back() {
        for shape in [vec![7], vec![3, 64, 469], vec![0, 2]] {
            let h = header(DType::F32, &shape).unwrap();
            assert_eq!(h.len() % 64, 0);
            let parsed = parse_header(&h).unwrap();
            assert_eq!(parsed.dtype, DType::F32);
            assert_eq!(parsed.shape, shape);
            assert_eq!(parsed.data_offset, h.len());
        }
    }

    #[test]
    fn numpy_written_headers_parse() {
        // Exactly what numpy 1.26 writes for np.zeros((4, 3), dtype=np.uint8).
        let text = "{'descr': '|u1', 'fortran_order': False, 'shape': (4, 3), }";
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
        let h = parse_header(&bytes).unwrap();
        assert_eq!((h.dtype, h.shape), (DType::U8, vec![4, 3]));
    }

    #[test]
    fn bad_headers_say_what_is_wrong() {
        assert!(
            parse_header(b"PK\x03\x04 not npy")
                .unwrap_err()
                .contains("magic")
        );
        let text = "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }";
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
        assert!(parse_header(&bytes).unwrap_err().contains("`>f4`"));
        let fortran = text.replace(">f4", "<f4").replace("False", "True");
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(fortran.len() as u16).to_le_bytes());
        bytes.extend_from_slice(fortran.as_bytes());
        assert!(parse_header(&bytes).unwrap_err().contains("Fortran"));
        let h = header(DType::F32, &[5]).unwrap();
        assert!(parse_header(&h[..20]).unwrap_err().contains("truncated"));
        assert!(header(DType::Bf16, &[5]).unwrap_err().contains("bf16"));
    }
}

/// A `.npy` array held in memory (a request body, a small file), viewed without copying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyArray<'a> {
    pub dtype: DType,
    pub shape: Vec<usize>,
    data: &'a [u8],
}

impl<'a> NpyArray<'a> {
    /// Parses a whole `.npy` file's bytes. The error says what is wrong (not a `.npy`, an
    /// unsupported element type, a data length that does not match the shape).
    pub fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        let header = parse_header(bytes)?;
        let elements: usize = header.shape.iter().product();
        let want = elements
            .checked_mul(header.dtype.size())
            .ok_or("the shape is too large")?;
        let data = &bytes[header.data_offset.min(bytes.len())..];
        if data.len() != want {
            return Err(format!(
                "the header declares {:?} {} ({want} bytes of data), the file holds {} bytes",
                header.shape,
                header.dtype,
                data.len()
            ));
        }
        Ok(Self {
            dtype: header.dtype,
            shape: header.shape,
            data,
        })
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements converted to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        self.dtype.to_f32(self.data, &mut out);
        out
    }
}

/// A complete little-endian f32 `.npy` file for `values` of `shape`.
pub fn npy_f32_bytes(shape: &[usize], values: &[f32]) -> Result<Vec<u8>, String> {
    let elements: usize = shape.iter().product();
    if elements != values.len() {
        return Err(format!(
            "{} values given for shape {shape:?} ({elements} elements)",
            values.len()
        ));
    }
    let mut bytes = header(DType::F32, shape)?;
    bytes.reserve(values.len() * 4);
    for v in values {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    Ok(bytes)
}

#[cfg(test)]
mod in_memory_tests {
    use super::*;

    #[test]
    fn f32_arrays_round_trip_and_bad_lengths_are_named() {
        let bytes = npy_f32_bytes(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, -6.5]).unwrap();
        let array = NpyArray::parse(&bytes).unwrap();
        assert_eq!(array.dtype, DType::F32);
        assert_eq!(array.shape, vec![2, 3]);
        assert_eq!(array.to_f32(), vec![1.0, 2.0, 3.0, 4.0, 5.0, -6.5]);
        let err = NpyArray::parse(&bytes[..bytes.len() - 4]).unwrap_err();
        assert!(err.contains("24 bytes of data"), "{err}");
        assert!(npy_f32_bytes(&[2, 2], &[1.0]).is_err());
        assert!(NpyArray::parse(b"not numpy at all").is_err());
    }
}

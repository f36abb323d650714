//! Element types a dataset can store on disk, and their conversion to the loader's `f32`
//! features and `i64` labels.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// The element type of a stored array (little-endian on disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F64,
    F32,
    F16,
    Bf16,
    I64,
    I32,
    I16,
    I8,
    U8,
    /// Booleans, one byte each (0 or 1): masks.
    Bool,
}

impl DType {
    /// Every type, in the order error messages list them.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F16,
        DType::Bf16,
        DType::F64,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::Bf16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The manifest's name for the type (`"f32"`, `"bf16"`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// Whether the type holds integers (and so can hold class labels).
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8
        )
    }

    /// The type a named array of this type reaches the model as: floating types keep theirs
    /// but `f64`, which becomes `f32`; integers become `i64` (ids, categories, lengths);
    /// booleans stay booleans (masks).
    pub fn model(self) -> DType {
        match self {
            DType::F64 => DType::F32,
            d if d.is_integer() => DType::I64,
            d => d,
        }
    }

    /// Converts `bytes` (elements of this type, little-endian) into `out`, elements of
    /// [`DType::model`] in the machine's byte order. `out.len()` must be
    /// `bytes.len() / self.size() * self.model().size()`.
    pub fn to_model(self, bytes: &[u8], out: &mut [u8]) {
        let to = self.model();
        debug_assert_eq!(out.len(), bytes.len() / self.size() * to.size());
        match (self, to) {
            (DType::Bool, _) => {
                for (o, b) in out.iter_mut().zip(bytes) {
                    *o = u8::from(*b != 0);
                }
            }
            _ if self == to && cfg!(target_endian = "little") => out.copy_from_slice(bytes),
            // Element by element: `out` need not be aligned for f32.
            (_, DType::F32) => {
                for (o, b) in out.chunks_exact_mut(4).zip(bytes.chunks_exact(self.size())) {
                    let mut v = [0f32];
                    self.to_f32(b, &mut v);
                    o.copy_from_slice(&v[0].to_ne_bytes());
                }
            }
            (_, DType::I64) => {
                for (o, b) in out.chunks_exact_mut(8).zip(bytes.chunks_exact(self.size())) {
                    o.copy_from_slice(&self.to_i64(b).unwrap_or(0).to_ne_bytes());
                }
            }
            // f16 and bf16 on a big-endian machine: swap each element's two bytes.
            _ => {
                for (o, b) in out.chunks_exact_mut(2).zip(bytes.chunks_exact(2)) {
                    o.copy_from_slice(&u16::from_le_bytes([b[0], b[1]]).to_ne_bytes());
                }
            }
        }
    }

    /// The names of every type, for "expected one of" messages.
    pub fn names() -> String {
        DType::ALL.map(DType::name).join(", ")
    }

    pub(crate) fn from_safetensors(d: safetensors::Dtype) -> Option<DType> {
        use safetensors::Dtype as S;
        Some(match d {
            S::F64 => DType::F64,
            S::F32 => DType::F32,
            S::F16 => DType::F16,
            S::BF16 => DType::Bf16,
            S::I64 => DType::I64,
            S::I32 => DType::I32,
            S::I16 => DType::I16,
            S::I8 => DType::I8,
            S::U8 => DType::U8,
            S::BOOL => DType::Bool,
            _ => return None,
        })
    }

    pub(crate) fn to_safetensors(self) -> safetensors::Dtype {
        use safetensors::Dtype as S;
        match self {
            DType::F64 => S::F64,
            DType::F32 => S::F32,
            DType::F16 => S::F16,
            DType::Bf16 => S::BF16,
            DType::I64 => S::I64,
            DType::I32 => S::I32,
            DType::I16 => S::I16,
            DType::I8 => S::I8,
            DType::U8 => S::U8,
            DType::Bool => S::BOOL,
        }
    }

    /// The type of a `.npy` `descr` (`"<f4"`, `"|u1"`, …); big-endian and other types are not
    /// supported.
    pub(crate) fn from_npy(descr: &str) -> Option<DType> {
        Some(match descr {
            "<f8" => DType::F64,
            "<f4" => DType::F32,
            "<f2" => DType::F16,
            "<i8" => DType::I64,
            "<i4" => DType::I32,
            "<i2" => DType::I16,
            "|i1" | "<i1" => DType::I8,
            "|u1" | "<u1" => DType::U8,
            "|b1" => DType::Bool,
            _ => return None,
        })
    }

    /// The `.npy` `descr` of the type; numpy has no bfloat16.
    pub(crate) fn to_npy(self) -> Option<&'static str> {
        Some(match self {
            DType::F64 => "<f8",
            DType::F32 => "<f4",
            DType::F16 => "<f2",
            DType::Bf16 => return None,
            DType::I64 => "<i8",
            DType::I32 => "<i4",
            DType::I16 => "<i2",
            DType::I8 => "|i1",
            DType::U8 => "|u1",
            DType::Bool => "|b1",
        })
    }

    /// Converts `bytes` (elements of this type, little-endian) into `out`, one value per
    /// element. `bytes.len()` must be `out.len() * self.size()`.
    pub(crate) fn to_f32(self, bytes: &[u8], out: &mut [f32]) {
        debug_assert_eq!(bytes.len(), out.len() * self.size());
        fn conv<const N: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn([u8; N]) -> f32) {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(N)) {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                *o = f(a);
            }
        }
        match self {
            // Little-endian f32 on a little-endian machine: the bytes are the values.
            #[cfg(target_endian = "little")]
            DType::F32 => bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(bytes),
            #[cfg(not(target_endian = "little"))]
            DType::F32 => conv(bytes, out, f32::from_le_bytes),
            DType::F64 => conv(bytes, out, |a| f64::from_le_bytes(a) as f32),
            DType::F16 => conv(bytes, out, |a| f16::from_le_bytes(a).to_f32()),
            DType::Bf16 => conv(bytes, out, |a| bf16::from_le_bytes(a).to_f32()),
            DType::I64 => conv(bytes, out, |a| i64::from_le_bytes(a) as f32),
            DType::I32 => conv(bytes, out, |a| i32::from_le_bytes(a) as f32),
            DType::I16 => conv(bytes, out, |a| f32::from(i16::from_le_bytes(a))),
            DType::I8 => conv(bytes, out, |a: [u8; 1]| f32::from(a[0] as i8)),
            DType::U8 => conv(bytes, out, |a: [u8; 1]| f32::from(a[0])),
            DType::Bool => conv(bytes, out, |a: [u8; 1]| f32::from(u8::from(a[0] != 0))),
        }
    }

    /// Reads one integer element (little-endian); `None` for floating-point types.
    pub(crate) fn to_i64(self, bytes: &[u8]) -> Option<i64> {
        let mut a = [0u8; 8];
        a[..bytes.len()].copy_from_slice(bytes);
        Some(match self {
            DType::I64 => i64::from_le_bytes(a),
            DType::I32 => i64::from(i32::from_le_bytes([a[0], a[1], a[2], a[3]])),
            DType::I16 => i64::from(i16::from_le_bytes([a[0], a[1]])),
            DType::I8 => i64::from(a[0] as i8),
            DType::U8 => i64::from(a[0]),
            _ => return None,
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_read_little_endian_values() {
        let mut out = [0f32; 2];
        let bytes: Vec<u8> = [1.5f32, -2.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        DType::F32.to_f32(&bytes, &mut out);
        assert_eq!(out, [1.5, -2.25]);
        let bytes: Vec<u8> = [f16::from_f32(0.5), f16::from_f32(-3.0)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        DType::F16.to_f32(&bytes, &mut out);
        assert_eq!(out, [0.5, -3.0]);
        let bytes: Vec<u8> = [bf16::from_f32(2.0), bf16::from_f32(-0.125)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        DType::Bf16.to_f32(&bytes, &mut out);
        assert_eq!(out, [2.0, -0.125]);
        DType::U8.to_f32(&[255, 7], &mut out);
        assert_eq!(out, [255.0, 7.0]);
        DType::I8.to_f32(&[255, 7], &mut out);
        assert_eq!(out, [-1.0, 7.0]);
        assert_eq!(DType::I32.to_i64(&(-9i32).to_le_bytes()), Some(-9));
        assert_eq!(DType::U8.to_i64(&[200]), Some(200));
        assert_eq!(DType::F32.to_i64(&1f32.to_le_bytes()), None);
    }

    #[test]
    fn arrays_reach_the_model_as_f32_f16_bf16_i64_or_bool() {
        let model = |d: DType, bytes: &[u8]| {
            let mut out = vec![0u8; bytes.len() / d.size() * d.model().size()];
            d.to_model(bytes, &mut out);
            (d.model(), out)
        };
        let halves: Vec<u8> = [f16::from_f32(0.5), f16::from_f32(-3.0)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(model(DType::F16, &halves), (DType::F16, halves.clone()));
        let f64s: Vec<u8> = [1.5f64, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let (d, out) = model(DType::F64, &f64s);
        assert_eq!(
            (d, bytemuck::cast_slice::<u8, f32>(&out)),
            (DType::F32, &[1.5f32, -2.0][..])
        );
        let (d, out) = model(DType::I16, &[0xff, 0xff, 7, 0]);
        assert_eq!(
            (d, bytemuck::pod_read_unaligned::<[i64; 2]>(&out)),
            (DType::I64, [-1, 7])
        );
        let (d, out) = model(DType::U8, &[200]);
        assert_eq!(
            (d, bytemuck::pod_read_unaligned::<i64>(&out)),
            (DType::I64, 200)
        );
        assert_eq!(model(DType::Bool, &[0, 1, 2]), (DType::Bool, vec![0, 1, 1]));
        // Into a slot not aligned for f32.
        let mut unaligned = [0u8; 9];
        DType::F64.to_model(&f64s, &mut unaligned[1..]);
        assert_eq!(unaligned[1..5], 1.5f32.to_ne_bytes());
        assert_eq!(unaligned[5..], (-2.0f32).to_ne_bytes());
    }

    #[test]
    fn npy_and_safetensors_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_safetensors(d.to_safetensors()), Some(d));
            if let Some(descr) = d.to_npy() {
                assert_eq!(DType::from_npy(descr), Some(d));
            }
        }
        assert_eq!(DType::from_npy(">f4"), None, "big-endian is not read");
    }
}

//! TensorBoard event files: a run's scalars and hyperparameters as TensorBoard's own
//! `events.out.tfevents.*` records, which `tensorboard --logdir` reads as they grow.
//!
//! A file is a sequence of TFRecords (the length as u64 little-endian, its masked CRC-32C, the
//! data, the data's masked CRC-32C), each holding one `tensorboard.Event` protobuf: first the
//! file version, then summaries. The few messages written are encoded here by hand; their field
//! numbers are those of TensorBoard's `event.proto`, `summary.proto`, the HParams plugin's
//! `plugin_data.proto` and protobuf's `struct.proto`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::TrainError;

/// What every event file's name contains (TensorBoard picks files by it).
pub const FILE_MARK: &str = "events.out.tfevents.";
/// The longest that written events wait in memory before they reach the file.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// One hyperparameter's value, as the HParams plugin shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum HParam {
    Number(f64),
    Bool(bool),
    Text(String),
}

impl HParam {
    /// A configuration value as shown (`0.001`, `true`, `auto`): a finite number, a boolean,
    /// else text.
    pub fn from_shown(shown: &str) -> Self {
        match shown {
            "true" => Self::Bool(true),
            "false" => Self::Bool(false),
            _ => match shown.parse::<f64>() {
                Ok(v) if v.is_finite() => Self::Number(v),
                _ => Self::Text(shown.to_owned()),
            },
        }
    }
}

/// An open event file; events are buffered and reach the file at [`EventWriter::flush`], or
/// at the first write [`FLUSH_EVERY`] after the last flush.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
    flushed: Instant,
}

impl EventWriter {
    /// Creates `<dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>.kiln` (TensorBoard's
    /// naming; `.kiln.2`, … if taken) and writes the file version into it.
    pub fn create(dir: &Path) -> Result<Self, TrainError> {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let base = format!(
            "{FILE_MARK}{secs}.{}.{}.kiln",
            hostname(),
            std::process::id()
        );
        let mut path = dir.join(&base);
        let mut n = 1;
        let file = loop {
            match File::create_new(&path) {
                Ok(f) => break f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {
                    n += 1;
                    path = dir.join(format!("{base}.{n}"));
                }
                Err(e) => return Err(file_error(&path, e)),
            }
        };
        let mut writer = Self {
            path,
            out: BufWriter::new(file),
            flushed: Instant::now(),
        };
        let mut event = event_head(wall_time(), 0);
        event.bytes(3, b"brain.Event:2");
        writer.record(&event.0)?;
        writer.flush()?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Scalars at `step`, as one event (tags such as `train/loss`).
    pub fn scalars<'a>(
        &mut self,
        step: u64,
        values: impl IntoIterator<Item = (&'a str, f64)>,
    ) -> Result<(), TrainError> {
        let mut summary = Proto::default();
        for (tag, value) in values {
            let mut v = Proto::default();
            v.bytes(1, tag.as_bytes());
            v.float(2, value as f32);
            summary.message(1, &v);
        }
        let mut event = event_head(wall_time(), step);
        event.message(5, &summary);
        self.record(&event.0)?;
        self.flush_if_due()
    }

    /// The hyperparameters, as the HParams plugin's session start (at step 0).
    pub fn hparams<'a>(
        &mut self,
        hparams: impl IntoIterator<Item = (&'a str, &'a HParam)>,
    ) -> Result<(), TrainError> {
        let mut start = Proto::default();
        for (name, value) in hparams {
            // google.protobuf.Value
            let mut v = Proto::default();
            match value {
                HParam::Number(x) => v.double(2, *x),
                HParam::Text(s) => v.bytes(3, s.as_bytes()),
                HParam::Bool(b) => v.uint(4, u64::from(*b)),
            }
            // map<string, Value> hparams = 1: entries of key = 1, value = 2.
            let mut entry = Proto::default();
            entry.bytes(1, name.as_bytes());
            entry.message(2, &v);
            start.message(1, &entry);
        }
        start.double(5, wall_time());
        // HParamsPluginData { version = 1: 0, session_start_info = 3 }
        let mut data = Proto::default();
        data.uint(1, 0);
        data.message(3, &start);
        let mut plugin = Proto::default();
        plugin.bytes(1, b"hparams");
        plugin.bytes(2, &data.0);
        let mut metadata = Proto::default();
        metadata.message(1, &plugin);
        let mut value = Proto::default();
        value.bytes(1, b"_hparams_/session_start_info");
        value.message(9, &metadata);
        let mut summary = Proto::default();
        summary.message(1, &value);
        let mut event = event_head(wall_time(), 0);
        event.message(5, &summary);
        self.record(&event.0)?;
        self.flush()
    }

    /// A session restart at `step` (a resumed run): TensorBoard drops what earlier files
    /// recorded at this step and after, which the resumed run writes again.
    pub fn restart_at(&mut self, step: u64) -> Result<(), TrainError> {
        // SessionLog { status = 1: START (1) }
        let mut log = Proto::default();
        log.uint(1, 1);
        let mut event = event_head(wall_time(), step);
        event.message(7, &log);
        self.record(&event.0)?;
        self.flush()
    }

    /// Everything written so far reaches the file.
    pub fn flush(&mut self) -> Result<(), TrainError> {
        self.flushed = Instant::now();
        self.out.flush().map_err(|e| file_error(&self.path, e))
    }

    fn flush_if_due(&mut self) -> Result<(), TrainError> {
        if self.flushed.elapsed() >= FLUSH_EVERY {
            self.flush()?;
        }
        Ok(())
    }

    fn record(&mut self, data: &[u8]) -> Result<(), TrainError> {
        self.out
            .write_all(&frame(data))
            .map_err(|e| file_error(&self.path, e))
    }
}

fn file_error(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name for event file names (`localhost` where it cannot be read).
fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "localhost".to_owned()
    } else {
        name
    }
}

/// `Event { wall_time = 1, step = 2 }`, for the caller to add its one payload to.
fn event_head(wall_time: f64, step: u64) -> Proto {
    let mut event = Proto::default();
    event.double(1, wall_time);
    event.uint(2, step);
    event
}

/// TFRecord's checksum: CRC-32C, rotated right by 15 bits, plus a constant.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length (u64 LE), its masked CRC, the data, the data's masked CRC.
fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// A protobuf message being encoded, fields in the order added.
#[derive(Debug, Default)]
struct Proto(Vec<u8>);

impl Proto {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire_type));
    }

    /// A varint field (int32, int64, uint64, bool, enum).
    fn uint(&mut self, field: u32, v: u64) {
        self.key(field, 0);
        self.varint(v);
    }

    /// A double (fixed64).
    fn double(&mut self, field: u32, v: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    /// A float (fixed32).
    fn float(&mut self, field: u32, v: f32) {
        self.key(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    /// A length-delimited field: string, bytes.
    fn bytes(&mut self, field: u32, v: &[u8]) {
        self.key(field, 2);
        self.varint(v.len() as u64);
        self.0.extend_from_slice(v);
    }

    fn message(&mut self, field: u32, m: &Proto) {
        self.bytes(field, &m.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoded protobuf field: number and value.
    #[derive(Debug, Clone, PartialEq)]
    enum Field {
        Varint(u64),
        Fixed64(u64),
        Fixed32(u32),
        Bytes(Vec<u8>),
    }

    fn read_varint(b: &[u8], at: &mut usize) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let byte = b[*at];
            *at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return v;
            }
            shift += 7;
        }
    }

    fn decode(b: &[u8]) -> Vec<(u32, Field)> {
        let mut at = 0;
        let mut out = vec![];
        while at < b.len() {
            let key = read_varint(b, &mut at);
            let field = (key >> 3) as u32;
            let value = match key & 7 {
                0 => Field::Varint(read_varint(b, &mut at)),
                1 => {
                    at += 8;
                    Field::Fixed64(u64::from_le_bytes(b[at - 8..at].try_into().unwrap()))
                }
                5 => {
                    at += 4;
                    Field::Fixed32(u32::from_le_bytes(b[at - 4..at].try_into().unwrap()))
                }
                2 => {
                    let n = read_varint(b, &mut at) as usize;
                    at += n;
                    Field::Bytes(b[at - n..at].to_vec())
                }
                w => panic!("wire type {w}"),
            };
            out.push((field, value));
        }
        out
    }

    fn get(fields: &[(u32, Field)], n: u32) -> Vec<Field> {
        fields
            .iter()
            .filter(|f| f.0 == n)
            .map(|f| f.1.clone())
            .collect()
    }

    fn bytes(f: &Field) -> &[u8] {
        match f {
            Field::Bytes(b) => b,
            other => panic!("not bytes: {other:?}"),
        }
    }

    /// The records of a TFRecord file, their checksums checked.
    fn records(file: &[u8]) -> Vec<Vec<u8>> {
        let mut at = 0;
        let mut out = vec![];
        while at < file.len() {
            let len: [u8; 8] = file[at..at + 8].try_into().unwrap();
            let crc = u32::from_le_bytes(file[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc(&len));
            let n = u64::from_le_bytes(len) as usize;
            let data = &file[at + 12..at + 12 + n];
            let crc = u32::from_le_bytes(file[at + 12 + n..at + 16 + n].try_into().unwrap());
            assert_eq!(crc, masked_crc(data));
            out.push(data.to_vec());
            at += 16 + n;
        }
        out
    }

    #[test]
    fn varints_take_seven_bits_a_byte_low_first() {
        let enc = |v| {
            let mut p = Proto::default();
            p.varint(v);
            p.0
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(1), [1]);
        assert_eq!(enc(127), [0x7f]);
        assert_eq!(enc(128), [0x80, 0x01]);
        assert_eq!(enc(300), [0xac, 0x02]);
        assert_eq!(enc(u64::MAX).len(), 10);
        assert_eq!(read_varint(&enc(u64::MAX), &mut 0), u64::MAX);
    }

    #[test]
    fn fields_carry_their_number_and_wire_type() {
        let mut p = Proto::default();
        p.uint(2, 150);
        p.bytes(3, b"ab");
        p.float(2, 1.5);
        assert_eq!(
            p.0,
            [
                0x10, 0x96, 0x01, 0x1a, 2, b'a', b'b', 0x15, 0, 0, 0xc0, 0x3f
            ]
        );
    }

    #[test]
    fn records_are_framed_with_masked_crc32c() {
        // CRC-32C's check value (RFC 3720, B.4).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // Masked: rotated right by 15 bits (0x2507c60d), plus 0xa282ead8 (worked out apart).
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
        let framed = frame(b"123456789");
        assert_eq!(framed.len(), 8 + 4 + 9 + 4);
        assert_eq!(framed[..8], 9u64.to_le_bytes());
        assert_eq!(framed[12..21], *b"123456789");
        assert_eq!(framed[21..], masked_crc(b"123456789").to_le_bytes());
        assert_eq!(records(&framed), [b"123456789".to_vec()]);
    }

    #[test]
    fn hyperparameters_are_numbers_booleans_or_text() {
        assert_eq!(HParam::from_shown("0.001"), HParam::Number(0.001));
        assert_eq!(HParam::from_shown("32"), HParam::Number(32.0));
        assert_eq!(HParam::from_shown("true"), HParam::Bool(true));
        assert_eq!(HParam::from_shown("auto"), HParam::Text("auto".into()));
        assert_eq!(HParam::from_shown("inf"), HParam::Text("inf".into()));
    }

    #[test]
    fn a_file_holds_the_version_then_scalars_hparams_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        let name = w.path().file_name().unwrap().to_str().unwrap().to_owned();
        assert!(
            name.starts_with(FILE_MARK) && name.ends_with(".kiln"),
            "{name}"
        );
        w.scalars(7, [("train/loss", 0.25), ("lr", 1e-3)]).unwrap();
        let hp = [
            ("train.lr", HParam::Number(0.001)),
            ("run.tensorboard", HParam::Bool(true)),
            ("model.name", HParam::Text("mlp".into())),
        ];
        w.hparams(hp.iter().map(|(k, v)| (*k, v))).unwrap();
        w.restart_at(9).unwrap();
        // Written events reach the file only when flushed (or FLUSH_EVERY later).
        w.scalars(10, [("lr", 2.0)]).unwrap();
        let before = std::fs::read(w.path()).unwrap();
        w.flush().unwrap();
        let file = std::fs::read(w.path()).unwrap();
        assert!(before.len() < file.len());
        // A second writer in the same second takes another name.
        let other = EventWriter::create(dir.path()).unwrap();
        assert_ne!(other.path(), w.path());

        let events: Vec<Vec<(u32, Field)>> = records(&file).iter().map(|r| decode(r)).collect();
        assert_eq!(events.len(), 5);
        for e in &events {
            let Field::Fixed64(bits) = get(e, 1)[0] else {
                panic!("wall_time is a double")
            };
            assert!(f64::from_bits(bits) > 1.6e9);
        }
        assert_eq!(
            get(&events[0], 3),
            [Field::Bytes(b"brain.Event:2".to_vec())]
        );

        // The scalars: step 7, Summary { value { tag, simple_value } … }.
        assert_eq!(get(&events[1], 2), [Field::Varint(7)]);
        let summary = decode(bytes(&get(&events[1], 5)[0]));
        let values: Vec<(String, f32)> = get(&summary, 1)
            .iter()
            .map(|v| {
                let v = decode(bytes(v));
                let tag = String::from_utf8(bytes(&get(&v, 1)[0]).to_vec()).unwrap();
                let Field::Fixed32(bits) = get(&v, 2)[0] else {
                    panic!("simple_value is a float")
                };
                (tag, f32::from_bits(bits))
            })
            .collect();
        assert_eq!(
            values,
            [("train/loss".to_owned(), 0.25), ("lr".to_owned(), 1e-3)]
        );

        // The hparams: Summary.Value { tag, metadata { plugin_data { name, content } } }.
        let value = decode(bytes(&get(&decode(bytes(&get(&events[2], 5)[0])), 1)[0]));
        assert_eq!(
            get(&value, 1),
            [Field::Bytes(b"_hparams_/session_start_info".to_vec())]
        );
        let plugin = decode(bytes(&get(&decode(bytes(&get(&value, 9)[0])), 1)[0]));
        assert_eq!(get(&plugin, 1), [Field::Bytes(b"hparams".to_vec())]);
        let data = decode(bytes(&get(&plugin, 2)[0]));
        assert_eq!(get(&data, 1), [Field::Varint(0)]);
        let start = decode(bytes(&get(&data, 3)[0]));
        let entries: Vec<(String, Vec<(u32, Field)>)> = get(&start, 1)
            .iter()
            .map(|e| {
                let e = decode(bytes(e));
                let key = String::from_utf8(bytes(&get(&e, 1)[0]).to_vec()).unwrap();
                (key, decode(bytes(&get(&e, 2)[0])))
            })
            .collect();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].0, "train.lr");
        assert_eq!(
            entries[0].1,
            [(2, Field::Fixed64(0.001f64.to_bits()))],
            "number_value"
        );
        assert_eq!(entries[1].1, [(4, Field::Varint(1))], "bool_value");
        assert_eq!(
            entries[2].1,
            [(3, Field::Bytes(b"mlp".to_vec()))],
            "string_value"
        );

        // The restart: step 9, SessionLog { status: START }.
        assert_eq!(get(&events[3], 2), [Field::Varint(9)]);
        assert_eq!(
            decode(bytes(&get(&events[3], 7)[0])),
            [(1, Field::Varint(1))]
        );
        assert_eq!(get(&events[4], 2), [Field::Varint(10)]);
    }
}

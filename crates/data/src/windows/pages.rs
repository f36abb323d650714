//! Checks of a Parquet file's footer and page headers before the `parquet` crate decodes
//! them: the crate reserves room for what a schema element or a page header claims before it
//! checks the claim (apache/arrow-rs#10734), so a damaged file of a few bytes could take 2 GB.
//!
//! The footer (`FileMetaData`, Thrift's compact protocol) is walked first: every collection no
//! longer than the bytes left, every schema element's `num_children` no more than the schema's
//! elements. Then every column chunk must lie inside the file and claim no more uncompressed
//! bytes than its codec can expand its compressed ones to ([`max_ratio`]); every page header
//! in it is read
//! (skipping what is not a size) and its page must fit in what is left of the chunk and claim
//! no more uncompressed bytes than the chunk's total, which the format makes the sum of its
//! pages'.

use std::io::{BufReader, Read, Seek, SeekFrom};

use parquet::basic::Compression;
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};

/// The most a column chunk compressed with `codec` may claim uncompressed per compressed byte:
/// what the codec can expand to at best, with room to spare. Snappy's best is about 21×
/// (64 bytes from a 3-byte copy), LZ4's about 255× (a byte of match length per 255 bytes),
/// zstd's about 32,768× (a 128 KiB block repeating one byte, from 4 bytes); an uncompressed
/// chunk claims what it holds. Other codecs are not built in, and the `parquet` crate refuses
/// them itself.
pub(crate) fn max_ratio(codec: Compression) -> u64 {
    match codec {
        Compression::UNCOMPRESSED => 2,
        Compression::SNAPPY => 32,
        Compression::LZ4 | Compression::LZ4_RAW => 256,
        _ => 1 << 16,
    }
}

/// Every chunk may claim this much, whatever its size.
const FLOOR: u64 = 1 << 20;
/// Nesting deeper than this in a page header or a footer is damage.
const MAX_DEPTH: usize = 32;

/// The file's footer (`FileMetaData`) walked before the `parquet` crate decodes it, which
/// reserves room for as many children as a schema element claims before reading them: every
/// collection no longer than the bytes left, every schema element's `num_children` no more
/// than the schema's elements. A footer too damaged to find is left to the crate's own error.
pub(crate) fn check_footer(file: &std::fs::File, file_len: u64) -> Result<(), String> {
    let mut reader = BufReader::new(file);
    let mut tail = [0u8; 8];
    let read_tail = file_len >= 12
        && reader.seek(SeekFrom::Start(file_len - 8)).is_ok()
        && reader.read_exact(&mut tail).is_ok();
    let footer_len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if !read_tail || &tail[4..] != b"PAR1" || footer_len + 8 > file_len {
        return Ok(());
    }
    reader
        .seek(SeekFrom::Start(file_len - 8 - footer_len))
        .map_err(|e| e.to_string())?;
    let mut footer = Compact::new(reader.take(footer_len), footer_len);
    footer
        .file_metadata()
        .map_err(|e| format!("the file's metadata: {e}"))
}

/// An error naming what is implausible, for [`read_parquet`](super::table)'s message.
pub(crate) fn check_pages(
    file: &std::fs::File,
    file_len: u64,
    metadata: &ParquetMetaData,
) -> Result<(), String> {
    let mut reader = BufReader::with_capacity(8 << 10, file);
    for (g, group) in metadata.row_groups().iter().enumerate() {
        for (c, column) in group.columns().iter().enumerate() {
            check_chunk(&mut reader, file_len, column)
                .map_err(|e| format!("row group {g}, column {c}: {e}"))?;
        }
    }
    Ok(())
}

/// The chunk's own claims, then each of its pages'.
fn check_chunk<R: Read + Seek>(
    reader: &mut R,
    file_len: u64,
    column: &ColumnChunkMetaData,
) -> Result<(), String> {
    let start = column
        .dictionary_page_offset()
        .unwrap_or_else(|| column.data_page_offset());
    let (start, len, total) = match (
        u64::try_from(start),
        u64::try_from(column.compressed_size()),
        u64::try_from(column.uncompressed_size()),
    ) {
        (Ok(s), Ok(l), Ok(t)) => (s, l, t),
        _ => return Err("a negative offset or size in the file's metadata".to_owned()),
    };
    let end = start.checked_add(len).filter(|&e| e <= file_len);
    let Some(end) = end else {
        return Err(format!(
            "the column chunk [{start}, +{len}) passes the end of the file ({file_len} bytes)"
        ));
    };
    let codec = column.compression();
    if total > (len.saturating_mul(max_ratio(codec))).max(FLOOR) {
        return Err(format!(
            "the column chunk claims {total} bytes uncompressed from {len} compressed with \
             {codec}, more than it can expand to"
        ));
    }
    let mut at = start;
    while at < end {
        reader
            .seek(SeekFrom::Start(at))
            .map_err(|e| e.to_string())?;
        let mut header = Compact::new(reader.by_ref().take(end - at), end - at);
        let (uncompressed, compressed) = header
            .page_sizes()
            .map_err(|e| format!("the page header at byte {at}: {e}"))?;
        let body = at + header.read;
        let next = u64::try_from(compressed)
            .ok()
            .and_then(|c| body.checked_add(c))
            .filter(|&n| n <= end);
        let Some(next) = next else {
            return Err(format!(
                "the page at byte {at} claims {compressed} bytes, past its column chunk's end \
                 ({end})"
            ));
        };
        if u64::try_from(uncompressed).map_or(true, |u| u > total) {
            return Err(format!(
                "the page at byte {at} claims {uncompressed} bytes uncompressed; its column \
                 chunk holds {total} in all"
            ));
        }
        at = next;
    }
    Ok(())
}

/// A reader of Thrift's compact protocol over `limit` bytes, counting what it read.
struct Compact<R> {
    input: R,
    limit: u64,
    read: u64,
}

impl<R: Read> Compact<R> {
    fn new(input: R, limit: u64) -> Self {
        Self {
            input,
            limit,
            read: 0,
        }
    }

    /// Fields 2 and 3 of the `PageHeader` struct (`uncompressed_page_size`,
    /// `compressed_page_size`), every other field skipped; both must be there.
    fn page_sizes(&mut self) -> Result<(i64, i64), String> {
        let (mut uncompressed, mut compressed) = (None, None);
        let mut id = 0i64;
        while let Some((field, kind)) = self.field_header(&mut id)? {
            match (field, kind) {
                (2, I32) => uncompressed = Some(self.zigzag()?),
                (3, I32) => compressed = Some(self.zigzag()?),
                _ => self.skip(kind, 0)?,
            }
        }
        match (uncompressed, compressed) {
            (Some(u), Some(c)) => Ok((u, c)),
            _ => Err("no page sizes in it".to_owned()),
        }
    }

    /// `FileMetaData`, field 2 (`schema`, a list of `SchemaElement`) checked, the rest skipped.
    fn file_metadata(&mut self) -> Result<(), String> {
        let mut id = 0i64;
        while let Some((field, kind)) = self.field_header(&mut id)? {
            match (field, kind) {
                (2, LIST) => self.schema()?,
                _ => self.skip(kind, 0)?,
            }
        }
        Ok(())
    }

    /// The schema's elements, each one's field 5 (`num_children`) at most their count.
    fn schema(&mut self) -> Result<(), String> {
        let (count, kind) = self.list_header()?;
        if kind != STRUCT {
            return Err(format!("a schema of elements of type {kind}"));
        }
        for k in 0..count {
            let mut id = 0i64;
            while let Some((field, kind)) = self.field_header(&mut id)? {
                match (field, kind) {
                    (5, I32) => {
                        let n = self.zigzag()?;
                        if !(0..=count as i64).contains(&n) {
                            return Err(format!(
                                "schema element {k} claims {n} children; the schema has {count} \
                                 elements"
                            ));
                        }
                    }
                    _ => self.skip(kind, 1)?,
                }
            }
        }
        Ok(())
    }

    /// The next field's id and type, `None` at the struct's end.
    fn field_header(&mut self, id: &mut i64) -> Result<Option<(i64, u8)>, String> {
        let byte = self.byte()?;
        if byte == 0 {
            return Ok(None);
        }
        let delta = i64::from(byte >> 4);
        *id = match delta {
            0 => self.zigzag()?,
            d => *id + d,
        };
        Ok(Some((*id, byte & 0x0f)))
    }

    /// Skips a value of compact type `kind`.
    fn skip(&mut self, kind: u8, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("values nested too deep".to_owned());
        }
        match kind {
            TRUE | FALSE => Ok(()),
            I8 => self.byte().map(drop),
            I16 | I32 | I64 => self.varint().map(drop),
            DOUBLE => self.bytes(8),
            BINARY => {
                let n = self.varint()?;
                self.bytes(n)
            }
            LIST | SET => self.skip_list(depth),
            MAP => self.skip_map(depth),
            STRUCT => self.skip_struct(depth),
            UUID => self.bytes(16),
            other => Err(format!("a value of unknown type {other}")),
        }
    }

    /// A list's or set's element count and type, the count no more than the bytes left (each
    /// element takes one at least: a bool inside a list takes a byte of its own).
    fn list_header(&mut self) -> Result<(u64, u8), String> {
        let byte = self.byte()?;
        let count = match byte >> 4 {
            15 => self.varint()?,
            n => u64::from(n),
        };
        let kind = match byte & 0x0f {
            TRUE | FALSE => I8,
            k => k,
        };
        let left = self.limit.saturating_sub(self.read);
        if count > left {
            return Err(format!("a list of {count} elements in {left} bytes"));
        }
        Ok((count, kind))
    }

    fn skip_list(&mut self, depth: usize) -> Result<(), String> {
        let (count, kind) = self.list_header()?;
        (0..count).try_for_each(|_| self.skip(kind, depth + 1))
    }

    fn skip_map(&mut self, depth: usize) -> Result<(), String> {
        let count = self.varint()?;
        if count == 0 {
            return Ok(());
        }
        if count > self.limit.saturating_sub(self.read) {
            return Err(format!("a map of {count} entries past the bytes left"));
        }
        let kinds = self.byte()?;
        let bool_as_byte = |k: u8| if k == TRUE || k == FALSE { I8 } else { k };
        let (key, value) = (bool_as_byte(kinds >> 4), bool_as_byte(kinds & 0x0f));
        (0..count).try_for_each(|_| {
            self.skip(key, depth + 1)?;
            self.skip(value, depth + 1)
        })
    }

    fn skip_struct(&mut self, depth: usize) -> Result<(), String> {
        let mut id = 0;
        while let Some((_, kind)) = self.field_header(&mut id)? {
            self.skip(kind, depth + 1)?;
        }
        Ok(())
    }

    fn byte(&mut self) -> Result<u8, String> {
        let mut b = [0u8];
        self.input
            .read_exact(&mut b)
            .map_err(|_| "cut short (the bytes end inside a value)".to_owned())?;
        self.read += 1;
        Ok(b[0])
    }

    /// `n` bytes passed over; an error where the bytes end first (so a length claimed costs
    /// no memory).
    fn bytes(&mut self, n: u64) -> Result<(), String> {
        let passed = std::io::copy(&mut self.input.by_ref().take(n), &mut std::io::sink())
            .map_err(|e| e.to_string())?;
        self.read += passed;
        if passed < n {
            return Err("cut short (the bytes end inside a value)".to_owned());
        }
        Ok(())
    }

    /// An unsigned LEB128 varint of at most 10 bytes.
    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint of more than 10 bytes".to_owned())
    }

    /// A zigzag-encoded signed varint.
    fn zigzag(&mut self) -> Result<i64, String> {
        let n = self.varint()?;
        Ok((n >> 1) as i64 ^ -((n & 1) as i64))
    }
}

// The compact protocol's types.
const TRUE: u8 = 1;
const FALSE: u8 = 2;
const I8: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;
const UUID: u8 = 13;

#[cfg(test)]
mod tests {
    use super::*;

    /// `v` as the compact protocol writes a signed integer.
    fn zigzag(v: i64) -> Vec<u8> {
        let mut n = ((v << 1) ^ (v >> 63)) as u64;
        let mut out = vec![];
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                return out;
            }
            out.push(b | 0x80);
        }
    }

    /// A compact-protocol page header: type DATA_PAGE, the two sizes, a data page header
    /// struct with a list of bools and a binary, and the end.
    fn header(uncompressed: i64, compressed: i64) -> Vec<u8> {
        let zz = zigzag;
        let mut h = vec![0x15];
        h.extend(zz(0));
        h.push(0x15);
        h.extend(zz(uncompressed));
        h.push(0x15);
        h.extend(zz(compressed));
        // Field 5, a struct: a list of 2 bools (field 1), a binary of 3 bytes (field 2).
        h.extend([0x2c, 0x19, 0x21, 1, 2, 0x18, 3, b'a', b'b', b'c', 0x00]);
        h.push(0x00);
        h
    }

    #[test]
    fn the_sizes_are_read_past_fields_of_every_kind() {
        let bytes = header(1000, 40);
        let mut h = Compact::new(bytes.as_slice(), bytes.len() as u64);
        assert_eq!(h.page_sizes().unwrap(), (1000, 40));
        assert_eq!(h.read, bytes.len() as u64);
    }

    #[test]
    fn a_header_cut_short_or_without_sizes_is_an_error() {
        let bytes = header(1000, 40);
        let cut = &bytes[..bytes.len() - 3];
        let e = Compact::new(cut, cut.len() as u64)
            .page_sizes()
            .unwrap_err();
        assert!(e.contains("cut short"), "{e}");
        let no_sizes = [0x15, 0x00, 0x00];
        let e = Compact::new(no_sizes.as_slice(), 3)
            .page_sizes()
            .unwrap_err();
        assert!(e.contains("no page sizes"), "{e}");
    }

    /// A footer: `FileMetaData` with a version (field 1) and a schema (field 2) of a root
    /// claiming `children` children and one leaf.
    fn footer(children: i64) -> Vec<u8> {
        let mut m = vec![0x15, 0x02, 0x19, 0x2c];
        // The root: name (field 4, binary "r"), num_children (field 5).
        m.extend([0x48, 1, b'r', 0x15]);
        m.extend(zigzag(children));
        m.push(0x00);
        // The leaf: type (field 1, i32 INT64 = 2), name (field 4).
        m.extend([0x15, 0x04, 0x38, 1, b'y', 0x00]);
        m.push(0x00);
        m
    }

    #[test]
    fn a_schema_element_claiming_more_children_than_the_schema_has_is_an_error() {
        let good = footer(1);
        let mut c = Compact::new(good.as_slice(), good.len() as u64);
        c.file_metadata().unwrap();
        assert_eq!(c.read, good.len() as u64);
        let bad = footer(270_000_000);
        let e = Compact::new(bad.as_slice(), bad.len() as u64)
            .file_metadata()
            .unwrap_err();
        assert!(
            e.contains("claims 270000000 children; the schema has 2"),
            "{e}"
        );
        // A list claiming more elements than there are bytes left.
        let long = [0x19, 0xfc, 0xff, 0xff, 0xff, 0x07, 0x00];
        let e = Compact::new(long.as_slice(), 7)
            .file_metadata()
            .unwrap_err();
        assert!(e.contains("elements in 1 bytes"), "{e}");
    }

    #[test]
    fn a_claimed_length_costs_no_memory() {
        // A binary field claiming 2⁶³ bytes in a 20-byte header: an error, read by what is there.
        let mut bytes = vec![0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        bytes.extend([0u8; 10]);
        let e = Compact::new(bytes.as_slice(), 20).page_sizes().unwrap_err();
        assert!(e.contains("cut short"), "{e}");
    }
}

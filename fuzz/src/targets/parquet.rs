//! Parquet files: the long table of time-series windows read through the `parquet` crate's
//! record reader (`prepare_windows` of a `.parquet` table). Seeds: the long table written with
//! each compression kiln reads (none, snappy, zstd, lz4) and with a null.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

use super::windows::{long_rows, source};
use super::{remove_dir, text, write};
use crate::{Grammar, Harness, Outcome, Target};

pub const TARGET: Target = Target {
    name: "parquet",
    about: "Parquet bytes → prepare_windows of a .parquet long table (the parquet crate's \
            record reader, kiln's cells and checks)",
    grammar: Grammar::Binary,
    dictionary: &[
        b"PAR1",
        b"store",
        b"item",
        b"time",
        b"region",
        b"\x15\x00",
        b"\x19\x1c",
        b"\xff\xff\xff\x7f",
    ],
    fixup: None,
    make,
    selftest: false,
};

const SCHEMA: &str = "message long { required binary store (UTF8); required binary item (UTF8); \
                      required int64 time; required double y; required double price; \
                      optional double temp; required binary region (UTF8); }";

/// The long table as Parquet, compressed with `compression`, `temp` null at row `null_at`.
fn long_parquet(compression: Compression, null_at: Option<usize>) -> Result<Vec<u8>, String> {
    let rows = long_rows();
    let schema = Arc::new(parquet::schema::parser::parse_message_type(SCHEMA).map_err(text)?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(compression)
            .build(),
    );
    let mut out = vec![];
    let mut writer = SerializedFileWriter::new(&mut out, schema, props).map_err(text)?;
    let mut group = writer.next_row_group().map_err(text)?;
    let texts = |f: &dyn Fn(usize) -> String| -> Vec<ByteArray> {
        (0..rows.len())
            .map(|i| ByteArray::from(f(i).as_str()))
            .collect()
    };
    let doubles = |f: &dyn Fn(usize) -> f64| -> Vec<f64> { (0..rows.len()).map(f).collect() };
    let mut column = 0;
    while let Some(mut c) = group.next_column().map_err(text)? {
        match column {
            0 => c
                .typed::<ByteArrayType>()
                .write_batch(&texts(&|i| rows[i].0.clone()), None, None),
            1 => c
                .typed::<ByteArrayType>()
                .write_batch(&texts(&|i| rows[i].1.clone()), None, None),
            2 => {
                let times: Vec<i64> = rows.iter().map(|r| r.2).collect();
                c.typed::<Int64Type>().write_batch(&times, None, None)
            }
            3 => c
                .typed::<DoubleType>()
                .write_batch(&doubles(&|i| rows[i].3), None, None),
            4 => c
                .typed::<DoubleType>()
                .write_batch(&doubles(&|i| rows[i].4), None, None),
            5 => {
                let defs: Vec<i16> = (0..rows.len())
                    .map(|i| i16::from(Some(i) != null_at))
                    .collect();
                let values: Vec<f64> = (0..rows.len())
                    .filter(|&i| Some(i) != null_at)
                    .map(|i| rows[i].5)
                    .collect();
                c.typed::<DoubleType>()
                    .write_batch(&values, Some(&defs), None)
            }
            _ => c
                .typed::<ByteArrayType>()
                .write_batch(&texts(&|i| rows[i].6.clone()), None, None),
        }
        .map_err(text)?;
        c.close().map_err(text)?;
        column += 1;
    }
    group.close().map_err(text)?;
    writer.close().map_err(text)?;
    Ok(out)
}

struct Parquet {
    file: PathBuf,
    out: PathBuf,
    seeds: Vec<Vec<u8>>,
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    let seeds = vec![
        long_parquet(Compression::UNCOMPRESSED, None)?,
        long_parquet(Compression::SNAPPY, None)?,
        long_parquet(Compression::ZSTD(Default::default()), None)?,
        long_parquet(Compression::LZ4_RAW, Some(3))?,
    ];
    Ok(Box::new(Parquet {
        file: scratch.join("long.parquet"),
        out: scratch.join("prepared"),
        seeds,
    }))
}

impl Harness for Parquet {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        write(&self.file, input)?;
        let prepared = kiln_data::prepare_windows(&source(self.file.clone(), None), &self.out);
        remove_dir(&self.out);
        prepared.map(drop).map_err(text)
    }
}

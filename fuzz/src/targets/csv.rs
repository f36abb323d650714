//! CSV files, every way kiln reads them: a CSV dataset with a label column and with target
//! columns (`CsvDataset::open`), named column groups (`kiln data prepare --csv --array`), and a
//! long table for time-series windows (`prepare_windows`), each on the same text.

use std::path::{Path, PathBuf};

use kiln_data::{ColumnGroup, CsvDataset, CsvOptions, PrepareOptions, PrepareSource};

use super::windows::{long_csv, source};
use super::{remove_dir, text, write};
use crate::{Grammar, Harness, Outcome, Outcomes, Target};

pub const TARGET: Target = Target {
    name: "csv",
    about: "CSV text → CsvDataset::open (a label column; target columns), kiln data prepare \
            of column groups, prepare_windows of a long table",
    grammar: Grammar::Text,
    dictionary: &[
        b"label",
        b"y",
        b"x1",
        b"x2",
        b"store",
        b"item",
        b"time",
        b"price",
        b"temp",
        b"region",
        b",",
        b"\"",
        b"\"\"",
        b"\r\n",
        b"\n",
        b",,",
        b"NaN",
        b"inf",
        b"-9223372036854775808",
        b"9223372036854775807",
        b"1e39",
        b"cat",
        b"\xff\xfe",
    ],
    fixup: None,
    make,
    selftest: false,
};

/// Seeds: tables of each shape the parsers take.
fn seeds() -> Vec<Vec<u8>> {
    [
        "x1,x2,label\n0.5,1.5,0\n1.0,-2.0,1\n3,4,2\n".to_owned(),
        "x1,x2,label\n0.5,1.5,cat\n1.0,-2.0,dog\n3,4,cat\n".to_owned(),
        "x1,x2,y,label\n1,2,0.25,3\n4,5,0.5,1\n7,8,-1e3,0\n".to_owned(),
        " x1 , x2 ,label\n\"1\",\"2\",\"a,b\"\n3,4,c\n".to_owned(),
        long_csv(),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect()
}

struct Csv {
    file: PathBuf,
    out: PathBuf,
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    Ok(Box::new(Csv {
        file: scratch.join("table.csv"),
        out: scratch.join("prepared"),
    }))
}

impl Csv {
    fn groups(&self) -> Outcome {
        let group = |name: &str, columns: &[&str]| ColumnGroup {
            name: name.to_owned(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
        };
        let source = PrepareSource::CsvArrays {
            path: self.file.clone(),
            inputs: vec![group("xs", &["x1", "x2"])],
            target: group("label", &["label"]),
            classes: None,
            delimiter: b',',
        };
        let prepared = kiln_data::prepare(&source, &self.out, &PrepareOptions::default());
        remove_dir(&self.out);
        prepared.map(drop).map_err(text)
    }

    fn windows(&self) -> Outcome {
        let prepared = kiln_data::prepare_windows(&source(self.file.clone(), Some(2)), &self.out);
        remove_dir(&self.out);
        prepared.map(drop).map_err(text)
    }
}

impl Harness for Csv {
    fn seeds(&self) -> Vec<Vec<u8>> {
        seeds()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        write(&self.file, input)?;
        let mut o = Outcomes::default();
        o.add(CsvDataset::open(&self.file, &CsvOptions::default()));
        let values = CsvOptions {
            target_columns: Some(vec!["y".into()]),
            ..CsvOptions::default()
        };
        o.add(CsvDataset::open(&self.file, &values));
        o.add(self.groups());
        o.add(self.windows());
        o.finish()
    }
}

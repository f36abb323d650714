//! `kiln-windows.json`, a windowed dataset's manifest: `Windows::open` over real column files
//! (`kiln data prepare --windows` of a long table), then its splits and forecast windows, the
//! first windows of each read by name. Also the long table and the window settings the CSV and
//! Parquet targets prepare.

use std::path::{Path, PathBuf};

use kiln_data::{
    TableFormat, TargetNormalizer, WINDOWS_FILE, WindowColumns, Windows, WindowsSource,
};

use super::dataset::read_first;
use super::{read, text, write};
use crate::{Grammar, Harness, Outcome, Outcomes, Target};

pub const TARGET: Target = Target {
    name: "windows-manifest",
    about: "kiln-windows.json bytes → Windows::open over real columns, split and forecast, \
            read_arrays of their first windows",
    grammar: Grammar::Json,
    dictionary: &[
        b"\"kiln-windows\"",
        b"\"version\"",
        b"\"columns\"",
        b"\"encoder_length\"",
        b"\"horizon\"",
        b"\"min_encoder_length\"",
        b"\"normalize\"",
        b"\"group\"",
        b"\"none\"",
        b"\"rows\"",
        b"\"categories\"",
        b"\"series\"",
        b"\"start\"",
        b"\"len\"",
        b"\"first_time\"",
        b"\"statics\"",
        b"\"key\"",
        b"\"known\"",
        b"\"unknown\"",
        b"\"static_categoricals\"",
        b"\"target\"",
        b"9223372036854775807",
        b"-9223372036854775808",
    ],
    fixup: None,
    make,
    selftest: false,
};

/// The long table: `(store, item, time, y, price, temp, region)` rows of four series of
/// different lengths and starts, one shorter than a window, in no particular order.
pub(crate) fn long_rows() -> Vec<(String, String, i64, f64, f64, f64, String)> {
    let series = [
        ("b", "2", 100, 14),
        ("a", "1", 7, 12),
        ("b", "1", 0, 4),
        ("c", "1", -3, 9),
    ];
    let mut rows = vec![];
    for (s, (store, item, first, len)) in series.into_iter().enumerate() {
        for k in 0..len {
            let t = first + k;
            let region = if store == "c" { "north" } else { "east" };
            rows.push((
                store.to_owned(),
                item.to_owned(),
                t,
                (t as f64 * 0.37 + s as f64).sin() + 10.0 * s as f64,
                0.5 * t as f64,
                ((t * 7) % 11) as f64 - 5.0,
                region.to_owned(),
            ));
        }
    }
    let n = rows.len();
    (0..n).map(|i| rows[(i * 17 + 5) % n].clone()).collect()
}

/// The long table as CSV.
pub(crate) fn long_csv() -> String {
    let mut text = String::from("store,item,time,y,price,temp,region\n");
    for (store, item, t, y, price, temp, region) in long_rows() {
        text += &format!("{store},{item},{t},{y},{price},{temp},{region}\n");
    }
    text
}

/// How the long table is windowed: encoder 4, horizon 2, a known, an unknown and a static.
pub(crate) fn source(table: PathBuf, min_encoder_length: Option<usize>) -> WindowsSource {
    let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    WindowsSource {
        format: TableFormat::of_path(&table),
        table,
        delimiter: b',',
        columns: WindowColumns {
            time: "time".into(),
            group: names(&["store", "item"]),
            target: names(&["y"]),
            known: names(&["price"]),
            unknown: names(&["temp", "y"]),
            static_categoricals: names(&["region"]),
        },
        encoder_length: 4,
        min_encoder_length,
        horizon: 2,
        normalize: TargetNormalizer::Group,
    }
}

struct WindowsManifest {
    dir: PathBuf,
    manifest: PathBuf,
    seeds: Vec<Vec<u8>>,
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    let csv = scratch.join("long.csv");
    write(&csv, long_csv().as_bytes())?;
    let mut seeds = vec![];
    for (k, min) in [None, Some(2)].into_iter().enumerate() {
        let mut source = source(csv.clone(), min);
        if k == 1 {
            source.normalize = TargetNormalizer::None;
        }
        let out = scratch.join(format!("windows-{k}"));
        kiln_data::prepare_windows(&source, &out).map_err(text)?;
        seeds.push(read(&out.join(WINDOWS_FILE))?);
    }
    let dir = scratch.join("windows-0");
    Ok(Box::new(WindowsManifest {
        manifest: dir.join(WINDOWS_FILE),
        dir,
        seeds,
    }))
}

impl Harness for WindowsManifest {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        write(&self.manifest, input)?;
        let windows = Windows::open(&self.dir).map_err(text)?;
        let horizon = windows.manifest().horizon;
        let mut o = Outcomes::default();
        for val_steps in [0, horizon, horizon.saturating_mul(2).saturating_add(1)] {
            match windows.split(val_steps) {
                Ok((train, val)) => {
                    o.add(read_first(&train));
                    o.add(read_first(&val));
                }
                Err(e) => {
                    o.add(Err::<(), _>(e));
                }
            }
        }
        o.add(
            windows
                .forecast(horizon)
                .map_err(text)
                .and_then(|f| read_first(&f)),
        );
        o.finish()
    }
}

//! Time-series windows: a long-format CSV (rows in any order, series of different lengths and
//! start times, one too short for a window) prepared and split by time, every window read by
//! name equal to one computed slowly here from the CSV's rows; no validation window's horizon
//! reaches a step any training window reads; the loader delivers the same windows; and every
//! bad input is an error naming the line, column, series or key at fault.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_data::{
    Dataset, Loader, LoaderConfig, SamplerConfig, TargetNormalizer, TargetSlot, WindowColumns,
    WindowedDataset, Windows, WindowsSource, prepare_windows,
};

const E: usize = 6;
const H: usize = 3;
const V: usize = 5;

/// Series `(store, item, first time, length)`; `b/1` is shorter than one window.
const SERIES: [(&str, &str, i64, usize); 5] = [
    ("b", "2", 100, 30),
    ("a", "1", 7, 25),
    ("b", "1", 0, 7),
    ("a", "10", -4, 20),
    ("c", "1", 50, 40),
];

/// One CSV row: key, time, target `y`, known `price`, unknown `temp`, static `region`.
#[derive(Clone)]
struct Row {
    key: (String, String),
    time: i64,
    y: f64,
    price: f64,
    temp: f64,
    region: String,
}

fn rows() -> Vec<Row> {
    let mut rows = vec![];
    for (s, (store, item, first, len)) in SERIES.iter().enumerate() {
        for k in 0..*len {
            let t = first + k as i64;
            rows.push(Row {
                key: (store.to_string(), item.to_string()),
                time: t,
                y: ((t as f64) * 0.37 + s as f64).sin() * (s as f64 + 1.0) + 10.0 * s as f64,
                price: 0.5 * t as f64 + s as f64,
                temp: ((t * 7 + s as i64) % 11) as f64 - 5.0,
                region: if store == &"c" { "north" } else { "east" }.to_owned(),
            });
        }
    }
    // Any order: a fixed shuffle.
    let n = rows.len();
    (0..n).map(|i| rows[(i * 37 + 11) % n].clone()).collect()
}

fn write_csv(path: &Path, rows: &[Row]) {
    let mut text = String::from("store,item,time,y,price,temp,region\n");
    for r in rows {
        text += &format!(
            "{},{},{},{},{},{},{}\n",
            r.key.0, r.key.1, r.time, r.y, r.price, r.temp, r.region
        );
    }
    std::fs::write(path, text).unwrap();
}

fn source(table: PathBuf, normalize: TargetNormalizer) -> WindowsSource {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    WindowsSource {
        format: kiln_data::TableFormat::of_path(&table),
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
        encoder_length: E,
        min_encoder_length: None,
        horizon: H,
        normalize,
    }
}

/// A window computed from the rows: every array as `f64`s, by name, and the target.
type Expected = BTreeMap<&'static str, Vec<f64>>;

/// Windows by series key, first decoder time and encoder length.
type ByKey = BTreeMap<((String, String), i64, usize), Expected>;

/// The windows of each split, keyed by series key, first decoder time and encoder length,
/// computed from the rows alone, with histories of `min_e` to `E` steps: a full history
/// where the horizon fits before the part's end (training: the cutoff; validation: the
/// series' end, the horizon after the cutoff), a shorter one only where it starts at the
/// series' first row or its horizon ends at the part's end (as pytorch-forecasting's
/// `min_encoder_length`).
fn reference(rows: &[Row], normalize: bool, min_e: usize) -> [ByKey; 2] {
    let mut series: BTreeMap<(String, String), Vec<Row>> = BTreeMap::new();
    for r in rows {
        series.entry(r.key.clone()).or_default().push(r.clone());
    }
    let mut out = [BTreeMap::new(), BTreeMap::new()];
    for (g, (key, mut rs)) in series.into_iter().enumerate() {
        rs.sort_by_key(|r| r.time);
        let cutoff_time = rs.last().unwrap().time - V as i64;
        let train: Vec<f64> = rs
            .iter()
            .filter(|r| r.time <= cutoff_time)
            .map(|r| r.y)
            .collect();
        let (center, scale) = if normalize && train.len() >= 2 {
            let n = train.len() as f64;
            let mean = train.iter().sum::<f64>() / n;
            let var = train.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
            (mean, var.sqrt() + 1.0 / 1024.0)
        } else {
            (0.0, 1.0)
        };
        let n = rs.len();
        let windows = (0..n).flat_map(|p| (min_e..=E).map(move |e| (p, e)));
        for (p, e) in windows.filter(|(p, e)| p + e + H <= n) {
            let (enc, dec) = (&rs[p..p + e], &rs[p + e..p + e + H]);
            let last = dec.last().unwrap().time;
            let (at_start, at_end) = (p == 0, p + e + H == n);
            let split = match e == E {
                true if last <= cutoff_time => 0,
                true if dec[0].time > cutoff_time => 1,
                false if last <= cutoff_time && (at_start || last == cutoff_time) => 0,
                false if dec[0].time > cutoff_time && (at_start || at_end) => 1,
                _ => continue,
            };
            let pad = |width: usize| vec![0.0; (E - e) * width];
            let mut w = Expected::new();
            let mut cont: Vec<f64> = enc
                .iter()
                .flat_map(|r| [r.price, r.temp, (r.y - center) / scale])
                .collect();
            cont.extend(pad(3));
            w.insert("encoder_cont", cont);
            let mut target: Vec<f64> = enc.iter().map(|r| r.y).collect();
            target.extend(pad(1));
            w.insert("encoder_target", target);
            if min_e < E {
                let mut mask = vec![1.0; e];
                mask.extend(pad(1));
                w.insert("encoder_mask", mask);
            }
            w.insert("decoder_cont", dec.iter().map(|r| r.price).collect());
            let region = if key.0 == "c" { 1.0 } else { 0.0 };
            w.insert("static_cat", vec![region]);
            w.insert("group", vec![g as f64]);
            w.insert("decoder_time", dec.iter().map(|r| r.time as f64).collect());
            w.insert("encoder_length", vec![e as f64]);
            w.insert("decoder_length", vec![H as f64]);
            w.insert("target_scale", vec![center, scale]);
            w.insert("target", dec.iter().map(|r| r.y).collect());
            out[split].insert((key.clone(), dec[0].time, e), w);
        }
    }
    out
}

/// Every window of `d`, read by name in one batch, keyed as [`reference`] keys them.
fn read_all(d: &WindowedDataset) -> ByKey {
    let indices: Vec<usize> = (0..d.len()).collect();
    let read = read_by_name(d, &indices);
    let mut out = BTreeMap::new();
    for (k, w) in read.into_iter().enumerate() {
        let (series, _) = d.window(k).unwrap();
        let key = &d.manifest().series[series].key;
        let start = w["decoder_time"][0] as i64;
        let e = w["encoder_length"][0] as usize;
        assert_eq!(d.encoder_of(k), Some(e));
        out.insert(((key[0].clone(), key[1].clone()), start, e), w);
    }
    out
}

/// The windows at `indices`, each array converted to `f64`s.
fn read_by_name(d: &WindowedDataset, indices: &[usize]) -> Vec<Expected> {
    let specs = d.inputs();
    let n = indices.len();
    let mut slots: Vec<Vec<u8>> = specs
        .iter()
        .map(|s| vec![0u8; n * s.numel() * s.dtype.model().size()])
        .collect();
    let mut targets = vec![0f32; n * d.target().numel()];
    let mut views: Vec<&mut [u8]> = slots.iter_mut().map(|s| &mut s[..]).collect();
    d.read_arrays(indices, &mut views, TargetSlot::Values(&mut targets))
        .unwrap();
    (0..n)
        .map(|k| {
            let mut w = Expected::new();
            for (spec, slot) in specs.iter().zip(&slots) {
                let name: &'static str = Box::leak(spec.name.clone().into_boxed_str());
                w.insert(
                    name,
                    values(spec.dtype.model().size(), slot, k, spec.numel()),
                );
            }
            let per = d.target().numel();
            let t = &targets[k * per..(k + 1) * per];
            w.insert("target", t.iter().map(|v| *v as f64).collect());
            w
        })
        .collect()
}

fn values(size: usize, slot: &[u8], k: usize, numel: usize) -> Vec<f64> {
    let bytes = &slot[k * numel * size..(k + 1) * numel * size];
    if size == 1 {
        return bytes.iter().map(|&b| f64::from(b)).collect();
    }
    if size == 8 {
        bytes
            .chunks_exact(8)
            .map(|b| i64::from_ne_bytes(b.try_into().unwrap()) as f64)
            .collect()
    } else {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()) as f64)
            .collect()
    }
}

fn assert_same(got: &ByKey, want: &ByKey, split: &str) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the {split} windows"
    );
    for (key, w) in want {
        for (name, values) in w {
            let g = &got[key][name];
            assert_eq!(g.len(), values.len(), "{split} {key:?} {name}");
            for (a, b) in g.iter().zip(values) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "{split} window {key:?} array {name}: {g:?} != {values:?}"
                );
            }
        }
    }
}

fn prepared(dir: &Path, normalize: TargetNormalizer) -> (Windows, Vec<Row>) {
    let rows = rows();
    let csv = dir.join("long.csv");
    write_csv(&csv, &rows);
    let out = dir.join("windows");
    let manifest = prepare_windows(&source(csv, normalize), &out).unwrap();
    assert_eq!(manifest.series.len(), SERIES.len());
    assert_eq!(manifest.short_series(), 1, "b/1 has 7 steps, a window 9");
    (Windows::open(&out).unwrap(), rows)
}

#[test]
fn windows_equal_a_slow_reference_computed_from_the_rows() {
    for normalize in [TargetNormalizer::None, TargetNormalizer::Group] {
        let tmp = tempfile::tempdir().unwrap();
        let (windows, rows) = prepared(tmp.path(), normalize);
        let (train, val) = windows.split(V).unwrap();
        let [want_train, want_val] = reference(&rows, normalize == TargetNormalizer::Group, E);
        assert!(want_train.len() > 40 && want_val.len() == 4 * (V - H + 1));
        assert_same(&read_all(&train), &want_train, "training");
        assert_same(&read_all(&val), &want_val, "validation");
    }
}

/// The shortest history of the variable-length tests.
const MIN_E: usize = 2;

/// The test rows written in `dir`, their source with histories down to [`MIN_E`] steps, and
/// where to prepare it.
fn variable_source(dir: &Path, normalize: TargetNormalizer) -> (WindowsSource, PathBuf, Vec<Row>) {
    let rows = rows();
    let csv = dir.join("long.csv");
    write_csv(&csv, &rows);
    let mut variable = source(csv, normalize);
    variable.min_encoder_length = Some(MIN_E);
    (variable, dir.join("windows"), rows)
}

/// With a shorter minimum history, the windows at each part's end that allow no full one are
/// added, padded to the encoder length, with their length and a mask; a series too short for a
/// full window gives them too. Old manifests (no minimum) keep their arrays.
#[test]
fn variable_length_windows_equal_the_slow_reference_with_lengths_and_masks() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut variable, out, rows) = variable_source(tmp.path(), TargetNormalizer::Group);
    let manifest = prepare_windows(&variable, &out).unwrap();
    assert_eq!(
        manifest.short_series(),
        0,
        "b/1 has 7 steps, a window at least 5"
    );
    let windows = Windows::open(&out).unwrap();
    let (train, val) = windows.split(V).unwrap();
    let mask = train
        .inputs()
        .into_iter()
        .find(|a| a.name == "encoder_mask");
    assert_eq!(
        mask.map(|a| (a.dtype, a.shape)),
        Some((kiln_data::DType::Bool, vec![E]))
    );
    let [want_train, want_val] = reference(&rows, true, MIN_E);
    let shorter = want_train.keys().filter(|k| k.2 < E).count();
    assert!(
        shorter >= 4 * (E - MIN_E),
        "{shorter} shorter training windows"
    );
    assert!(want_val.keys().any(|k| k.2 == MIN_E));
    assert_same(&read_all(&train), &want_train, "training");
    assert_same(&read_all(&val), &want_val, "validation");
    // A minimum above the encoder length is refused, naming it.
    variable.min_encoder_length = Some(E + 1);
    let e = prepare_windows(&variable, &tmp.path().join("other")).unwrap_err();
    assert!(e.to_string().contains("min_encoder_length"), "{e}");
}

/// The windows to forecast: one per horizon start after each cutoff, with the longest history
/// the series has (none of validation's shortened duplicates), and a series needs no training
/// window for them.
#[test]
fn forecast_windows_are_one_per_horizon_with_the_longest_history() {
    let tmp = tempfile::tempdir().unwrap();
    let (variable, out, _) = variable_source(tmp.path(), TargetNormalizer::None);
    prepare_windows(&variable, &out).unwrap();
    let windows = Windows::open(&out).unwrap();
    for val_steps in [H, V] {
        let f = windows.forecast(val_steps).unwrap();
        let mut seen = BTreeMap::new();
        for (k, w) in read_by_name(&f, &(0..f.len()).collect::<Vec<_>>())
            .iter()
            .enumerate()
        {
            let series = f.window(k).unwrap().0;
            let s = &windows.manifest().series[series];
            let start = w["decoder_time"][0] as i64;
            let history = (start - s.first_time) as usize;
            let e = w["encoder_length"][0] as usize;
            assert_eq!(
                e,
                history.min(E),
                "the longest history, series {series} at {start}"
            );
            assert!(
                start >= s.first_time + (s.len - val_steps) as i64,
                "after the cutoff"
            );
            assert!(
                seen.insert((series, start), e).is_none(),
                "one window per horizon"
            );
        }
        // Every horizon start after each cutoff with a history of at least MIN_E steps.
        let want: usize = windows
            .manifest()
            .series
            .iter()
            .map(|s| {
                let first = (s.len - val_steps).max(MIN_E);
                (s.len + 1).saturating_sub(H).saturating_sub(first)
            })
            .sum();
        assert_eq!(seen.len(), want, "val_steps {val_steps}");
    }
    // b/1 (7 steps) keeps no training window before its last 5, and still forecasts.
    let f = windows.forecast(V).unwrap();
    assert!((0..f.len()).any(|k| windows.manifest().series[f.window(k).unwrap().0].len == 7));
    let e = windows.forecast(H - 1).unwrap_err();
    assert!(e.to_string().contains("data.val_steps"), "{e}");
}

#[test]
fn no_validation_horizon_reaches_a_step_a_training_window_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let (windows, _) = prepared(tmp.path(), TargetNormalizer::Group);
    for val_steps in [H, V, 11] {
        let (train, val) = windows.split(val_steps).unwrap();
        let mut latest_read: BTreeMap<usize, i64> = BTreeMap::new();
        for (k, w) in read_by_name(&train, &(0..train.len()).collect::<Vec<_>>())
            .iter()
            .enumerate()
        {
            let series = train.window(k).unwrap().0;
            let last = *w["decoder_time"].last().unwrap() as i64;
            let seen = latest_read.entry(series).or_insert(i64::MIN);
            *seen = (*seen).max(last);
        }
        for (k, w) in read_by_name(&val, &(0..val.len()).collect::<Vec<_>>())
            .iter()
            .enumerate()
        {
            let series = val.window(k).unwrap().0;
            let first = w["decoder_time"][0] as i64;
            if let Some(seen) = latest_read.get(&series) {
                assert!(first > *seen, "val_steps {val_steps}: series {series}");
            }
            let s = &windows.manifest().series[series];
            let end = s.first_time + s.len as i64;
            assert!(first >= end - val_steps as i64, "starts after the cutoff");
        }
        assert!(!val.is_empty());
    }
    let (train, val) = windows.split(0).unwrap();
    assert!(val.is_empty());
    let every: usize = windows
        .manifest()
        .series
        .iter()
        .map(|s| (s.len + 1).saturating_sub(E + H))
        .sum();
    assert_eq!(train.len(), every);
}

#[test]
fn the_loader_delivers_the_windows_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (windows, _) = prepared(tmp.path(), TargetNormalizer::Group);
    let (train, _) = windows.split(V).unwrap();
    let train = Arc::new(train);
    for workers in [0, 2] {
        let config = LoaderConfig {
            batch_size: 8,
            num_workers: workers,
            sampler: SamplerConfig {
                shuffle: true,
                seed: 5,
                ..SamplerConfig::default()
            },
            by_name: true,
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(Arc::clone(&train), config).unwrap();
        let mut seen = vec![];
        for batch in loader.epoch(0) {
            let batch = batch.unwrap();
            let direct = read_by_name(&train, &batch.indices);
            for (a, spec) in batch.arrays.iter().zip(train.inputs()) {
                let numel = spec.numel();
                for (k, want) in direct.iter().enumerate() {
                    let got = values(a.dtype.size(), &a.data, k, numel);
                    assert_eq!(&got, &want[spec.name.as_str()], "{workers} workers");
                }
            }
            let kiln_data::Targets::Values(t) = &batch.targets else {
                panic!("value targets")
            };
            let want: Vec<f32> = direct
                .iter()
                .flat_map(|w| w["target"].iter().map(|v| *v as f32))
                .collect();
            assert_eq!(t, &want);
            seen.extend(batch.indices);
        }
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..train.len()).collect::<Vec<_>>(),
            "{workers} workers"
        );
    }
}

fn prepare_error(edit: impl Fn(&mut String), source_edit: impl Fn(&mut WindowsSource)) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("long.csv");
    write_csv(&csv, &rows());
    let mut text = std::fs::read_to_string(&csv).unwrap();
    edit(&mut text);
    std::fs::write(&csv, text).unwrap();
    let mut s = source(csv, TargetNormalizer::Group);
    source_edit(&mut s);
    let out = tmp.path().join("out");
    let err = prepare_windows(&s, &out).unwrap_err().to_string();
    assert!(!out.exists(), "nothing is left behind: {err}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "no staging directory is left: {err}");
    err
}

#[test]
fn bad_input_is_an_error_naming_what_is_at_fault() {
    let drop_line = |n: usize| {
        move |t: &mut String| {
            let mut lines: Vec<&str> = t.lines().collect();
            let gone = lines
                .iter()
                .position(|l| l.starts_with(&format!("c,1,{n},")))
                .unwrap();
            lines.remove(gone);
            *t = lines.join("\n") + "\n";
        }
    };
    let none = |_: &mut WindowsSource| {};
    let gap = prepare_error(drop_line(60), none);
    assert!(
        gap.contains("series c/1") && gap.contains("59 and 61"),
        "{gap}"
    );
    assert!(gap.contains("gap of 1 missing steps"), "{gap}");
    let dup = prepare_error(|t| *t += "c,1,60,1,1,1,north\n", none);
    assert!(dup.contains("repeat the same time"), "{dup}");
    let nan = prepare_error(|t| *t += "c,1,90,NaN,1,1,north\n", none);
    assert!(
        nan.contains("column `y`: `NaN` is not a finite number"),
        "{nan}"
    );
    let empty = prepare_error(|t| *t += "c,1,90,1,,1,north\n", none);
    assert!(
        empty.contains("column `price`: `` is not a finite"),
        "{empty}"
    );
    let time = prepare_error(|t| *t += "c,1,9.5,1,1,1,north\n", none);
    assert!(
        time.contains("`9.5` is not an integer time index"),
        "{time}"
    );
    let region = prepare_error(|t| *t += "c,1,90,1,1,1,south\n", none);
    assert!(
        region.contains("static column `region` changes within series c/1"),
        "{region}"
    );
    let column = prepare_error(|_| {}, |s| s.columns.known.push("humidity".into()));
    assert!(column.contains("has no column `humidity`"), "{column}");
    let twice = prepare_error(|_| {}, |s| s.columns.known.push("temp".into()));
    assert!(
        twice.contains("column `temp` is given two roles: known and unknown"),
        "{twice}"
    );
    let long = prepare_error(|_| {}, |s| s.encoder_length = 60);
    assert!(
        long.contains("no series is long enough for one window: the longest has 40"),
        "{long}"
    );
    let zero = prepare_error(|_| {}, |s| s.horizon = 0);
    assert!(zero.contains("`horizon` = 0"), "{zero}");
    // Longer than the whole table: padded windows of 2³² steps would need 192 GiB each.
    let huge = prepare_error(
        |_| {},
        |s| {
            s.encoder_length = 1 << 32;
            s.min_encoder_length = Some(2);
        },
    );
    assert!(
        huge.contains("`encoder_length` = 4294967296") && huge.contains("at most the"),
        "{huge}"
    );
}

/// kiln-fuzz's windows-manifest target: a manifest whose encoder length (2³², with a minimum of
/// 2 so that windows still fit) is longer than all its rows asked the allocator for 192 GiB.
#[test]
fn a_manifest_whose_encoder_outgrows_its_rows_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let _ = prepared(tmp.path(), TargetNormalizer::None);
    let path = tmp.path().join("windows").join(kiln_data::WINDOWS_FILE);
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["encoder_length"] = serde_json::json!(4294967296u64);
    m["min_encoder_length"] = serde_json::json!(2);
    std::fs::write(&path, m.to_string()).unwrap();
    let Err(e) = Windows::open(&tmp.path().join("windows")) else {
        panic!("a manifest of 2^32 encoder steps was opened");
    };
    let e = e.to_string();
    assert!(
        e.contains("encoder length (4294967296)") && e.contains("rows it holds"),
        "{e}"
    );
}

#[test]
fn a_split_that_leaves_no_window_or_a_partial_horizon_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (windows, _) = prepared(tmp.path(), TargetNormalizer::None);
    let short = windows.split(H - 1).unwrap_err().to_string();
    assert!(short.contains("`data.val_steps` = 2") && short.contains("at least the horizon (3)"));
    let all = windows.split(35).unwrap_err().to_string();
    assert!(all.contains("no training window"), "{all}");
    let out = tmp.path().join("windows");
    let again = prepare_windows(
        &source(tmp.path().join("long.csv"), TargetNormalizer::None),
        &out,
    );
    assert!(again.unwrap_err().to_string().contains("never overwrites"));
    let manifest = out.join(kiln_data::WINDOWS_FILE);
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("\"rows\": 122", "\"rows\": 121")).unwrap();
    let err = Windows::open(&out).unwrap_err().to_string();
    assert!(
        err.contains("its series hold 122 rows; `rows` says 121"),
        "{err}"
    );
}

#[test]
fn several_targets_add_a_dimension_and_arrays_without_columns_are_left_out() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = rows();
    let csv = tmp.path().join("long.csv");
    write_csv(&csv, &rows);
    let mut s = source(csv, TargetNormalizer::Group);
    s.columns.target = vec!["y".into(), "price".into()];
    s.columns.known.clear();
    s.columns.unknown.clear();
    s.columns.static_categoricals.clear();
    let out = tmp.path().join("windows");
    prepare_windows(&s, &out).unwrap();
    let (train, _) = Windows::open(&out).unwrap().split(V).unwrap();
    let shapes: Vec<(String, Vec<usize>)> = train
        .inputs()
        .into_iter()
        .map(|a| (a.name, a.shape))
        .collect();
    let want: Vec<(String, Vec<usize>)> = [
        ("encoder_target", vec![E, 2]),
        ("group", vec![]),
        ("decoder_time", vec![H]),
        ("encoder_length", vec![]),
        ("decoder_length", vec![]),
        ("target_scale", vec![2, 2]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s))
    .collect();
    assert_eq!(shapes, want);
    assert_eq!(train.target().shape(), [H, 2]);
    // The first window of series a/1 (the first key): its first horizon step, both targets.
    let w = &read_by_name(&train, &[0])[0];
    let first = rows
        .iter()
        .find(|r| r.key == ("a".into(), "1".into()) && r.time == 7 + E as i64)
        .unwrap();
    let t = &w["target"];
    assert!(
        (t[0] - first.y).abs() < 1e-5 && (t[1] - first.price).abs() < 1e-5,
        "{t:?}"
    );
    assert_eq!(w["target_scale"].len(), 4);
}

/// Writes `rows` as a Parquet file (snappy pages): strings for the keys and the region, int64
/// times, doubles for the values; `temp` optional, null where `null_temp_at` says.
fn write_parquet(path: &Path, rows: &[Row], null_temp_at: Option<usize>) {
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    write_parquet_with(path, rows, null_temp_at, props);
}

use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

/// [`write_parquet`] with the writer's properties `props`.
fn write_parquet_with(
    path: &Path,
    rows: &[Row],
    null_temp_at: Option<usize>,
    props: WriterProperties,
) {
    use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
    use parquet::file::writer::SerializedFileWriter;

    let schema = "message long { required binary store (UTF8); required binary item (UTF8); \
                  required int64 time; required double y; required double price; \
                  optional double temp; required binary region (UTF8); }";
    let schema = Arc::new(parquet::schema::parser::parse_message_type(schema).unwrap());
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, schema, Arc::new(props)).unwrap();
    let mut group = writer.next_row_group().unwrap();
    let texts = |f: &dyn Fn(&Row) -> String| -> Vec<ByteArray> {
        rows.iter()
            .map(|r| ByteArray::from(f(r).as_str()))
            .collect()
    };
    let doubles = |f: &dyn Fn(&Row) -> f64| -> Vec<f64> { rows.iter().map(f).collect() };
    let mut column = 0;
    while let Some(mut c) = group.next_column().unwrap() {
        match column {
            0 => c
                .typed::<ByteArrayType>()
                .write_batch(&texts(&|r| r.key.0.clone()), None, None),
            1 => c
                .typed::<ByteArrayType>()
                .write_batch(&texts(&|r| r.key.1.clone()), None, None),
            2 => {
                let times: Vec<i64> = rows.iter().map(|r| r.time).collect();
                c.typed::<Int64Type>().write_batch(&times, None, None)
            }
            3 => c
                .typed::<DoubleType>()
                .write_batch(&doubles(&|r| r.y), None, None),
            4 => c
                .typed::<DoubleType>()
                .write_batch(&doubles(&|r| r.price), None, None),
            5 => {
                let defs: Vec<i16> = (0..rows.len())
                    .map(|i| i16::from(Some(i) != null_temp_at))
                    .collect();
                let values: Vec<f64> = (0..rows.len())
                    .filter(|&i| Some(i) != null_temp_at)
                    .map(|i| rows[i].temp)
                    .collect();
                c.typed::<DoubleType>()
                    .write_batch(&values, Some(&defs), None)
            }
            _ => c
                .typed::<ByteArrayType>()
                .write_batch(&texts(&|r| r.region.clone()), None, None),
        }
        .unwrap();
        c.close().unwrap();
        column += 1;
    }
    group.close().unwrap();
    writer.close().unwrap();
}

#[test]
fn a_parquet_table_compressed_thousands_of_times_is_read() {
    // kiln checks what a column chunk claims uncompressed against what its codec can expand
    // to: a constant column without a dictionary, in zstd, is thousands of times smaller than
    // what it holds, and is a table like any other.
    let tmp = tempfile::tempdir().unwrap();
    let rows: Vec<Row> = (0..100_000i64)
        .map(|t| Row {
            key: ("a".to_owned(), (t % 2).to_string()),
            time: t / 2,
            y: (t / 2) as f64,
            price: 1.0,
            temp: 0.0,
            region: "the same region, whatever the row".to_owned(),
        })
        .collect();
    let table = tmp.path().join("long.parquet");
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(Default::default()))
        .set_dictionary_enabled(false)
        .build();
    write_parquet_with(&table, &rows, None, props);
    let file =
        parquet::file::reader::SerializedFileReader::new(std::fs::File::open(&table).unwrap())
            .unwrap();
    use parquet::file::reader::FileReader;
    let region = file.metadata().row_group(0).column(6);
    let ratio = region.uncompressed_size() / region.compressed_size();
    assert!(ratio > 1024, "the region column is compressed {ratio}×");
    let manifest = prepare_windows(
        &source(table, TargetNormalizer::Group),
        &tmp.path().join("windows"),
    )
    .unwrap();
    assert_eq!(manifest.series.len(), 2);
}

#[test]
fn a_parquet_table_gives_the_windows_its_csv_gives() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = rows();
    let (csv, table) = (tmp.path().join("long.csv"), tmp.path().join("long.parquet"));
    write_csv(&csv, &rows);
    write_parquet(&table, &rows, None);
    let from = |input: PathBuf, out: &str| {
        let out = tmp.path().join(out);
        let manifest = prepare_windows(&source(input, TargetNormalizer::Group), &out).unwrap();
        let read = |f: &str| std::fs::read(out.join(f)).unwrap();
        (manifest, read("targets.npy"), read("reals.npy"))
    };
    let (a, b) = (from(csv, "from-csv"), from(table.clone(), "from-parquet"));
    assert_eq!(a.0.series, b.0.series);
    assert_eq!((a.1, a.2), (b.1, b.2), "the same stored columns");
    // A null is named by its row (1-based) and column.
    let nulled = tmp.path().join("null.parquet");
    write_parquet(&nulled, &rows, Some(4));
    let err = prepare_windows(
        &source(nulled, TargetNormalizer::Group),
        &tmp.path().join("x"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("row 5, column `temp`: `null` is not a finite number"),
        "{err}"
    );
    let mut s = source(table, TargetNormalizer::Group);
    s.columns.known = vec!["humidity".into()];
    let err = prepare_windows(&s, &tmp.path().join("y"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("has no column `humidity` (its columns: store, item, time"),
        "{err}"
    );
}

#[test]
fn a_corrupt_manifest_or_a_missing_key_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let (windows, _) = prepared(tmp.path(), TargetNormalizer::None);
    let out = windows.manifest().series.len();
    assert_eq!(out, SERIES.len());
    let manifest = tmp.path().join("windows").join(kiln_data::WINDOWS_FILE);
    let good = std::fs::read_to_string(&manifest).unwrap();
    let mut value: serde_json::Value = serde_json::from_str(&good).unwrap();
    // Lengths that wrap around when added, and a time index past i64::MAX.
    value["series"][0]["len"] = serde_json::json!(usize::MAX - 5);
    value["series"][1]["start"] = serde_json::json!(usize::MAX - 5);
    let cases = [
        value.to_string(),
        good.replacen(
            "\"first_time\": 7",
            &format!("\"first_time\": {}", i64::MAX - 3),
            1,
        ),
        good.replacen("\"horizon\": 3", &format!("\"horizon\": {}", usize::MAX), 1),
    ];
    for text in cases {
        std::fs::write(&manifest, &text).unwrap();
        let err = Windows::open(&tmp.path().join("windows"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(kiln_data::WINDOWS_FILE), "{err}");
    }
    let empty_key = prepare_error(|t| *t += ",1,90,1,1,1,north\n", |_| {});
    assert!(
        empty_key.contains("column `store`: `` is missing"),
        "{empty_key}"
    );
    let extreme = prepare_error(
        |t| {
            *t += &format!(
                "c,1,{},1,1,1,north\nc,1,{},1,1,1,north\n",
                i64::MIN,
                i64::MAX
            )
        },
        |_| {},
    );
    assert!(extreme.contains("missing steps"), "{extreme}");
}

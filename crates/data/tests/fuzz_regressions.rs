//! Inputs the fuzz harness (`kiln-fuzz`) found a panic, a hang or an unbounded allocation
//! with, each kept in `tests/fuzz-inputs/` and answered here with the error it must get.

use std::path::Path;

use kiln_data::{NpyArray, npy_parse_header};

/// The input file `name` of `tests/fuzz-inputs/`.
fn input(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz-inputs")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A `.npy` header of `text`, version 1.
fn npy_with_header(text: &str) -> Vec<u8> {
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

#[test]
fn a_npy_shape_whose_element_count_overflows_is_an_error() {
    // `(18446744073709551615, 3)`: the element count overflowed (a panic in debug builds, a
    // wrapped count in release ones) in NpyArray::parse.
    let bytes = input("npy-shape-overflows.npy");
    let e = npy_parse_header(&bytes).unwrap_err();
    assert!(
        e.contains("too large") && e.contains("18446744073709551615"),
        "{e}"
    );
    assert!(NpyArray::parse(&bytes).unwrap_err().contains("too large"));
}

#[test]
fn a_npy_row_too_large_for_memory_is_an_error_even_with_no_rows() {
    // Zero rows hold no data, but a reader's row size would still overflow.
    let text = "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296), }";
    let e = npy_parse_header(&npy_with_header(text)).unwrap_err();
    assert!(e.contains("too large"), "{e}");
    let fits = "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 65536, 65536), }";
    assert_eq!(
        npy_parse_header(&npy_with_header(fits)).unwrap().shape,
        [0, 65536, 65536]
    );
}

/// `kiln data prepare --windows` of the Parquet table `name` (the harness's long table: series
/// by store and item, time, targets y, reals price and temp, static region) into a new
/// directory: its error.
fn prepare_parquet(name: &str) -> String {
    use kiln_data::{TableFormat, TargetNormalizer, WindowColumns, WindowsSource};
    let tmp = tempfile::tempdir().unwrap();
    let table = tmp.path().join("long.parquet");
    std::fs::write(&table, input(name)).unwrap();
    let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    let source = WindowsSource {
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
        min_encoder_length: None,
        horizon: 2,
        normalize: TargetNormalizer::Group,
    };
    let out = tmp.path().join("windows");
    let e = kiln_data::prepare_windows(&source, &out).unwrap_err();
    assert!(!out.exists());
    e.to_string()
}

#[test]
fn parquet_tables_the_parquet_reader_panicked_on_are_errors() {
    // The parquet crate (57) indexed past a buffer in its RLE decoder on the first, and
    // unwrapped a missing field of the file's metadata on the second; kiln's guard made the
    // panics errors. parquet 60 returns an error for the first itself.
    for name in [
        "parquet-rle-index.parquet",
        "parquet-metadata-unwrap.parquet",
    ] {
        let e = prepare_parquet(name);
        assert!(
            e.contains("long.parquet: cannot read it as Parquet: "),
            "{name}: {e}"
        );
    }
}

#[test]
fn parquet_files_claiming_more_than_they_hold_are_errors_not_allocations() {
    // kiln-fuzz's parquet target found each. The parquet crate reserved what the file claims
    // before reading it:
    let cases = [
        // a footer whose schema list claims billions of elements: 74 GB in parquet 57 (an
        // abort where the allocation fails); parquet 60 bounds a list by the bytes left;
        (
            "parquet-schema-list-size.parquet",
            "cannot read it as Parquet: ",
        ),
        // a page header claiming gigabytes in a column chunk of 377 bytes: parquet 60 reserves
        // and fills it before checking it (2 GB resident, apache/arrow-rs#10734); kiln reads
        // the page headers first;
        (
            "parquet-page-size.parquet",
            "row group 0, column 3: the page at byte 333 claims",
        ),
        // a schema element claiming 270 million children, in a varint of 15 bytes the crate
        // reads: parquet 60 reserved 2 GB for them; kiln walks the footer first.
        (
            "parquet-schema-children.parquet",
            "the file's metadata: a varint of more than 10 bytes",
        ),
    ];
    for (name, expected) in cases {
        let e = prepare_parquet(name);
        assert!(
            e.contains("long.parquet: cannot read it as Parquet: ") && e.contains(expected),
            "{name}: {e}"
        );
    }
}

#[test]
fn shard_counts_whose_sum_overflows_are_an_error() {
    // kiln-fuzz's dataset-manifest target: two shards claiming 2⁶⁴ − 1 and 1 samples
    // overflowed the sum of the shards' samples (a panic in debug builds, a wrapped count in
    // release ones) in the manifest's checks.
    use kiln_data::{DType, PrepareOptions, PrepareSource, ShardFormat, ShardedDataset};
    let tmp = tempfile::tempdir().unwrap();
    let (features, labels) = (tmp.path().join("f.npy"), tmp.path().join("l.npy"));
    kiln_data::write_npy(&features, DType::F32, &[4, 2], &[0u8; 32]).unwrap();
    kiln_data::write_npy(&labels, DType::I64, &[4], &[0u8; 32]).unwrap();
    let source = PrepareSource::Npy { features, labels };
    let options = PrepareOptions {
        shard_samples: 2,
        format: ShardFormat::Npy,
        integer_features: false,
    };
    let dir = tmp.path().join("data");
    kiln_data::prepare(&source, &dir, &options).unwrap();
    let path = dir.join(kiln_data::MANIFEST_FILE);
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest["shards"][0]["samples"] = serde_json::json!(u64::MAX);
    manifest["shards"][1]["samples"] = serde_json::json!(1);
    std::fs::write(&path, manifest.to_string()).unwrap();
    let e = ShardedDataset::open(&dir).unwrap_err().to_string();
    assert!(e.contains("add up to more than"), "{e}");
}

#[test]
fn a_tiff_declaring_more_pixels_than_its_file_holds_is_an_error_not_an_allocation() {
    // kiln-fuzz's tiff target: an 834-byte file whose headers declare a stack of about 151
    // million values; reading it asked for 604 MB at once.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("stack.tif");
    std::fs::write(&path, input("tiff-dimensions-past-the-file.tif")).unwrap();
    let e = kiln_data::tiff_stack::read_stack(&path)
        .unwrap_err()
        .to_string();
    assert!(e.contains("more values than a file of 834 bytes"), "{e}");
}

//! TIFF stacks: `tiff_stack::stack_layout` (pages' headers, OME-XML and ImageJ descriptions)
//! and `read_stack` (every page decoded into one array), as `kiln infer --sliding-window` reads
//! a volume. Seeds: OME-TIFFs kiln writes (`write_stack`), and plain, RGB, ImageJ and
//! compressed stacks as microscopes write them.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use kiln_data::DType;
use kiln_data::tiff_stack::{read_stack, stack_layout, write_stack};
use tiff::encoder::{Compression, DeflateLevel, TiffEncoder, colortype};
use tiff::tags::Tag;

use super::{read, text, write};
use crate::{Grammar, Harness, Outcome, Outcomes, Target};

pub const TARGET: Target = Target {
    name: "tiff",
    about: "TIFF bytes → tiff_stack::stack_layout and read_stack (OME-XML and ImageJ \
            descriptions, pages into one array)",
    grammar: Grammar::Text,
    dictionary: &[
        b"II*\x00",
        b"MM\x00*",
        b"SizeC=\"",
        b"SizeZ=\"",
        b"SizeT=\"",
        b"DimensionOrder=\"",
        b"XYZCT",
        b"XYCZT",
        b"<Pixels ",
        b"<OME",
        b"ImageJ=",
        b"channels=",
        b"slices=",
        b"frames=",
        b"\x00\x01\x04\x00\x01\x00\x00\x00",
        b"\x01\x01\x04\x00\x01\x00\x00\x00",
        b"\xff\xff\xff\x7f",
        b"4294967295",
        b"9223372036854775809",
    ],
    fixup: None,
    make,
    selftest: false,
};

/// A multi-page TIFF written by the `tiff` crate: `pages` grey 8-bit pages of `w`×`h`, the
/// first described by `description`, compressed with `compression`.
fn grey_pages(
    pages: usize,
    (w, h): (u32, u32),
    description: Option<&str>,
    compression: Compression,
) -> Result<Vec<u8>, String> {
    let mut out = Cursor::new(vec![]);
    let mut enc = TiffEncoder::new(&mut out)
        .map_err(text)?
        .with_compression(compression);
    for k in 0..pages {
        let data: Vec<u8> = (0..w * h).map(|i| (i as usize + k) as u8).collect();
        let mut image = enc.new_image::<colortype::Gray8>(w, h).map_err(text)?;
        if let Some(d) = description.filter(|_| k == 0) {
            image
                .encoder()
                .write_tag(Tag::ImageDescription, d)
                .map_err(text)?;
        }
        image.write_data(&data).map_err(text)?;
    }
    Ok(out.into_inner())
}

/// Two RGB pages, as a camera writes them.
fn rgb_pages() -> Result<Vec<u8>, String> {
    let mut out = Cursor::new(vec![]);
    let mut enc = TiffEncoder::new(&mut out).map_err(text)?;
    for k in 0..2u8 {
        let data: Vec<u8> = (0..4 * 3 * 3).map(|i| i as u8 ^ k).collect();
        enc.write_image::<colortype::RGB8>(4, 3, &data)
            .map_err(text)?;
    }
    Ok(out.into_inner())
}

/// OME-TIFFs kiln writes: `(dtype, channels, spatial)`.
fn written_by_kiln(scratch: &Path) -> Result<Vec<Vec<u8>>, String> {
    let mut seeds = vec![];
    for (k, (dtype, channels, spatial)) in [
        (DType::U8, 2, vec![3, 4]),
        (DType::F32, 1, vec![2, 3, 2]),
        (DType::I16, 3, vec![2, 2, 2]),
    ]
    .into_iter()
    .enumerate()
    {
        let n = channels * spatial.iter().product::<usize>();
        let data: Vec<u8> = (0..n * dtype.size()).map(|i| (i % 7) as u8).collect();
        let path = scratch.join(format!("seed-{k}.tif"));
        write_stack(&path, dtype, channels, &spatial, &data).map_err(text)?;
        seeds.push(read(&path)?);
    }
    Ok(seeds)
}

struct Tiff {
    file: PathBuf,
    seeds: Vec<Vec<u8>>,
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    let mut seeds = written_by_kiln(scratch)?;
    let imagej = "ImageJ=1.54f\nimages=4\nchannels=2\nslices=2\nhyperstack=true\n";
    seeds.push(grey_pages(
        4,
        (3, 2),
        Some(imagej),
        Compression::Uncompressed,
    )?);
    seeds.push(grey_pages(3, (5, 4), None, Compression::Lzw)?);
    seeds.push(grey_pages(
        2,
        (4, 4),
        None,
        Compression::Deflate(DeflateLevel::Fast),
    )?);
    seeds.push(grey_pages(2, (4, 4), None, Compression::Packbits)?);
    seeds.push(rgb_pages()?);
    Ok(Box::new(Tiff {
        file: scratch.join("stack.tif"),
        seeds,
    }))
}

impl Harness for Tiff {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        write(&self.file, input)?;
        let mut o = Outcomes::default();
        o.add(stack_layout(&self.file).map(|l| l.shape));
        o.add(read_stack(&self.file).map(|(shape, values)| (shape, values.len())));
        o.finish()
    }
}

//! TIFF stacks, microscopy's own format: a multi-page TIFF or OME-TIFF read as one array
//! `[C, *spatial]` (`[C, H, W]` for one plane, `[C, D, H, W]` for several), and arrays written as
//! multi-page OME-TIFFs. Without OME metadata a page's samples (grey, or RGB's three) are the
//! channels and the pages the planes; an OME-TIFF's `Pixels` element (`SizeC`, `SizeZ`, `SizeT`,
//! `DimensionOrder`) says which page is which channel and plane. Through the `tiff` crate.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use tiff::decoder::{Decoder, DecodingResult};
use tiff::encoder::{TiffEncoder, colortype};
use tiff::tags::Tag;

use crate::{DType, DataError};

/// What a stack holds and where each page goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackLayout {
    /// `[C, H, W]` or `[C, D, H, W]`.
    pub shape: Vec<usize>,
    /// Samples per pixel of each page (its channels, without OME metadata).
    samples: usize,
    /// Each page's channel and plane, for a stack of one sample per pixel with OME metadata.
    ome: Option<Vec<(usize, usize)>>,
}

fn bad(path: &Path, message: impl std::fmt::Display) -> DataError {
    DataError::file(path, message.to_string())
}

fn open(path: &Path) -> Result<Decoder<BufReader<File>>, DataError> {
    let file = File::open(path).map_err(|e| bad(path, format!("cannot read: {e}")))?;
    Decoder::new(BufReader::new(file)).map_err(|e| bad(path, format!("not a readable TIFF: {e}")))
}

/// The stack's layout from its pages' headers, without decoding a pixel.
pub fn stack_layout(path: &Path) -> Result<StackLayout, DataError> {
    let mut d = open(path)?;
    let tiff = |e: tiff::TiffError| bad(path, e);
    let (w, h) = d.dimensions().map_err(tiff)?;
    let color = d.colortype().map_err(tiff)?;
    let samples = match color {
        tiff::ColorType::Gray(_) => 1,
        tiff::ColorType::GrayA(_) => 2,
        tiff::ColorType::RGB(_) => 3,
        tiff::ColorType::RGBA(_) => 4,
        other => {
            return Err(bad(
                path,
                format!("pages of {other:?}: kiln reads grey or RGB(A)"),
            ));
        }
    };
    let description = d
        .find_tag(Tag::ImageDescription)
        .map_err(tiff)?
        .map(|v| v.into_string())
        .transpose()
        .map_err(tiff)?;
    let mut pages = 1;
    while d.more_images() {
        d.next_image().map_err(tiff)?;
        pages += 1;
        if d.dimensions().map_err(tiff)? != (w, h) || d.colortype().map_err(tiff)? != color {
            return Err(bad(
                path,
                format!("page {pages} differs in size or type from the first"),
            ));
        }
    }
    let (h, w) = (h as usize, w as usize);
    let text = description.unwrap_or_default();
    let (channels, depth, ome) = if text.contains("<OME") && samples == 1 {
        let (c, z, order) = ome_pixels(path, &text, pages)?;
        (c, z, Some(ome_pages(c, z, &order)))
    } else if text.starts_with("ImageJ=") && samples == 1 {
        // An ImageJ hyperstack: channels vary fastest, then slices (XYCZT).
        let (c, z) = imagej_pixels(path, &text, pages)?;
        (c, z, Some(ome_pages(c, z, "XYCZT")))
    } else {
        (samples, pages, None)
    };
    let shape = match depth {
        1 => vec![channels, h, w],
        _ => vec![channels, depth, h, w],
    };
    Ok(StackLayout {
        shape,
        samples,
        ome,
    })
}

/// `SizeC`, `SizeZ` and `DimensionOrder` of an OME-XML description whose `SizeT` is 1 and whose
/// channels and planes are the file's `pages`.
fn ome_pixels(path: &Path, xml: &str, pages: usize) -> Result<(usize, usize, String), DataError> {
    let attr = |name: &str| -> Option<String> {
        let pixels = &xml[xml.find("<Pixels")?..];
        let pixels = &pixels[..pixels.find('>')?];
        // The attribute after any whitespace (a space, a tab or a line break).
        let at = pixels
            .match_indices(&format!("{name}=\""))
            .find(|(i, _)| pixels[..*i].ends_with(char::is_whitespace))?
            .0
            + name.len()
            + 2;
        Some(pixels[at..].split('"').next()?.to_owned())
    };
    let size = |name: &str| {
        attr(name)
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1)
    };
    let (c, z, t) = (size("SizeC"), size("SizeZ"), size("SizeT"));
    let order = attr("DimensionOrder").unwrap_or_else(|| "XYZCT".to_owned());
    if t != 1 || c * z != pages || order.len() != 5 || !order.starts_with("XY") {
        return Err(bad(
            path,
            format!(
                "its OME metadata says SizeC {c}, SizeZ {z}, SizeT {t}, DimensionOrder {order} \
                 over {pages} pages; kiln reads one time point, its channels and planes one page \
                 each"
            ),
        ));
    }
    Ok((c, z, order))
}

/// The channels and slices of an ImageJ hyperstack's description (`channels=2`, `slices=30`),
/// one frame.
fn imagej_pixels(path: &Path, text: &str, pages: usize) -> Result<(usize, usize), DataError> {
    let value = |name: &str| -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1)
    };
    let (c, frames) = (value("channels"), value("frames"));
    let z = match text.lines().any(|l| l.starts_with("slices=")) {
        true => value("slices"),
        false => pages / c.max(1),
    };
    if frames != 1 || c * z != pages {
        return Err(bad(
            path,
            format!(
                "its ImageJ description says {c} channels, {z} slices, {frames} frames over \
                 {pages} pages; kiln reads one frame, its channels and slices one page each"
            ),
        ));
    }
    Ok((c, z))
}

/// Each page's (channel, plane), the pages ordered as `order` says (its first letter after XY
/// varying fastest).
fn ome_pages(channels: usize, depth: usize, order: &str) -> Vec<(usize, usize)> {
    let z_first = order.find('Z') < order.find('C');
    let mut pages = vec![(0, 0); channels * depth];
    for c in 0..channels {
        for z in 0..depth {
            let page = if z_first {
                z + depth * c
            } else {
                c + channels * z
            };
            pages[page] = (c, z);
        }
    }
    pages
}

/// The whole stack as f32 values laid out as its [`StackLayout::shape`].
pub fn read_stack(path: &Path) -> Result<(Vec<usize>, Vec<f32>), DataError> {
    let layout = stack_layout(path)?;
    let [channels, rest @ ..] = layout.shape.as_slice() else {
        return Err(bad(path, "an empty stack"));
    };
    let plane: usize = rest[rest.len() - 2..].iter().product();
    let depth = if rest.len() == 3 { rest[0] } else { 1 };
    let mut out = vec![0f32; plausible_values(path, &layout.shape)?];
    let mut d = open(path)?;
    for page in 0..channels * depth / layout.ome.as_ref().map_or(*channels, |_| 1) {
        if page > 0 {
            d.next_image().map_err(|e| bad(path, e))?;
        }
        let values = page_values(d.read_image().map_err(|e| bad(path, e))?);
        if values.len() != plane * layout.samples {
            return Err(bad(
                path,
                format!(
                    "page {} decodes to {} values, not {plane} pixels × {} samples (kiln reads \
                     chunky pages of 8 bits or more: not planar or 1-bit ones)",
                    page + 1,
                    values.len(),
                    layout.samples
                ),
            ));
        }
        for (i, v) in values.into_iter().enumerate() {
            let (pixel, sample) = (i / layout.samples, i % layout.samples);
            let (c, z) = match &layout.ome {
                Some(pages) => pages[page],
                None => (sample, page),
            };
            out[(c * depth + z) * plane + pixel] = v;
        }
    }
    Ok((layout.shape, out))
}

/// The most decoded bytes one stored byte of a page can give: LZW's worst case (a 12-bit code
/// standing for up to 4096 bytes) bounds deflate's (about 1032) and PackBits' (64).
const MAX_EXPANSION: u64 = 4096;

/// The number of values of a stack of `shape`, where a file of its length can hold them: the
/// dimensions are the file's headers' to claim, so a header declaring more pixels than any
/// compression could have stored is an error, not an allocation.
fn plausible_values(path: &Path, shape: &[usize]) -> Result<usize, DataError> {
    let values = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let stored = std::fs::metadata(path)
        .map_err(|e| bad(path, format!("cannot read: {e}")))?
        .len();
    match values {
        Some(n) if (n as u64) <= stored.saturating_mul(MAX_EXPANSION) => Ok(n),
        _ => Err(bad(
            path,
            format!(
                "its headers declare a stack of shape {shape:?}, more values than a file of \
                 {stored} bytes can hold (at most {MAX_EXPANSION} decoded bytes per stored \
                 byte)"
            ),
        )),
    }
}

fn page_values(page: DecodingResult) -> Vec<f32> {
    match page {
        DecodingResult::U8(v) => v.into_iter().map(f32::from).collect(),
        DecodingResult::U16(v) => v.into_iter().map(f32::from).collect(),
        DecodingResult::U32(v) => v.into_iter().map(|x| x as f32).collect(),
        DecodingResult::U64(v) => v.into_iter().map(|x| x as f32).collect(),
        DecodingResult::I8(v) => v.into_iter().map(f32::from).collect(),
        DecodingResult::I16(v) => v.into_iter().map(f32::from).collect(),
        DecodingResult::I32(v) => v.into_iter().map(|x| x as f32).collect(),
        DecodingResult::I64(v) => v.into_iter().map(|x| x as f32).collect(),
        DecodingResult::F16(v) => v.into_iter().map(f32::from).collect(),
        DecodingResult::F32(v) => v,
        DecodingResult::F64(v) => v.into_iter().map(|x| x as f32).collect(),
    }
}

/// Writes `data` (`channels` × planes × `[H, W]`, of `dtype`, in the machine's byte order) as a
/// multi-page OME-TIFF at `path` (which must not exist): a page per channel and plane, planes
/// fastest (`XYZCT`). `spatial` is `[H, W]` or `[D, H, W]`.
pub fn write_stack(
    path: &Path,
    dtype: DType,
    channels: usize,
    spatial: &[usize],
    data: &[u8],
) -> Result<(), DataError> {
    let (depth, h, w) = match spatial {
        [h, w] => (1, *h, *w),
        [d, h, w] => (*d, *h, *w),
        _ => {
            return Err(bad(
                path,
                format!("a TIFF stack is 2-D or 3-D, not {spatial:?}"),
            ));
        }
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| bad(path, format!("cannot create (kiln never overwrites): {e}")))?;
    let mut enc = TiffEncoder::new(std::io::BufWriter::new(file)).map_err(|e| bad(path, e))?;
    let xml = ome_xml(dtype, channels, depth, h, w);
    let plane = h * w * dtype.size();
    for (k, page) in data.chunks_exact(plane).enumerate() {
        let description = (k == 0).then_some(xml.as_str());
        write_page(&mut enc, dtype, (w as u32, h as u32), page, description)
            .map_err(|e| bad(path, e))?;
    }
    Ok(())
}

type Encoder = TiffEncoder<std::io::BufWriter<File>>;

fn write_page(
    enc: &mut Encoder,
    dtype: DType,
    (w, h): (u32, u32),
    bytes: &[u8],
    description: Option<&str>,
) -> Result<(), String> {
    macro_rules! page {
        ($color:ty, $t:ty, $n:expr) => {{
            let values: Vec<$t> = bytes
                .chunks_exact($n)
                .map(|b| <$t>::from_ne_bytes(b.try_into().unwrap_or([0; $n])))
                .collect();
            let mut image = enc.new_image::<$color>(w, h).map_err(|e| e.to_string())?;
            if let Some(text) = description {
                image
                    .encoder()
                    .write_tag(Tag::ImageDescription, text)
                    .map_err(|e| e.to_string())?;
            }
            image.write_data(&values).map_err(|e| e.to_string())
        }};
    }
    match dtype {
        DType::U8 | DType::Bool => page!(colortype::Gray8, u8, 1),
        DType::I16 => page!(colortype::GrayI16, i16, 2),
        DType::I32 => page!(colortype::GrayI32, i32, 4),
        DType::F32 => page!(colortype::Gray32Float, f32, 4),
        other => Err(format!(
            "kiln writes TIFF pages of u8, i16, i32 or f32, not {other}"
        )),
    }
}

/// The OME-XML description of a stack: one image, `XYZCT`.
fn ome_xml(dtype: DType, channels: usize, depth: usize, h: usize, w: usize) -> String {
    let kind = match dtype {
        DType::U8 | DType::Bool => "uint8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        _ => "float",
    };
    let channel_elements: String = (0..channels)
        .map(|c| format!("<Channel ID=\"Channel:0:{c}\" SamplesPerPixel=\"1\"/>"))
        .collect();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><OME \
         xmlns=\"http://www.openmicroscopy.org/Schemas/OME/2016-06\"><Image ID=\"Image:0\">\
         <Pixels ID=\"Pixels:0\" DimensionOrder=\"XYZCT\" Type=\"{kind}\" SizeX=\"{w}\" \
         SizeY=\"{h}\" SizeZ=\"{depth}\" SizeC=\"{channels}\" SizeT=\"1\">{channel_elements}\
         <TiffData/></Pixels></Image></OME>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }

    /// An OME-TIFF written here reads back as the same array, 2-D and 3-D, float and bytes.
    #[test]
    fn stacks_round_trip_through_ome_tiff() {
        let tmp = tempfile::tempdir().unwrap();
        for (channels, spatial) in [
            (2usize, vec![3usize, 5, 4]),
            (3, vec![6, 7]),
            (1, vec![1, 2, 3]),
        ] {
            let n: usize = channels * spatial.iter().product::<usize>();
            let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let path = tmp
                .path()
                .join(format!("s{channels}-{}.tif", spatial.len()));
            write_stack(&path, DType::F32, channels, &spatial, &bytes_of(&values)).unwrap();
            let (shape, back) = read_stack(&path).unwrap();
            // One plane reads as [C, H, W].
            let planes = if spatial.len() == 3 { spatial[0] } else { 1 };
            let mut want = vec![channels];
            want.extend(&spatial[spatial.len() - 2..]);
            if planes > 1 {
                want.insert(1, planes);
            }
            assert_eq!(shape, want);
            assert_eq!(back, values);
            let e = write_stack(&path, DType::F32, channels, &spatial, &bytes_of(&values));
            assert!(e.unwrap_err().to_string().contains("never overwrites"));
        }
        let path = tmp.path().join("classes.tif");
        let classes: Vec<u8> = (0..24).map(|i| (i % 3) as u8).collect();
        write_stack(&path, DType::U8, 1, &[2, 3, 4], &classes).unwrap();
        let (shape, back) = read_stack(&path).unwrap();
        assert_eq!(shape, [1, 2, 3, 4]);
        assert_eq!(
            back,
            classes.iter().map(|&c| f32::from(c)).collect::<Vec<_>>()
        );
    }

    /// Plain TIFFs (no OME metadata): pages are planes, a page's samples its channels.
    #[test]
    fn plain_stacks_take_pages_as_planes_and_samples_as_channels() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("planes.tif");
        let mut enc = TiffEncoder::new(File::create(&path).unwrap()).unwrap();
        for z in 0..3u16 {
            let page: Vec<u16> = (0..6).map(|i| z * 100 + i).collect();
            enc.write_image::<colortype::Gray16>(3, 2, &page).unwrap();
        }
        drop(enc);
        let (shape, values) = read_stack(&path).unwrap();
        assert_eq!(shape, [1, 3, 2, 3]);
        assert_eq!(values[6..9], [100.0, 101.0, 102.0]);
        let path = tmp.path().join("rgb.tif");
        let mut enc = TiffEncoder::new(File::create(&path).unwrap()).unwrap();
        let rgb: Vec<u8> = (0..12).collect(); // 2 × 2 pixels, r g b each
        enc.write_image::<colortype::RGB8>(2, 2, &rgb).unwrap();
        drop(enc);
        let (shape, values) = read_stack(&path).unwrap();
        assert_eq!(shape, [3, 2, 2]);
        assert_eq!(values[..4], [0.0, 3.0, 6.0, 9.0], "red, pixel by pixel");
        assert_eq!(values[4..8], [1.0, 4.0, 7.0, 10.0], "green");
        let e = read_stack(&tmp.path().join("missing.tif")).unwrap_err();
        assert!(e.to_string().contains("cannot read"), "{e}");
    }

    #[test]
    fn ome_dimension_orders_place_each_page() {
        assert_eq!(
            ome_pages(2, 3, "XYZCT"),
            [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
        );
        assert_eq!(
            ome_pages(2, 3, "XYCZT"),
            [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
        );
        let xml = "<OME><Image><Pixels DimensionOrder=\"XYCZT\" SizeC=\"2\" SizeZ=\"3\" \
                   SizeT=\"1\"></Pixels></Image></OME>";
        let p = Path::new("x.tif");
        assert_eq!(ome_pixels(p, xml, 6).unwrap(), (2, 3, "XYCZT".to_owned()));
        let e = ome_pixels(p, &xml.replace("SizeT=\"1\"", "SizeT=\"4\""), 6).unwrap_err();
        assert!(e.to_string().contains("one time point"), "{e}");
        // Attributes after a line break or a tab count too.
        let spaced = xml.replace(" SizeC", "\n\tSizeC");
        assert_eq!(ome_pixels(p, &spaced, 6).unwrap().0, 2);
        let imagej = "ImageJ=1.54f\nimages=6\nchannels=2\nslices=3\nhyperstack=true\n";
        assert_eq!(imagej_pixels(p, imagej, 6).unwrap(), (2, 3));
        let e = imagej_pixels(p, &imagej.replace("slices=3", "slices=3\nframes=2"), 6);
        assert!(e.unwrap_err().to_string().contains("one frame"));
    }
}

//! A model file opened for the zip reader: its tail held in memory, the rest read buffered.
//!
//! The zip reader (zip 0.6, the version tch links) looks for the end-of-central-directory
//! record by seeking to each of the last 65,557 positions of the file and reading 4 bytes
//! there, and reads headers a field at a time. On a plain file each of those is a system call:
//! a damaged 26 KB archive cost 31,000 of them (25 ms), a file with no record 131,000. Served
//! from memory, the search costs none, and the rest of the file goes through a buffer.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

/// The part of a file where the zip reader looks for the end record: the record (22 bytes)
/// and the longest comment (64 KiB).
const TAIL: u64 = (64 << 10) + 22;

/// A file for [`zip::ZipArchive`]: reads and seeks like the file, with its last [`TAIL`] bytes
/// served from memory.
#[derive(Debug)]
pub struct ZipFile {
    head: BufReader<File>,
    /// Where `head` stands (it is moved only when a read needs it elsewhere).
    head_pos: u64,
    tail: Vec<u8>,
    tail_start: u64,
    pos: u64,
}

impl ZipFile {
    /// Opens `path`, reading its tail.
    pub fn open(path: &Path) -> io::Result<Self> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        let tail_start = len.saturating_sub(TAIL);
        file.seek(SeekFrom::Start(tail_start))?;
        let mut tail = Vec::new();
        (&mut file).take(TAIL).read_to_end(&mut tail)?;
        file.seek(SeekFrom::Start(0))?;
        Ok(Self {
            head: BufReader::new(file),
            head_pos: 0,
            tail,
            tail_start,
            pos: 0,
        })
    }

    /// The file's length as read (a file that changed under us is judged as it was read).
    fn len(&self) -> u64 {
        self.tail_start + self.tail.len() as u64
    }

    /// Whether the tail holds an end-of-central-directory signature: without one no zip reader
    /// finds an archive in the file.
    pub fn has_zip_end(&self) -> bool {
        self.tail.windows(4).any(|w| w == b"PK\x05\x06")
    }
}

impl Read for ZipFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.tail_start {
            let at = usize::try_from(self.pos - self.tail_start).unwrap_or(usize::MAX);
            let rest = self.tail.get(at..).unwrap_or(&[]);
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            self.pos += n as u64;
            return Ok(n);
        }
        if self.head_pos != self.pos {
            self.head.seek(SeekFrom::Start(self.pos))?;
            self.head_pos = self.pos;
        }
        let room = usize::try_from(self.tail_start - self.pos).unwrap_or(usize::MAX);
        let want = buf.len().min(room);
        let n = self.head.read(&mut buf[..want])?;
        self.pos += n as u64;
        self.head_pos = self.pos;
        Ok(n)
    }
}

impl Seek for ZipFile {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len().checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        let Some(target) = target else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a seek before the start of the file",
            ));
        };
        self.pos = target;
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `n` bytes at `at` through `r`, as many reads as it takes.
    fn read_at<R: Read + Seek>(r: &mut R, at: u64, n: usize) -> Vec<u8> {
        r.seek(SeekFrom::Start(at)).unwrap();
        let mut out = Vec::new();
        r.take(n as u64).read_to_end(&mut out).unwrap();
        out
    }

    /// Every read, at every kind of place (the head, the tail, across the boundary, past the
    /// end) and after every kind of seek, gives the file's own bytes.
    #[test]
    fn reads_give_the_files_bytes_wherever_they_fall() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 10, TAIL as usize, TAIL as usize + 5000, 300_000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
            let path = dir.path().join(format!("f{len}"));
            std::fs::write(&path, &bytes).unwrap();
            let mut z = ZipFile::open(&path).unwrap();
            let mut f = File::open(&path).unwrap();
            let places = [
                0,
                1,
                len / 3,
                len.saturating_sub(TAIL as usize + 3),
                len.saturating_sub(7),
            ];
            for at in places.into_iter().chain([len, len + 10]) {
                for n in [0, 1, 4, 100, 9000, 70_000] {
                    let at = at as u64;
                    assert_eq!(
                        read_at(&mut z, at, n),
                        read_at(&mut f, at, n),
                        "len {len} at {at} n {n}"
                    );
                }
            }
            if len >= 3 {
                assert_eq!(z.seek(SeekFrom::End(-3)).unwrap(), len as u64 - 3);
                assert_eq!(z.seek(SeekFrom::Current(1)).unwrap(), len as u64 - 2);
            }
            assert!(z.seek(SeekFrom::End(-(len as i64) - 1)).is_err());
        }
    }

    /// A zip archive read through it lists what it holds; the end record is found in the tail.
    #[test]
    fn the_zip_reader_reads_an_archive_through_it() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.zip");
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        let stored =
            zip::write::FileOptions::default().compression_method(zip::CompressionMethod::Stored);
        for (name, size) in [("a/data.pkl", 10), ("a/data/0", 200_000), ("a/version", 2)] {
            zip.start_file(name, stored).unwrap();
            zip.write_all(&vec![1u8; size]).unwrap();
        }
        zip.finish().unwrap();
        let z = ZipFile::open(&path).unwrap();
        assert!(z.has_zip_end());
        let mut archive = zip::ZipArchive::new(z).unwrap();
        let names: Vec<&str> = archive.file_names().collect();
        assert_eq!(names.len(), 3);
        let mut big = Vec::new();
        archive
            .by_name("a/data/0")
            .unwrap()
            .read_to_end(&mut big)
            .unwrap();
        assert_eq!(big, vec![1u8; 200_000]);
        std::fs::write(&path, b"not an archive").unwrap();
        assert!(!ZipFile::open(&path).unwrap().has_zip_end());
    }
}

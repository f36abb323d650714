//! The sliding window's stitch on the CPU: a batch of window outputs, weighted, added into the
//! running sums and the summed weights in one pass over the rows the batch covers, each row
//! zeroed when its first window reaches it and divided by its summed weights when its last has.

use tch::Tensor;

use crate::error::{Error, Result};
use crate::ffi;

/// For each window `i` of a batch: `sum[:, :, at_i..at_i + out] += weight · outs[i]` and
/// `count[:, :, at_i..] += weight`, each voxel's additions in window order.
///
/// `sum` is `[1, K, *spatial]` and `count` `[1, 1, *spatial]`, both contiguous; `outs` is
/// `[n, K, *out]` in any layout; `weight` is `[1, 1, *out]`, contiguous; `starts` holds each
/// window's start in `sum`, one per spatial dimension (2 or 3). All float32 on the CPU; a
/// window that does not fit inside `sum`, or that `rows` did not plan for, is an error, before
/// anything is written.
///
/// `rows` ([`Rows::new`]) knows how many windows are yet to reach each row of `sum` and `count`
/// (every position but the last dimension's): a row no window has reached yet holds anything,
/// and is zeroed when its first window does; once its last window has added, its sums are
/// divided by its summed weights (`sum /= count`, the blend). Rows no window reached are left
/// to [`Rows::finish_the_rest`].
pub fn blend_windows(
    sum: &Tensor,
    count: &Tensor,
    outs: &Tensor,
    weight: &Tensor,
    starts: &[Vec<i64>],
    rows: &mut Rows,
) -> Result<()> {
    let rank = sum.dim().saturating_sub(2);
    if let Some(bad) = starts.iter().find(|s| s.len() != rank) {
        return Err(invalid(format!(
            "a window start {bad:?} for sums of {:?}",
            sum.size()
        )));
    }
    let flat: Vec<i64> = starts.concat();
    let [s, c, o, w] = [sum, count, outs, weight].map(ffi::tensor_ptr);
    // SAFETY: live handles, a slice of `starts.len() * rank` starts and two of `rows.len()`
    // counts, borrowed for the call; the C++ side checks every shape, start and count before
    // it writes.
    ffi::check("blend windows", unsafe {
        ffi::kiln_blend_windows(
            s,
            c,
            o,
            w,
            flat.as_ptr(),
            starts.len(),
            rows.left.as_mut_ptr(),
            rows.planned.as_ptr(),
            rows.left.len(),
        )
    })
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument {
        op: "blend windows",
        message,
    }
}

/// The rows of the running sums (every position but the last dimension's), each with the
/// number of windows that reach it in the run and how many of them are yet to.
#[derive(Debug, Clone)]
pub struct Rows {
    planned: Vec<u32>,
    left: Vec<u32>,
}

impl Rows {
    /// The plan for sums of spatial size `spatial` and windows of size `out` starting at each
    /// of `starts` (every window of the run), none added yet; an error where a window does not
    /// fit.
    pub fn new(spatial: &[i64], out: &[i64], starts: &[Vec<i64>]) -> Result<Self> {
        let lead = spatial.len().saturating_sub(1);
        let rows: i64 = spatial[..lead].iter().product();
        let mut planned = vec![0u32; usize::try_from(rows).unwrap_or(0)];
        for (i, at) in starts.iter().enumerate() {
            let fits = at.len() == spatial.len()
                && out.len() == spatial.len()
                && (0..spatial.len()).all(|d| at[d] >= 0 && at[d] + out[d] <= spatial[d]);
            if !fits {
                return Err(invalid(format!(
                    "window {i} starts at {at:?}: {out:?} does not fit in {spatial:?}"
                )));
            }
            for_each_row(&spatial[..lead], &at[..lead], &out[..lead], |r| {
                planned[r] += 1
            });
        }
        let left = planned.clone();
        Ok(Rows { planned, left })
    }

    /// Zeroes the rows of `sum` and `count` that no window reached, and divides every row
    /// not yet divided (`sum /= count`): after this, `sum` holds the blend everywhere.
    pub fn finish_the_rest(&self, sum: &Tensor, count: &Tensor) -> Result<()> {
        let rows = |t: &Tensor| {
            let size = t.size();
            t.f_view([size[0], size[1], -1, *size.last().unwrap_or(&1)])
        };
        let finish = || -> std::result::Result<(), tch::TchError> {
            let (sums, counts) = (rows(sum)?, rows(count)?);
            let pending = self.planned.iter().zip(&self.left).enumerate();
            for (r, (&planned, &left)) in pending.filter(|(_, (p, l))| **p == 0 || **l != 0) {
                let (mut s, mut c) = (sums.f_select(2, r as i64)?, counts.f_select(2, r as i64)?);
                if left == planned {
                    let _ = (s.f_zero_()?, c.f_zero_()?);
                }
                let _ = s.f_div_(&c)?;
            }
            Ok(())
        };
        finish().map_err(|e| Error::from_tch("finish the rows no window completed", &e))
    }
}

/// Calls `each` with the flat index (row-major in `sizes`) of every position of the box of size
/// `len` at `at`.
fn for_each_row(sizes: &[i64], at: &[i64], len: &[i64], mut each: impl FnMut(usize)) {
    for k in 0..len.iter().product::<i64>() {
        let (mut rest, mut flat, mut stride) = (k, 0i64, 1i64);
        for d in (0..len.len()).rev() {
            flat += (at[d] + rest % len[d]) * stride;
            rest /= len[d];
            stride *= sizes[d];
        }
        each(flat as usize);
    }
}

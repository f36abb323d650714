//! The sliding window's stitch on the CPU: a batch of window outputs, weighted, added into the
//! running sums and the summed weights in one pass over the rows the batch covers, each row
//! zeroed when a window first reaches it.

use tch::Tensor;

use crate::error::{Error, Result};
use crate::ffi;

/// For each window `i` of a batch: `sum[:, :, at_i..at_i + out] += weight · outs[i]` and
/// `count[:, :, at_i..] += weight`, each voxel's additions in window order.
///
/// `sum` is `[1, K, *spatial]` and `count` `[1, 1, *spatial]`, both contiguous; `outs` is
/// `[n, K, *out]` in any layout; `weight` is `[1, 1, *out]`, contiguous; `starts` holds each
/// window's start in `sum`, one per spatial dimension (2 or 3). All float32 on the CPU; a
/// window that does not fit inside `sum` is an error, before anything is written.
///
/// `ready` has a flag per row of `sum` and `count` (every position but the last dimension's,
/// [`Rows::new`]): a row whose flag is 0 holds anything, and is zeroed (and flagged) when a window
/// first reaches it. Rows no window reached stay as they were: [`Rows::zero_the_rest`].
pub fn blend_windows(
    sum: &Tensor,
    count: &Tensor,
    outs: &Tensor,
    weight: &Tensor,
    starts: &[Vec<i64>],
    ready: &mut Rows,
) -> Result<()> {
    let rank = sum.dim().saturating_sub(2);
    if let Some(bad) = starts.iter().find(|s| s.len() != rank) {
        return Err(Error::InvalidArgument {
            op: "blend windows",
            message: format!("a window start {bad:?} for sums of {:?}", sum.size()),
        });
    }
    let flat: Vec<i64> = starts.concat();
    let [s, c, o, w] = [sum, count, outs, weight].map(ffi::tensor_ptr);
    // SAFETY: live handles and a slice of `starts.len() * rank` starts, borrowed for the call;
    // the C++ side checks every shape and start before it writes.
    ffi::check("blend windows", unsafe {
        ffi::kiln_blend_windows(
            s,
            c,
            o,
            w,
            flat.as_ptr(),
            starts.len(),
            ready.0.as_mut_ptr(),
            ready.0.len(),
        )
    })
}

/// Which rows of the sums [`blend_windows`] has zeroed.
#[derive(Debug, Clone)]
pub struct Rows(Vec<u8>);

impl Rows {
    /// None yet, for sums of spatial size `spatial`.
    pub fn new(spatial: &[i64]) -> Self {
        let rows = spatial
            .split_last()
            .map_or(0, |(_, r)| r.iter().product::<i64>());
        Rows(vec![0; usize::try_from(rows).unwrap_or(0)])
    }

    /// Zeroes the rows of `sums` (each `[1, K, *spatial]`) that no window reached.
    pub fn zero_the_rest(&self, sums: &[&Tensor]) -> Result<()> {
        let zero = |t: &Tensor, row: usize| -> std::result::Result<(), tch::TchError> {
            let size = t.size();
            let rows = t.f_view([size[0], size[1], -1, *size.last().unwrap_or(&1)])?;
            rows.f_select(2, row as i64)?.f_zero_().map(|_| ())
        };
        for (row, _) in self.0.iter().enumerate().filter(|(_, r)| **r == 0) {
            for t in sums {
                zero(t, row).map_err(|e| Error::from_tch("zero the rows no window reached", &e))?;
            }
        }
        Ok(())
    }
}

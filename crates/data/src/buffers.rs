//! Where the loader writes a batch's features: memory its consumer provides through
//! [`BatchBuffers`] (page-locked host memory a CUDA copy starts from, say), so each batch is
//! written once, where it is used. The data crate knows no tensors: a [`FeatureBuffer`] is a
//! run of `f32` and an opaque owner that keeps the memory alive, which the consumer takes back.

use std::any::Any;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The memory of one batch's features: `len` values owned by `owner`.
pub struct FeatureBuffer {
    ptr: NonNull<f32>,
    len: usize,
    owner: Box<dyn Any + Send>,
}

// SAFETY: the buffer is the only way to reach its memory (the contract of `from_raw_parts`),
// and its owner is `Send`; `&FeatureBuffer` only reads.
unsafe impl Send for FeatureBuffer {}
unsafe impl Sync for FeatureBuffer {}

impl FeatureBuffer {
    /// A buffer over `values`' own allocation.
    pub fn from_vec(mut values: Vec<f32>) -> Self {
        let (ptr, len) = (values.as_mut_ptr(), values.len());
        Self {
            // A Vec's pointer is never null (dangling but aligned when empty).
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
            // Moving the Vec into the box moves its header, not its heap block.
            owner: Box::new(values),
        }
    }

    /// A buffer over `len` values at `ptr`, kept alive by `owner`.
    ///
    /// # Safety
    /// `ptr` is non-null, aligned for `f32`, valid for reads and writes of `len` values for as
    /// long as `owner` lives, and nothing else reads or writes that memory meanwhile.
    pub unsafe fn from_raw_parts(ptr: *mut f32, len: usize, owner: Box<dyn Any + Send>) -> Self {
        Self {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
            owner,
        }
    }

    /// The owner the memory came with, to look at (is it the consumer's own kind of memory?).
    pub fn owner(&self) -> &(dyn Any + Send) {
        &*self.owner
    }

    /// The owner the memory came with (a `Vec<f32>` for [`FeatureBuffer::from_vec`]), for the
    /// consumer to use the memory as its own: the values stay where they are.
    pub fn into_owner(self) -> Box<dyn Any + Send> {
        self.owner
    }

    /// The values as a `Vec`, without a copy where the buffer is one.
    pub fn into_vec(self) -> Vec<f32> {
        let Self { ptr, len, owner } = self;
        match owner.downcast::<Vec<f32>>() {
            Ok(values) if values.as_ptr() == ptr.as_ptr() && values.len() == len => *values,
            // SAFETY: `ptr` is valid for `len` values while the owner lives, and `_owner`
            // holds it until the copy is made.
            _owner => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) }.to_vec(),
        }
    }
}

impl Deref for FeatureBuffer {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: `ptr` is valid for `len` values while `owner` lives (construction contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for FeatureBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl From<Vec<f32>> for FeatureBuffer {
    fn from(values: Vec<f32>) -> Self {
        Self::from_vec(values)
    }
}

impl Default for FeatureBuffer {
    fn default() -> Self {
        Self::from_vec(vec![])
    }
}

impl Clone for FeatureBuffer {
    /// A copy of the values, in a `Vec`.
    fn clone(&self) -> Self {
        Self::from_vec(self.to_vec())
    }
}

impl PartialEq for FeatureBuffer {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for FeatureBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureBuffer")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Hands the loader the memory each batch's features go into; called on the loader's worker
/// threads (or the consumer's, without workers).
pub trait BatchBuffers: Send + Sync {
    /// A buffer of `len` values; the loader overwrites every one of them.
    fn features(&self, len: usize) -> FeatureBuffer;
}

/// Ordinary heap memory, one allocation per batch: the loader's default.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeapBuffers;

impl BatchBuffers for HeapBuffers {
    fn features(&self, len: usize) -> FeatureBuffer {
        FeatureBuffer::from_vec(vec![0.0; len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vec_buffer_keeps_its_allocation_and_gives_it_back() {
        let values = vec![1.0f32, 2.0, 3.0];
        let at = values.as_ptr();
        let mut buffer = FeatureBuffer::from(values);
        buffer[1] = 5.0;
        assert_eq!(&*buffer, &[1.0, 5.0, 3.0]);
        assert_eq!(buffer.clone(), buffer);
        let back = buffer.into_vec();
        assert_eq!(back.as_ptr(), at, "no copy");
        assert_eq!(back, [1.0, 5.0, 3.0]);
        assert!(FeatureBuffer::default().is_empty());
    }

    #[test]
    fn a_buffer_over_foreign_memory_writes_through_and_returns_its_owner() {
        let mut block = Box::new([0f32; 4]);
        let ptr = block.as_mut_ptr();
        // SAFETY: `ptr` points into `block`, which the buffer owns from here on.
        let mut buffer = unsafe { FeatureBuffer::from_raw_parts(ptr, 4, Box::new(block)) };
        buffer.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(buffer.clone().into_vec(), [1.0, 2.0, 3.0, 4.0]);
        let owner = buffer.into_owner().downcast::<Box<[f32; 4]>>().unwrap();
        assert_eq!(**owner, [1.0, 2.0, 3.0, 4.0]);
    }
}

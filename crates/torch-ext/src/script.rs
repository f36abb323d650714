//! Facts about a saved TorchScript module that tch does not expose: whether it was saved in
//! training mode, whether it has a given method, how many parameters it registers, and what its
//! `forward` takes.

use std::ffi::{CStr, CString};
use std::path::Path;

use crate::error::{Error, Result};
use crate::ffi;

/// What [`inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptFacts {
    /// The module was saved in training mode (`model.train()` before scripting).
    pub training: bool,
    /// The module has the method asked about.
    pub has_method: bool,
    /// Parameter tensors the module (with its submodules) registers.
    pub parameters: i64,
    /// The arguments of its `forward`, after `self`, in order.
    pub forward_args: Vec<ForwardArg>,
}

/// One argument of a TorchScript `forward`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardArg {
    pub name: String,
    /// Its type as TorchScript writes it: `Tensor`, `Dict[str, Tensor]`, `Optional[Tensor]`.
    pub type_name: String,
    /// It has a default value.
    pub has_default: bool,
}

/// Loads the TorchScript file `path` on the CPU and reports its mode, whether it has `method`,
/// and its parameter count. A file that is not TorchScript is an error with libtorch's reason.
pub fn inspect(path: &Path, method: &str) -> Result<ScriptFacts> {
    let text = |what: &str, s: &str| {
        CString::new(s).map_err(|_| Error::Torch {
            op: "inspect TorchScript",
            kind: crate::ErrorKind::InvalidArgument,
            message: format!("the {what} contains a NUL byte"),
        })
    };
    let c_path = text("path", &path.to_string_lossy())?;
    let c_method = text("method name", method)?;
    let mut facts = ScriptFacts {
        training: false,
        has_method: false,
        parameters: 0,
        forward_args: vec![],
    };
    let mut args: *mut std::ffi::c_char = std::ptr::null_mut();
    // SAFETY: both strings live across the call; the out-pointers are valid locals.
    ffi::check("load TorchScript", unsafe {
        ffi::kiln_script_inspect(
            c_path.as_ptr(),
            c_method.as_ptr(),
            &mut facts.training,
            &mut facts.has_method,
            &mut facts.parameters,
            &mut args,
        )
    })?;
    // SAFETY: non-null on success, NUL-terminated, malloc'd by the C side; freed once after
    // copying.
    let text = unsafe { CStr::from_ptr(args) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: as above.
    unsafe { ffi::kiln_free_string(args) };
    facts.forward_args = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.split('\t');
            Some(ForwardArg {
                name: parts.next()?.to_owned(),
                type_name: parts.next()?.to_owned(),
                has_default: parts.next()? == "1",
            })
        })
        .collect();
    Ok(facts)
}

//! The error every fallible call returns: the library's status and its message.
use std::ffi::CStr;
use std::fmt;

use sparsek_sys as sys;

/// What kind of failure (the C API's `sparsek_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Bad shape, pointer, index, dtype...: the message names the argument and the value.
    InvalidArgument,
    /// Valid input that no (chosen) variant can run.
    Unsupported,
    /// A CUDA, cuBLAS or cuSPARSE call failed; the message carries its text.
    CudaError,
    /// A GPU was needed and none answered.
    NoDevice,
    /// Tuning-cache or file problems.
    IoError,
    /// A bug in sparsek.
    Internal,
    /// An NCCL call failed; the message names the call and carries NCCL's text.
    NcclError,
    /// A status this crate does not know (a newer library), with its number.
    Other(i32),
}

impl Status {
    pub(crate) fn from_raw(s: sys::sparsek_status) -> Status {
        match s {
            sys::SPARSEK_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::SPARSEK_UNSUPPORTED => Status::Unsupported,
            sys::SPARSEK_CUDA_ERROR => Status::CudaError,
            sys::SPARSEK_NO_DEVICE => Status::NoDevice,
            sys::SPARSEK_IO_ERROR => Status::IoError,
            sys::SPARSEK_INTERNAL => Status::Internal,
            sys::SPARSEK_NCCL_ERROR => Status::NcclError,
            other => Status::Other(other),
        }
    }
}

/// A failed call: the status and the library's message (which names the argument and the value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    pub(crate) fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }
    /// A bad argument found by this crate before calling the library (lengths of slices).
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidArgument, message)
    }
    pub fn status(&self) -> Status {
        self.status
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Turns a status into a `Result`, taking this thread's last-error text on failure.
pub(crate) fn check(status: sys::sparsek_status) -> Result<()> {
    if status == sys::SPARSEK_OK {
        return Ok(());
    }
    // SAFETY: sparsek_last_error returns a NUL-terminated thread-local string that stays valid
    // until the next call on this thread; it is copied at once.
    let message = unsafe { CStr::from_ptr(sys::sparsek_last_error()) }.to_string_lossy().into_owned();
    Err(Error::new(Status::from_raw(status), message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_library_status_has_its_variant() {
        // The numbers are sparsek.h's; the library names each one (a number the crate had no
        // constant for would read "unknown status").
        let named = [
            (sys::SPARSEK_INVALID_ARGUMENT, Status::InvalidArgument, "invalid argument"),
            (sys::SPARSEK_UNSUPPORTED, Status::Unsupported, "unsupported"),
            (sys::SPARSEK_CUDA_ERROR, Status::CudaError, "CUDA error"),
            (sys::SPARSEK_NO_DEVICE, Status::NoDevice, "no CUDA device"),
            (sys::SPARSEK_IO_ERROR, Status::IoError, "I/O error"),
            (sys::SPARSEK_INTERNAL, Status::Internal, "internal error"),
            (sys::SPARSEK_NCCL_ERROR, Status::NcclError, "NCCL error"),
        ];
        for (raw, status, text) in named {
            assert_eq!(Status::from_raw(raw), status);
            // SAFETY: sparsek_status_string returns a static NUL-terminated string for any int.
            let name = unsafe { CStr::from_ptr(sys::sparsek_status_string(raw)) };
            assert_eq!(name.to_str().unwrap(), text, "status {raw}");
        }
        assert_eq!(Status::from_raw(sys::SPARSEK_NCCL_ERROR + 1), Status::Other(sys::SPARSEK_NCCL_ERROR + 1));
    }
}

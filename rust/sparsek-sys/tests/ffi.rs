//! The declarations link against libsparsek and behave as sparsek.h says.
use sparsek_sys::*;
use std::ffi::CStr;

#[test]
fn links_and_reports_a_version() {
    let v = unsafe { CStr::from_ptr(sparsek_version()) }.to_str().unwrap();
    assert_eq!(v, env!("CARGO_PKG_VERSION"), "the crate follows include/sparsek/version.h");
}

#[test]
fn null_argument_is_named() {
    let s = unsafe { sparsek_bsr_validate(std::ptr::null()) };
    assert_eq!(s, SPARSEK_INVALID_ARGUMENT);
    let msg = unsafe { CStr::from_ptr(sparsek_last_error()) }.to_string_lossy();
    assert!(msg.contains("argument 'a' is NULL"), "message {msg:?}");
    let name = unsafe { CStr::from_ptr(sparsek_status_string(s)) }.to_string_lossy();
    assert_eq!(name, "invalid argument");
}

#[test]
fn struct_sizes_match_the_c_layout() {
    // sparsek_bsr: 2 x i64, 2 x i32, i64, 3 pointers, 2 enums (int), the scales pointer = 72 bytes
    // on LP64.
    assert_eq!(std::mem::size_of::<sparsek_bsr>(), 72);
    // sparsek_dense: pointer, 3 x i64, 3 enums (+4 padding), the scales pointer, scale_group (+4) = 64.
    assert_eq!(std::mem::size_of::<sparsek_dense>(), 64);
    assert_eq!(std::mem::size_of::<sparsek_gemm_args>(), 16 + 72 + 3 * 64);
    assert_eq!(std::mem::offset_of!(sparsek_bsr, scales), 64);
    assert_eq!(std::mem::offset_of!(sparsek_dense, scales), 48);
    assert_eq!(std::mem::offset_of!(sparsek_dense, scale_group), 56);
}

//! Lets this crate's own tests (unit and integration) and examples find libsparsek at run time:
//! sparsek-sys found the library (DEP_SPARSEK_LIBDIR) and its directory goes into their RUNPATH.
//! (`rustc-link-arg` reaches this package's own link steps only, never a dependent's.) A program of yours that
//! uses the crate needs libsparsek on its loader path (an installed tree, LD_LIBRARY_PATH, or
//! its own rpath).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_SPARSEK_LIBDIR");
    if let Ok(dir) = std::env::var("DEP_SPARSEK_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}

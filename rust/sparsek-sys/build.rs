//! Finds libsparsek and tells cargo to link it. Looked for, in order:
//!
//! 1. `SPARSEK_DIR`: an install prefix (`lib/libsparsek.so`) or a CMake build directory;
//! 2. `pkg-config sparsek` (an installed tree on `PKG_CONFIG_PATH`);
//! 3. this repository's CMake build tree (`build/` beside `rust/`).
//!
//! The directory found goes into the run-time search path of this crate's tests, and is passed
//! on to dependent build scripts as `DEP_SPARSEK_LIBDIR` so that they can do the same.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const LIB: &str = "libsparsek.so";

fn lib_dir_under(root: &Path) -> Option<PathBuf> {
    ["", "lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"]
        .iter()
        .map(|sub| root.join(sub))
        .find(|dir| dir.join(LIB).exists())
}

fn from_pkg_config() -> Option<PathBuf> {
    let out = Command::new("pkg-config")
        .args(["--variable=libdir", "sparsek"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if dir.join(LIB).exists() {
        Some(dir)
    } else {
        None
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=SPARSEK_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=build.rs");

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let repo_build = manifest.join("../../build");
    let found = match env::var_os("SPARSEK_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            match lib_dir_under(&dir) {
                Some(lib) => lib,
                None => panic!(
                    "SPARSEK_DIR={}: no {} there nor in its lib/ (give an install prefix or a CMake build directory)",
                    dir.display(),
                    LIB
                ),
            }
        }
        None => match from_pkg_config().or_else(|| lib_dir_under(&repo_build)) {
            Some(lib) => lib,
            None => panic!(
                "libsparsek not found: set SPARSEK_DIR to an install prefix or a CMake build directory, \
                 or put sparsek.pc on PKG_CONFIG_PATH, or build the library in {} first (make build)",
                repo_build.display()
            ),
        },
    };
    let found = found.canonicalize().unwrap_or(found);
    println!("cargo:rerun-if-changed={}", found.join(LIB).display());
    println!("cargo:rustc-link-search=native={}", found.display());
    println!("cargo:rustc-link-lib=dylib=sparsek");
    println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{}", found.display());
    println!("cargo:libdir={}", found.display());
}

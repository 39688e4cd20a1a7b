//! What roce-xdp's drop-in C libraries (`libibverbs.so.1`, the `libmlx5.so.1` and
//! `libefa.so.1` stubs, `librdmacm.so.1`) share, and their layout tests' C probe ([`probe`]).
//!
//! Every rdma-core program is linked `BIND_NOW` against versioned symbols
//! (`ibv_reg_mr@IBVERBS_1.1`), so each export must carry its version node as the default
//! (`@@`) version. rustc's own version script lists `#[no_mangle]` functions as unversioned,
//! and a second version script cannot override it, so [`export!`] defines the symbol in
//! assembly as a jump to the Rust function and binds it with `.symver`. The library's build
//! script still passes a version script that defines the nodes and their order.

pub mod abi;
pub mod probe;
pub mod unsupported;

/// Exports `$name` with default version `$version`, as a jump to the `extern "C"` function
/// `$f` (which must have the C signature callers expect of `$name`). `"prefix" + name`
/// exports `prefixname` (for names made from another list's).
#[macro_export]
macro_rules! export {
    ($name:literal @ $version:literal => $f:path) => {
        $crate::export!(@emit $name, $version, $f);
    };
    ($prefix:literal + $name:ident @ $version:literal => $f:path) => {
        $crate::export!(@emit concat!($prefix, stringify!($name)), $version, $f);
    };
    (@emit $name:expr, $version:expr, $f:path) => {
        ::core::arch::global_asm!(
            ".pushsection .text",
            concat!(".globl ", $name),
            concat!(".type ", $name, ",@function"),
            concat!($name, ":"),
            "jmp {f}",
            concat!(".size ", $name, ", .-", $name),
            concat!(".symver ", $name, ", ", $name, "@@", $version),
            ".popsection",
            f = sym $f,
        );
    };
}

extern "C" {
    fn __errno_location() -> *mut core::ffi::c_int;
}

/// Sets the calling thread's `errno`, as C callers read it after a failed call.
pub fn set_errno(code: i32) {
    // SAFETY: glibc's `__errno_location` returns a valid pointer to the calling thread's
    // errno for the thread's whole life.
    unsafe { *__errno_location() = code };
}

/// The calling thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: as in `set_errno`.
    unsafe { *__errno_location() }
}

/// `EOPNOTSUPP` on Linux.
pub const EOPNOTSUPP: i32 = 95;

/// `ENOSYS` on Linux.
pub const ENOSYS: i32 = 38;

/// Passes the version script `map` (relative to the package) and the SONAME `soname` to the
/// linker of the package's cdylib; for build scripts.
pub fn link_cdylib(map: &str, soname: &str) {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    println!("cargo:rerun-if-changed={map}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/{map}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    // Callers bind every symbol at load; so do we, for our own dependencies.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
}

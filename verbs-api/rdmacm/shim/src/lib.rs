//! Our `librdmacm.so.1`: every symbol of rdma-core 44's librdmacm (with its version node),
//! each a jump to its implementation inside our `libibverbs.so.1`, which exports it as
//! `roce_NAME@ROCE_RDMACM_PRIVATE` (the `roce-rdmacm` crate, linked there). This library
//! holds no Rust state: a process has one `roce-verbs` (one copy of its types, statics and
//! engine), and the two libraries meet only through rdma_cma.h's C ABI.
//!
//! Each symbol is a few instructions of assembly, so nothing here knows a signature: the
//! first call finds the implementation (`dlopen` of `libibverbs.so.1`, then `dlvsym`) with
//! the caller's argument registers saved, stores it in the symbol's [`Slot`], and jumps
//! there; later calls jump at once. rdma_cma.h's calls take at most six integer or pointer
//! arguments and none is variadic, so the six argument registers are all there is to keep.
//! When the libibverbs found is not ours, each call fails as its C type fails (-1 or NULL,
//! errno `ENOSYS`) and says why on stderr once.

use core::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Where one symbol jumps: its implementation once found, 0 before the first call.
#[repr(C)]
struct Slot {
    /// Read by the symbol's assembly: the first field.
    target: AtomicUsize,
    /// The private export's name, NUL-terminated.
    name: &'static [u8],
    /// What to run when our libibverbs is not there.
    fallback: extern "C" fn() -> isize,
}

const ENOSYS: c_int = 38;

/// The implementations' library: ours, loaded once (a program may link only this library).
fn libibverbs() -> Option<usize> {
    static HANDLE: OnceLock<Option<usize>> = OnceLock::new();
    *HANDLE.get_or_init(|| {
        // SAFETY: a NUL-terminated name; the handle is kept for the life of the process.
        let handle = unsafe {
            libc::dlopen(
                c"libibverbs.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_GLOBAL,
            )
        };
        (!handle.is_null()).then_some(handle as usize)
    })
}

/// Says once on stderr why the calls fail.
fn complain(name: &[u8]) {
    static SAID: OnceLock<()> = OnceLock::new();
    SAID.get_or_init(|| {
        let name = String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name));
        eprintln!(
            "librdmacm.so.1 (roce-xdp): no {name}@ROCE_RDMACM_PRIVATE in libibverbs.so.1: \
             rdma_cm calls fail with ENOSYS (run the program with roce-xdp's libibverbs.so.1, \
             as `roce exec` does)"
        );
    });
}

/// Finds `slot`'s implementation (or its fallback) and stores it; called by a symbol's
/// assembly on its first call.
extern "C" fn resolve(slot: &Slot) {
    let found = libibverbs().map_or(core::ptr::null_mut(), |handle| {
        // SAFETY: a live handle, and NUL-terminated names.
        unsafe {
            libc::dlvsym(
                handle as *mut c_void,
                slot.name.as_ptr().cast::<c_char>(),
                c"ROCE_RDMACM_PRIVATE".as_ptr(),
            )
        }
    });
    let target = if found.is_null() {
        complain(slot.name);
        slot.fallback as usize
    } else {
        found as usize
    };
    slot.target.store(target, Ordering::Release);
}

fn set_errno(code: c_int) {
    // SAFETY: glibc's `__errno_location` points to the calling thread's errno.
    unsafe { *libc::__errno_location() = code };
}

/// The fallback of a call returning an `int` (or `ssize_t`, `off_t`: the full register).
extern "C" fn fail_int() -> isize {
    set_errno(ENOSYS);
    -1
}

/// The fallback of a call returning a pointer.
extern "C" fn fail_ptr() -> isize {
    set_errno(ENOSYS);
    0
}

macro_rules! fallback {
    (int) => {
        fail_int
    };
    (ptr) => {
        fail_ptr
    };
}

/// Defines `$name` with default version `$version` as a jump through its slot.
macro_rules! forward {
    ($name:ident @ $version:literal => $entry:path, $returns:ident) => {
        #[allow(non_upper_case_globals)]
        static $name: Slot = Slot {
            target: AtomicUsize::new(0),
            name: concat!("roce_", stringify!($name), "\0").as_bytes(),
            fallback: fallback!($returns),
        };
        core::arch::global_asm!(
            ".pushsection .text",
            concat!(".globl ", stringify!($name)),
            concat!(".type ", stringify!($name), ",@function"),
            concat!(stringify!($name), ":"),
            "mov rax, qword ptr [rip + {slot}]",
            "test rax, rax",
            "jz 2f",
            "jmp rax",
            // First call: keep the six argument registers (with the return address, 56
            // bytes: 8 more realign the stack for the call), find the target, jump there.
            "2:",
            "push rdi",
            "push rsi",
            "push rdx",
            "push rcx",
            "push r8",
            "push r9",
            "sub rsp, 8",
            "lea rdi, [rip + {slot}]",
            "call {resolve}",
            "add rsp, 8",
            "pop r9",
            "pop r8",
            "pop rcx",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "jmp qword ptr [rip + {slot}]",
            concat!(".size ", stringify!($name), ", .-", stringify!($name)),
            concat!(".symver ", stringify!($name), ", ", stringify!($name), "@@", $version),
            ".popsection",
            slot = sym $name,
            resolve = sym resolve,
        );
    };
}

roce_rdmacm::for_each_symbol!(forward);

//! How failures reach the program: errno, and a line on stderr with `ROCE_LOG` set.

/// Says on stderr why a call failed, when `ROCE_LOG` is set: C programs only see errno.
pub(crate) fn log_failure(call: &str, why: &dyn std::fmt::Display) {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ENABLED.get_or_init(|| std::env::var_os("ROCE_LOG").is_some()) {
        eprintln!("librdmacm (roce-xdp): {call}: {why}");
    }
}

/// rdma-core's errno for a `roce-verbs` error, said on stderr with `ROCE_LOG`.
pub(crate) fn fail(call: &str, error: &roce_verbs::Error) -> core::ffi::c_int {
    use roce_verbs::Error;
    log_failure(call, error);
    match error {
        Error::Io(error) => error.raw_os_error().unwrap_or(5),
        Error::Unsupported(_) => roce_cabi::EOPNOTSUPP,
        Error::TimedOut => 110,
        Error::NoNeighbour(_) | Error::NoNeighbour6(_) => 113,
        Error::EngineFailed(_) | Error::Poisoned => 5,
        _ => 22,
    }
}

/// The calling thread's errno (what a libibverbs call left).
pub(crate) fn errno() -> core::ffi::c_int {
    roce_cabi::errno()
}

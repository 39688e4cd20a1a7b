//! The Linux errno values rdma-core returns for refused verbs calls.

/// `EFAULT`.
pub const EFAULT: i32 = 14;
/// `EBUSY`.
pub const EBUSY: i32 = 16;
/// `ENOMEM`.
pub const ENOMEM: i32 = 12;
/// `EINVAL`.
pub const EINVAL: i32 = 22;

//! rdma-core's errno values for what `roce-verbs` and the transport refuse.

/// rdma-core's errno for a `roce-verbs` error.
pub(crate) fn errno_of(error: &roce_verbs::Error) -> i32 {
    use roce_verbs::Error;
    const EINVAL: i32 = 22;
    match error {
        Error::Io(error) => error.raw_os_error().unwrap_or(5),
        Error::Mr(_) | Error::ModifyQp(_) | Error::CreateQp(_) => EINVAL,
        Error::Post(error) => post_errno(error),
        Error::Srq(error) => error.errno(),
        Error::TagMatching(error) => error.errno(),
        Error::Mcast(error) => error.errno(),
        Error::Unsupported(_) => roce_cabi::EOPNOTSUPP,
        Error::TimedOut => 110,
        Error::NoNeighbour(_) | Error::NoNeighbour6(_) => 113,
        Error::EngineFailed(_) | Error::Poisoned => 5,
        _ => EINVAL,
    }
}

/// `ibv_post_send`'s errno: `ENOMEM` for a full queue (as providers return), else `EINVAL`.
fn post_errno(error: &roce_transport::qp::PostError) -> i32 {
    match error {
        roce_transport::qp::PostError::QueueFull => 12,
        _ => 22,
    }
}

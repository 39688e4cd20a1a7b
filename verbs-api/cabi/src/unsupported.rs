//! The entry points that `export!` binds to what a library does not do: each fails the way
//! rdma-core's callers check for a call of its return type.

use core::ffi::c_void;

use crate::{set_errno, ENOSYS, EOPNOTSUPP};

/// For calls returning an object: NULL, errno `EOPNOTSUPP`.
pub extern "C" fn null() -> *mut c_void {
    set_errno(EOPNOTSUPP);
    core::ptr::null_mut()
}

/// For calls returning an error number: `EOPNOTSUPP`.
pub extern "C" fn int() -> i32 {
    EOPNOTSUPP
}

/// -1 (as `int`, `ssize_t` or `off_t`: the full register) with errno `EOPNOTSUPP`.
pub extern "C" fn eopnotsupp() -> isize {
    set_errno(EOPNOTSUPP);
    -1
}

/// -1 (as [`eopnotsupp`]) with errno `ENOSYS`; NULL for the calls returning a pointer.
pub extern "C" fn enosys() -> isize {
    set_errno(ENOSYS);
    -1
}

/// For calls returning nothing.
pub extern "C" fn nothing() {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errno;

    #[test]
    fn each_fails_with_its_errno() {
        set_errno(0);
        assert!(null().is_null());
        assert_eq!(errno(), EOPNOTSUPP);
        assert_eq!(int(), EOPNOTSUPP);
        set_errno(0);
        assert_eq!(eopnotsupp(), -1);
        assert_eq!(errno(), EOPNOTSUPP);
        assert_eq!(enosys(), -1);
        assert_eq!(errno(), ENOSYS);
    }
}

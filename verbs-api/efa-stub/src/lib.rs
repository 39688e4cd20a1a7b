//! A stub `libefa.so.1`. perftest is linked `BIND_NOW` against libefa, so these symbols
//! must exist for it to load; no device of ours is an EFA device, so every call fails with
//! `EOPNOTSUPP` (NULL and errno for constructors, the error code for calls returning `int`).

use roce_cabi::export;
use roce_cabi::unsupported::{int as not_supported, null};

export!("efadv_create_driver_qp" @ "EFA_1.0" => null);
export!("efadv_create_qp_ex" @ "EFA_1.1" => null);
export!("efadv_query_ah" @ "EFA_1.1" => not_supported);
export!("efadv_query_device" @ "EFA_1.1" => not_supported);
export!("efadv_cq_from_ibv_cq_ex" @ "EFA_1.2" => null);
export!("efadv_create_cq" @ "EFA_1.2" => null);

//! A stub `libmlx5.so.1`. perftest and UCX are linked against libmlx5 (perftest
//! `BIND_NOW`), so these symbols must exist for them to load; no device of ours is an mlx5
//! device, so `mlx5dv_is_supported` answers false (UCX then takes plain verbs) and everything
//! else fails with `EOPNOTSUPP`: NULL and errno for constructors, the error code for calls
//! returning `int`, -1 and errno for those returning a count or a file descriptor.

use roce_cabi::export;
use roce_cabi::unsupported::{eopnotsupp as minus_one, int as not_supported, nothing, null};

extern "C" fn unsupported() -> bool {
    false
}

export!("mlx5dv_query_device" @ "MLX5_1.0" => not_supported);
export!("mlx5dv_create_cq" @ "MLX5_1.1" => null);
export!("mlx5dv_init_obj" @ "MLX5_1.2" => not_supported);
export!("mlx5dv_create_qp" @ "MLX5_1.3" => null);
export!("mlx5dv_get_clock_info" @ "MLX5_1.4" => not_supported);
export!("mlx5dv_create_flow" @ "MLX5_1.6" => null);
export!("mlx5dv_create_flow_matcher" @ "MLX5_1.6" => null);
export!("mlx5dv_destroy_flow_matcher" @ "MLX5_1.6" => not_supported);
export!("mlx5dv_create_flow_action_packet_reformat" @ "MLX5_1.7" => null);
export!("mlx5dv_devx_alloc_uar" @ "MLX5_1.7" => null);
export!("mlx5dv_devx_free_uar" @ "MLX5_1.7" => nothing);
export!("mlx5dv_devx_general_cmd" @ "MLX5_1.7" => not_supported);
export!("mlx5dv_devx_obj_create" @ "MLX5_1.7" => null);
export!("mlx5dv_devx_obj_destroy" @ "MLX5_1.7" => not_supported);
export!("mlx5dv_devx_obj_modify" @ "MLX5_1.7" => not_supported);
export!("mlx5dv_devx_obj_query" @ "MLX5_1.7" => not_supported);
export!("mlx5dv_devx_query_eqn" @ "MLX5_1.7" => not_supported);
export!("mlx5dv_devx_umem_dereg" @ "MLX5_1.7" => not_supported);
export!("mlx5dv_devx_umem_reg" @ "MLX5_1.7" => null);
export!("mlx5dv_open_device" @ "MLX5_1.7" => null);
export!("mlx5dv_devx_qp_modify" @ "MLX5_1.8" => not_supported);
export!("mlx5dv_devx_qp_query" @ "MLX5_1.8" => not_supported);
export!("mlx5dv_is_supported" @ "MLX5_1.8" => unsupported);
export!("mlx5dv_create_mkey" @ "MLX5_1.10" => null);
export!("mlx5dv_destroy_mkey" @ "MLX5_1.10" => not_supported);
export!("mlx5dv_dr_action_create_dest_ibv_qp" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_action_create_dest_table" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_action_create_dest_vport" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_action_create_drop" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_action_create_flow_counter" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_action_create_modify_header" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_action_create_packet_reformat" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_action_create_tag" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_action_destroy" @ "MLX5_1.10" => not_supported);
export!("mlx5dv_dr_domain_create" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_domain_destroy" @ "MLX5_1.10" => not_supported);
export!("mlx5dv_dr_domain_sync" @ "MLX5_1.10" => not_supported);
export!("mlx5dv_dr_matcher_create" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_matcher_destroy" @ "MLX5_1.10" => not_supported);
export!("mlx5dv_dr_rule_create" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_rule_destroy" @ "MLX5_1.10" => not_supported);
export!("mlx5dv_dr_table_create" @ "MLX5_1.10" => null);
export!("mlx5dv_dr_table_destroy" @ "MLX5_1.10" => not_supported);
export!("mlx5dv_qp_ex_from_ibv_qp_ex" @ "MLX5_1.10" => null);
export!("mlx5dv_devx_create_event_channel" @ "MLX5_1.11" => null);
export!("mlx5dv_devx_destroy_event_channel" @ "MLX5_1.11" => nothing);
export!("mlx5dv_devx_get_event" @ "MLX5_1.11" => minus_one);
export!("mlx5dv_devx_subscribe_devx_event" @ "MLX5_1.11" => not_supported);
export!("mlx5dv_alloc_var" @ "MLX5_1.12" => null);
export!("mlx5dv_dump_dr_domain" @ "MLX5_1.12" => not_supported);
export!("mlx5dv_free_var" @ "MLX5_1.12" => nothing);
export!("mlx5dv_pp_alloc" @ "MLX5_1.13" => null);
export!("mlx5dv_pp_free" @ "MLX5_1.13" => nothing);
export!("mlx5dv_dr_action_create_default_miss" @ "MLX5_1.14" => null);
export!("mlx5dv_modify_qp_lag_port" @ "MLX5_1.14" => not_supported);
export!("mlx5dv_query_qp_lag_port" @ "MLX5_1.14" => not_supported);
export!("mlx5dv_dr_action_create_dest_devx_tir" @ "MLX5_1.15" => null);
export!("mlx5dv_dr_action_create_dest_array" @ "MLX5_1.16" => null);
export!("mlx5dv_dr_action_create_flow_sampler" @ "MLX5_1.16" => null);
export!("mlx5dv_dr_action_create_pop_vlan" @ "MLX5_1.17" => null);
export!("mlx5dv_dr_action_create_push_vlan" @ "MLX5_1.17" => null);
export!("mlx5dv_modify_qp_sched_elem" @ "MLX5_1.17" => not_supported);
export!("mlx5dv_modify_qp_udp_sport" @ "MLX5_1.17" => not_supported);
export!("mlx5dv_sched_leaf_create" @ "MLX5_1.17" => null);
export!("mlx5dv_sched_leaf_destroy" @ "MLX5_1.17" => not_supported);
export!("mlx5dv_sched_leaf_modify" @ "MLX5_1.17" => not_supported);
export!("mlx5dv_sched_node_create" @ "MLX5_1.17" => null);
export!("mlx5dv_sched_node_destroy" @ "MLX5_1.17" => not_supported);
export!("mlx5dv_sched_node_modify" @ "MLX5_1.17" => not_supported);
export!("mlx5dv_reserved_qpn_alloc" @ "MLX5_1.18" => not_supported);
export!("mlx5dv_reserved_qpn_dealloc" @ "MLX5_1.18" => not_supported);
export!("_mlx5dv_query_port" @ "MLX5_1.19" => not_supported);
export!("mlx5dv_devx_umem_reg_ex" @ "MLX5_1.19" => null);
export!("mlx5dv_dm_map_op_addr" @ "MLX5_1.19" => null);
export!("_mlx5dv_mkey_check" @ "MLX5_1.20" => not_supported);
export!("mlx5dv_dr_domain_allow_duplicate_rules" @ "MLX5_1.20" => nothing);
export!("mlx5dv_map_ah_to_qp" @ "MLX5_1.20" => not_supported);
export!("mlx5dv_qp_cancel_posted_send_wrs" @ "MLX5_1.20" => not_supported);
export!("mlx5dv_crypto_login" @ "MLX5_1.21" => not_supported);
export!("mlx5dv_crypto_login_query_state" @ "MLX5_1.21" => not_supported);
export!("mlx5dv_crypto_logout" @ "MLX5_1.21" => not_supported);
export!("mlx5dv_dci_stream_id_reset" @ "MLX5_1.21" => not_supported);
export!("mlx5dv_dek_create" @ "MLX5_1.21" => null);
export!("mlx5dv_dek_destroy" @ "MLX5_1.21" => not_supported);
export!("mlx5dv_dek_query" @ "MLX5_1.21" => not_supported);
export!("mlx5dv_dr_action_create_dest_ib_port" @ "MLX5_1.21" => null);
export!("mlx5dv_dr_matcher_set_layout" @ "MLX5_1.21" => not_supported);
export!("mlx5dv_get_vfio_device_list" @ "MLX5_1.21" => null);
export!("mlx5dv_vfio_get_events_fd" @ "MLX5_1.21" => minus_one);
export!("mlx5dv_vfio_process_events" @ "MLX5_1.21" => not_supported);
export!("mlx5dv_devx_alloc_msi_vector" @ "MLX5_1.23" => null);
export!("mlx5dv_devx_create_eq" @ "MLX5_1.23" => null);
export!("mlx5dv_devx_destroy_eq" @ "MLX5_1.23" => not_supported);
export!("mlx5dv_devx_free_msi_vector" @ "MLX5_1.23" => not_supported);
export!("mlx5dv_crypto_login_create" @ "MLX5_1.24" => null);
export!("mlx5dv_crypto_login_destroy" @ "MLX5_1.24" => not_supported);
export!("mlx5dv_crypto_login_query" @ "MLX5_1.24" => not_supported);

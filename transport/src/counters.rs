//! The device's counters, with the names and meanings of Linux rxe's `hw_counters`
//! (`/sys/class/infiniband/rxe0/ports/1/hw_counters/`), so that one run of ours and one of
//! rxe's compare line by line; then congestion control's, which rxe lacks, with mlx5's
//! names (`np_cnp_sent`, ...) where mlx5 has one. Each is counted where the transport decides what rxe decides
//! at the same point; the endpoint owns them (no atomics: it is driven by one caller).

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// What one device did, counted as rxe counts it; read with
        /// [`Endpoint::counters`](crate::Endpoint::counters).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct Counters {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Counters {
            /// rxe's names, in rxe's order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name),)*];

            /// Each counter with its rxe name, in rxe's order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                Self::NAMES.iter().copied().zip([$(self.$name,)*])
            }
        }
    };
}

counters! {
    /// Packets handed to the link, of every kind (requests, ACKs, READ responses, CM MADs),
    /// less those the link then refused (those are `send_err`).
    sent_pkts,
    /// Packets received that passed every header check (our address, an existing QP in a
    /// state that takes them, P_Key, the connected peer, the UD Q_Key) and the ICRC.
    rcvd_pkts,
    /// RC requests with a PSN already executed (each is answered again).
    duplicate_request,
    /// RC requests beyond the expected PSN that made the responder send a sequence NAK:
    /// one per gap, as later packets of the same gap are dropped without a NAK.
    out_of_seq_request,
    /// RNR NAKs received.
    rcvd_rnr_err,
    /// RNR NAKs sent (an RC request found no receive posted).
    send_rnr_err,
    /// Sequence NAKs received that acknowledged part of the message they name (as rxe
    /// counts them: a NAK for a message's first unacknowledged PSN is not counted here, but
    /// its retry is, in `completer_retry_err`).
    rcvd_seq_err,
    /// Responses whose completion rxe deferred to its completer task. Our completer handles
    /// each response as it arrives, so this stays 0; kept so the table is rxe's.
    ack_deferred,
    /// Send work requests failed with `IBV_WC_RETRY_EXC_ERR`.
    retry_exceeded_err,
    /// Send work requests failed with `IBV_WC_RNR_RETRY_EXC_ERR`.
    retry_rnr_exceeded_err,
    /// Transport retries (go back N after a sequence NAK, an implied NAK or a local ACK
    /// timeout; RNR waits are not counted here).
    completer_retry_err,
    /// Packets the link refused to send (no route, no neighbour, an error from the socket).
    send_err,
    /// Times the port went down. We do not watch the link, so this stays 0.
    link_downed,
    /// SEND work requests (with or without immediate or invalidate) completed, successfully
    /// or not (flushed ones are not).
    rdma_sends,
    /// Receive work requests completed successfully (SEND, WRITE with immediate, UD).
    rdma_recvs,
    /// CNPs sent (mlx5's name): the notification point answering CE marks, at most one per
    /// QP per `np_min_time_between_cnps`.
    np_cnp_sent,
    /// Packets received with the IP ECN field CE (mlx5's name), CNP or not.
    np_ecn_marked_roce_packets,
    /// CNPs received that DCQCN's reaction point acted on (mlx5's name).
    rp_cnp_handled,
    /// CNPs received and ignored, with the reaction point off (mlx5's name).
    rp_cnp_ignored,
    /// Rate cuts of DCQCN's reaction points (no mlx5 counter has this).
    rp_rate_cuts,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_rxes_then_congestion_controls() {
        let rxe = [
            "sent_pkts",
            "rcvd_pkts",
            "duplicate_request",
            "out_of_seq_request",
            "rcvd_rnr_err",
            "send_rnr_err",
            "rcvd_seq_err",
            "ack_deferred",
            "retry_exceeded_err",
            "retry_rnr_exceeded_err",
            "completer_retry_err",
            "send_err",
            "link_downed",
            "rdma_sends",
            "rdma_recvs",
        ];
        assert_eq!(&Counters::NAMES[..rxe.len()], rxe);
        let mlx5 = [
            "np_cnp_sent",
            "np_ecn_marked_roce_packets",
            "rp_cnp_handled",
            "rp_cnp_ignored",
        ];
        assert_eq!(&Counters::NAMES[rxe.len()..rxe.len() + 4], mlx5);
        assert_eq!(Counters::NAMES[rxe.len() + 4..], ["rp_rate_cuts"]);
        let counters = Counters {
            sent_pkts: 1,
            rdma_recvs: 15,
            ..Counters::default()
        };
        let values: Vec<(&str, u64)> = counters.iter().collect();
        assert_eq!(values.first(), Some(&("sent_pkts", 1)));
        assert_eq!(values[14], ("rdma_recvs", 15));
        assert_eq!(values.iter().map(|(_, v)| v).sum::<u64>(), 16);
    }
}

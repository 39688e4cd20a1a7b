//! From our QPs to connected ones: the key messages of every QP through the exchange, then
//! each QP connected to its peer's.

use std::io;
use std::net::Ipv6Addr;

use roce_verbs::{ConnectOptions, QpEndpoint, RetryConfig};
use roce_wire::Psn;

use super::exchange::{KeyMsg, Oob};
use super::params::{Args, Test, OUR_OUT_READS, RESULT_LINE};
use super::report::print_info;
use super::setup::Rdma;

/// A handshake per QP, each with that QP's message (perftest's "per-QP" barriers).
pub(super) fn per_qp(oob: &mut Oob, mine: &[KeyMsg]) -> io::Result<Vec<KeyMsg>> {
    mine.iter().map(|msg| oob.handshake(msg)).collect()
}

/// Swaps key messages (one handshake per QP, two for write_lat and read_lat), prints both
/// sides' addresses as perftest does, and connects every QP. Returns our messages and the
/// peer's.
pub(super) fn connect(
    oob: &mut Oob,
    rdma: &Rdma,
    args: &Args,
) -> io::Result<(Vec<KeyMsg>, Vec<KeyMsg>)> {
    let test = args.test;
    let mine = rdma.key_messages(args.gid_index)?;
    print_info(rdma.ctx, &rdma.params, args.gid_index);
    let mut peers = per_qp(oob, &mine)?;
    if matches!(test, Test::WriteLat | Test::ReadLat) {
        peers = per_qp(oob, &mine)?;
    }
    // Both sides' GIDs of one family (RoCEv2 over IPv4, or over IPv6), as perftest checks.
    let ipv4 = |gid: [u8; 16]| Ipv6Addr::from(gid).to_ipv4_mapped().is_some();
    if peers
        .iter()
        .zip(&mine)
        .any(|(peer, mine)| ipv4(peer.gid) != ipv4(mine.gid))
    {
        return Err(io::Error::other(
            " Found Incompatibility issue with GID types.",
        ));
    }
    for (mine, peer) in mine.iter().zip(&mut peers) {
        mine.print("local", test);
        peer.print("remote", test);
        if args.wrong_rkey {
            // A key the peer never issued (keys are random: a flipped key is as good as any).
            peer.rkey ^= 0x5A5A_5A5A;
        }
    }
    println!("{RESULT_LINE}");
    for (qp, peer) in rdma.qps.iter().zip(&peers) {
        let remote = QpEndpoint {
            qpn: peer.qpn & 0xFF_FFFF,
            psn: Psn::new(peer.psn & 0xFF_FFFF),
            gid: peer.gid,
        };
        let options = ConnectOptions {
            mtu: rdma.params.mtu,
            retry: RetryConfig::RC_PINGPONG,
            sgid_index: args.gid_index,
            hop_limit: 0xFF,
            // Each side issues at most what the other holds state for.
            max_rd_atomic: (peer.out_reads.clamp(1, u16::from(OUR_OUT_READS))) as u8,
            max_dest_rd_atomic: rdma.params.out_reads(),
        };
        qp.connect(&remote, &options)?;
    }
    Ok((mine, peers))
}

//! The transport's `tracing` events, caught by a subscriber of the test's own: a lost packet
//! shows as the NAK the responder sends, the NAK the requester receives and the
//! retransmission from the lost PSN, each naming the QP and PSN.

use std::io::Write;
use std::sync::{Arc, Mutex};

use roce_transport::cq::WcStatus;
use roce_transport::qp_state::QpType;

mod common;
use common::*;

/// Everything the subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_lost_packet_shows_as_naks_and_a_retransmission() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("roce_transport=debug"))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let (qa, lost) = tracing::subscriber::with_default(subscriber, || {
        let (mut sim, qa, qb) = pair(5, QpType::Rc, Default::default());
        // The third packet of a four-packet SEND, once.
        let log = tap(&mut sim, |frame, before| {
            frame.from == A && before.iter().filter(|s| s.from == A).count() == 2
        });
        post_send_into_recv(&mut sim, (qa, qb), 4096, 1);
        assert_eq!(
            summary(&wait_send(&mut sim, A, 1)),
            [(1, WcStatus::Success)]
        );
        let lost = log.borrow().iter().find(|s| s.dropped).unwrap().psn;
        (qa, lost)
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let line = |needle: &str| {
        text.lines()
            .find(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in\n{text}"))
            .to_owned()
    };
    let sent = line("NAK sent");
    assert!(sent.contains(&format!("psn={lost}")), "{sent}");
    assert!(sent.contains("PsnSequenceError"), "{sent}");
    let received = line("NAK received");
    assert!(received.contains(&format!("qpn={qa}")), "{received}");
    let retransmit = line("retransmitting after a NAK");
    assert!(
        retransmit.contains(&format!("resume={lost}")),
        "{retransmit}"
    );
    let to_rts = |line: &str| line.contains("QP state") && line.contains("to=Rts");
    assert_eq!(
        text.lines().filter(|line| to_rts(line)).count(),
        2,
        "{text}"
    );
    assert!(!text.contains("local ACK timeout"), "{text}");
}

//! rdma_cm against the Linux kernel's CM in the rxe VM (../shared/rxe-peer), both roles:
//! rdma-core's `rping` client connects to a server written on our CM API (AF_XDP on `host0`
//! in the `rxe-host` namespace), which plays rping's server: for each iteration it READs
//! the client's buffer, answers, WRITEs it back into the client's sink, answers again; `-V`
//! makes the client check every byte. The client then disconnects, which we must hear.
//! Then rping's server in the VM serves a client on our CM API the same way, and our client
//! disconnects.
//! Needs root and the rxe-peer tool (CI has both); take /tmp/roce-net.lock around it.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use roce_provider::netns;
use roce_tests::rxe_vm::{text, vm};
use roce_verbs::{
    AccessFlags, BackendChoice, CmEventKind, ConnParam, Context, Cq, Device, EventChannel, Mr,
    OpenOptions, Progress, QpCaps, QpInitAttr, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge,
    WcStatus, WorkCompletion,
};

const OUR_IP: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);
const VM_IP: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 11);
const PORT: u16 = 7174;
const ITERATIONS: usize = 10;
const STALL: Duration = Duration::from_secs(30);
/// Every frame our side sent and received, for a failure's evidence.
const OUR_PCAP: &str = "/tmp/roce-rxe-cm.pcap";
const OUR_CLIENT_PCAP: &str = "/tmp/roce-rxe-cm-client.pcap";
/// The buffer our client advertises (rping's default `-S`).
const CLIENT_LEN: usize = 64;
/// `struct rping_rdma_info`: be64 address, be32 rkey, be32 length.
const INFO_LEN: usize = 16;
/// Our copy of the client's buffer (rping's largest `-S` is 64 KiB).
const BUF_LEN: usize = 65536;

fn signaled(wr_id: u64, op: SendOp, sge: Sge) -> SendWr {
    SendWr {
        wr_id,
        op,
        sg_list: [sge].into(),
        inline_data: Vec::new(),
        flags: SendFlags::SIGNALED,
        ud: None,
        xrc_srqn: 0,
    }
}

fn one(cq: &Cq, what: &str) -> Result<WorkCompletion, String> {
    let wc = cq.wait_for(1, STALL).map_err(|e| format!("{what}: {e}"))?;
    let wc = wc[0];
    if wc.status != WcStatus::Success {
        return Err(format!("completion {} failed: {:?}", wc.wr_id, wc.status));
    }
    Ok(wc)
}

/// The client's advertisement: its buffer's address, rkey and length.
fn info(recv: &Mr) -> Result<(u64, u32, u32), String> {
    let mut bytes = [0u8; INFO_LEN];
    recv.read(0, &mut bytes).map_err(|e| e.to_string())?;
    let addr = u64::from_be_bytes(bytes[..8].try_into().unwrap_or_default());
    let rkey = u32::from_be_bytes(bytes[8..12].try_into().unwrap_or_default());
    let len = u32::from_be_bytes(bytes[12..].try_into().unwrap_or_default());
    Ok((addr, rkey, len))
}

fn next_kind(channel: &EventChannel) -> Result<CmEventKind, String> {
    channel
        .get_cm_event(Some(STALL))
        .map(|event| event.kind)
        .map_err(|e| format!("no CM event: {e}"))
}

/// rping's server on our CM API, in the rxe-host namespace; returns the iterations done and
/// whether the client's disconnect arrived.
fn serve(ready: mpsc::Sender<()>) -> Result<usize, String> {
    netns::enter("rxe-host").map_err(|e| e.to_string())?;
    let device = Device::by_name("host0").map_err(|e| e.to_string())?;
    let options = OpenOptions {
        backend: BackendChoice::Auto,
        progress: Progress::Events,
        pcap: Some(OUR_PCAP.into()),
        ..OpenOptions::default()
    };
    let ctx = Context::open(&device, options).map_err(|e| e.to_string())?;
    let channel = ctx.create_event_channel().map_err(|e| e.to_string())?;
    let listener = channel.create_id().map_err(|e| e.to_string())?;
    listener
        .bind_addr(SocketAddr::new(OUR_IP.into(), PORT))
        .and_then(|()| listener.listen(1))
        .map_err(|e| e.to_string())?;
    let _ = ready.send(());

    let CmEventKind::ConnectRequest(request) = next_kind(&channel)? else {
        return Err("expected a connect request".into());
    };
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = ctx.create_cq(16, None).map_err(|e| e.to_string())?;
    let qp = request
        .id
        .create_qp(
            &pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                caps: QpCaps::default(),
                sq_sig_all: false,
            },
        )
        .map_err(|e| e.to_string())?;
    let access = AccessFlags::LOCAL_WRITE;
    let recv = pd.reg_mr(INFO_LEN, access).map_err(|e| e.to_string())?;
    let send = pd.reg_mr(INFO_LEN, access).map_err(|e| e.to_string())?;
    let buf = pd.reg_mr(BUF_LEN, access).map_err(|e| e.to_string())?;
    let post_recv = || {
        qp.post_recv([RecvWr {
            wr_id: 100,
            sg_list: [recv.sge(0, INFO_LEN as u32)].into(),
        }])
        .map_err(|e| e.to_string())
    };
    post_recv()?;
    let param = ConnParam::default();
    request.id.accept(&qp, &param).map_err(|e| e.to_string())?;
    if !matches!(next_kind(&channel)?, CmEventKind::Established) {
        return Err("expected ESTABLISHED".into());
    }

    let mut done = 0;
    while done < ITERATIONS {
        one(&cq, "the client's source advertisement")?;
        let (addr, rkey, len) = info(&recv)?;
        if len as usize > BUF_LEN {
            return Err(format!("the client advertised {len} bytes"));
        }
        post_recv()?;
        let read = SendOp::RdmaRead {
            remote_addr: addr,
            rkey,
        };
        qp.post_send([signaled(1, read, buf.sge(0, len))])
            .map_err(|e| e.to_string())?;
        one(&cq, "our READ")?;
        qp.post_send([signaled(2, SendOp::Send, send.sge(0, INFO_LEN as u32))])
            .map_err(|e| e.to_string())?;
        one(&cq, "our first SEND")?;

        one(&cq, "the client's sink advertisement")?;
        let (addr, rkey, _) = info(&recv)?;
        post_recv()?;
        // rping writes back the string it read, with its NUL.
        let data = buf.to_vec().map_err(|e| e.to_string())?;
        let text_len = data
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(len as usize - 1)
            + 1;
        let write = SendOp::RdmaWrite {
            remote_addr: addr,
            rkey,
        };
        qp.post_send([signaled(3, write, buf.sge(0, text_len as u32))])
            .map_err(|e| e.to_string())?;
        one(&cq, "our WRITE")?;
        qp.post_send([signaled(4, SendOp::Send, send.sge(0, INFO_LEN as u32))])
            .map_err(|e| e.to_string())?;
        one(&cq, "our second SEND")?;
        done += 1;
    }
    match next_kind(&channel)? {
        CmEventKind::Disconnected => Ok(done),
        other => Err(format!("expected DISCONNECTED, got {other:?}")),
    }
}

/// rping's client on our CM API, in the rxe-host namespace, against rping's server at
/// `server`: each iteration advertises a buffer the server READs, then a sink it WRITEs
/// the same bytes into. Returns the iterations whose sink matched.
fn connect_as_client(server: SocketAddr) -> Result<usize, String> {
    netns::enter("rxe-host").map_err(|e| e.to_string())?;
    let device = Device::by_name("host0").map_err(|e| e.to_string())?;
    let options = OpenOptions {
        backend: BackendChoice::Auto,
        progress: Progress::Events,
        pcap: Some(OUR_CLIENT_PCAP.into()),
        ..OpenOptions::default()
    };
    let ctx = Context::open(&device, options).map_err(|e| e.to_string())?;
    let channel = ctx.create_event_channel().map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = ctx.create_cq(16, None).map_err(|e| e.to_string())?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let recv = pd.reg_mr(INFO_LEN, access).map_err(|e| e.to_string())?;
    let send = pd.reg_mr(INFO_LEN, access).map_err(|e| e.to_string())?;
    let start = pd.reg_mr(CLIENT_LEN, access).map_err(|e| e.to_string())?;
    let sink = pd.reg_mr(CLIENT_LEN, access).map_err(|e| e.to_string())?;
    // The server starts listening a moment after it is spawned: try again while refused.
    let mut attempt = 0;
    let (id, qp) = loop {
        attempt += 1;
        let id = channel.create_id().map_err(|e| e.to_string())?;
        id.resolve_addr(server).map_err(|e| e.to_string())?;
        if !matches!(next_kind(&channel)?, CmEventKind::AddrResolved) {
            return Err("expected ADDR_RESOLVED".into());
        }
        id.resolve_route().map_err(|e| e.to_string())?;
        if !matches!(next_kind(&channel)?, CmEventKind::RouteResolved) {
            return Err("expected ROUTE_RESOLVED".into());
        }
        let qp = id
            .create_qp(
                &pd,
                &QpInitAttr {
                    qp_type: QpType::Rc,
                    send_cq: &cq,
                    recv_cq: &cq,
                    caps: QpCaps::default(),
                    sq_sig_all: false,
                },
            )
            .map_err(|e| e.to_string())?;
        qp.post_recv([RecvWr {
            wr_id: 100,
            sg_list: [recv.sge(0, INFO_LEN as u32)].into(),
        }])
        .map_err(|e| e.to_string())?;
        id.connect(&qp, &ConnParam::default())
            .map_err(|e| e.to_string())?;
        match next_kind(&channel)? {
            CmEventKind::Established => break (id, qp),
            CmEventKind::Rejected { .. } if attempt < 20 => {
                thread::sleep(Duration::from_millis(500));
            }
            other => return Err(format!("connect: {other:?}")),
        }
    };
    let post_recv = || {
        qp.post_recv([RecvWr {
            wr_id: 100,
            sg_list: [recv.sge(0, INFO_LEN as u32)].into(),
        }])
        .map_err(|e| format!("posting a receive (QP {:?}): {e}", qp.state()))
    };
    let advertise = |mr: &Mr| -> Result<(), String> {
        let mut info = [0u8; INFO_LEN];
        info[..8].copy_from_slice(&mr.addr().to_be_bytes());
        info[8..12].copy_from_slice(&mr.rkey().to_be_bytes());
        info[12..].copy_from_slice(&(CLIENT_LEN as u32).to_be_bytes());
        send.write(0, &info).map_err(|e| e.to_string())?;
        qp.post_send([signaled(1, SendOp::Send, send.sge(0, INFO_LEN as u32))])
            .map_err(|e| format!("advertising (QP {:?}): {e}", qp.state()))?;
        one(&cq, "our advertisement").map(drop)
    };
    let mut matched = 0;
    for ping in 0..ITERATIONS {
        // rping's pattern: a numbered prefix, then printable characters, then a NUL.
        let mut data: Vec<u8> = format!("rdma-ping-{ping}: ").into_bytes();
        data.extend((0..CLIENT_LEN - data.len() - 1).map(|i| b'A' + ((ping + i) % 26) as u8));
        data.push(0);
        start.write(0, &data).map_err(|e| e.to_string())?;
        sink.write(0, &[0; CLIENT_LEN]).map_err(|e| e.to_string())?;
        advertise(&start)?;
        one(&cq, "the server's go-ahead")?;
        post_recv()?;
        advertise(&sink)?;
        one(&cq, "the server's done")?;
        post_recv()?;
        if sink.to_vec().map_err(|e| e.to_string())? == data {
            matched += 1;
        }
    }
    id.disconnect().map_err(|e| e.to_string())?;
    match next_kind(&channel)? {
        CmEventKind::Disconnected => Ok(matched),
        other => Err(format!("expected DISCONNECTED, got {other:?}")),
    }
}

#[test]
fn rping_in_the_rxe_vm_against_our_cm_in_both_roles() {
    let test = "rping_in_the_rxe_vm_against_our_cm_in_both_roles";
    let Some(vm) = vm(test, "1500") else {
        return;
    };

    let (ready_tx, ready_rx) = mpsc::channel();
    let server = thread::spawn(move || serve(ready_tx));
    if ready_rx.recv_timeout(STALL).is_err() {
        panic!("our server did not start: {:?}", server.join());
    }
    let client = vm.run(&[
        "exec",
        "1",
        "-t",
        "60",
        &format!("rping -c -a {OUR_IP} -p {PORT} -C {ITERATIONS} -S 100 -v -V"),
    ]);
    let served = server.join().expect("the server thread");
    let client_text = text(&client);
    assert!(
        client.status.success(),
        "rping client:\n{client_text}\nour server: {served:?}"
    );
    assert_eq!(
        client_text.matches("ping data: rdma-ping-").count(),
        ITERATIONS,
        "{client_text}"
    );
    assert_eq!(served, Ok(ITERATIONS), "rping client:\n{client_text}");

    // The reverse: rping's server in the VM, our client.
    let spawned = vm.run(&[
        "spawn",
        "1",
        "-t",
        "60",
        &format!("rping -s -a {VM_IP} -p {PORT} -v -V"),
    ]);
    assert!(
        spawned.status.success(),
        "rping server:\n{}",
        text(&spawned)
    );
    let job = String::from_utf8_lossy(&spawned.stdout).trim().to_string();
    let ours = thread::spawn(|| connect_as_client(SocketAddr::new(VM_IP.into(), PORT)))
        .join()
        .expect("the client thread");
    let server = vm.run(&["wait", "1", &job, "60"]);
    let server_text = text(&server);
    assert_eq!(ours, Ok(ITERATIONS), "rping server:\n{server_text}");
    assert_eq!(
        server_text.matches("server ping data: rdma-ping-").count(),
        ITERATIONS,
        "{server_text}"
    );
}

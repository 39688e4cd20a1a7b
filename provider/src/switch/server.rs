//! The switch process: owns the device's AF_XDP sockets (through [`AfXdpBackend`]) and
//! moves frames between the wire and its clients' rings, and between clients.
//!
//! One thread, one loop: take what waits on the wire and steer each frame into its
//! process's ring; drain each client's ring (a bounded batch per client in turn, so no
//! client holds back the others) to the wire or, for this device's own MAC, into another
//! client's ring; publish, waking whoever asked; then, with nothing to do, sleep in poll(2)
//! on the device, the doorbell clients ring, the listening socket and every client's
//! socket. A client that stops reading fills its own ring: what is steered to it then is
//! dropped and counted, and nobody waits for it.
//!
//! While only one process uses the device, the switch lends it the device: the process
//! opens AF_XDP itself ([`Mode::Direct`]) and the switch holds nothing. When a second
//! says hello, the switch asks the first to close its sockets ([`Message::Release`]), and
//! once it has ([`Message::Released`], or the first is gone) welcomes the second and opens
//! its own sockets; both use their rings from then on. Frames that arrive in between (the kernel needs some tens of
//! milliseconds to let go of one socket and bind the next) are lost, and RC retransmits
//! them.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_wire::cm::ServiceId;
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::net::sockopt::socket_peercred;
use rustix::net::{accept_with, bind, listen, SocketFlags};

use super::protocol::{self, Message, Mode, Received, SwitchStats, PROTOCOL_VERSION};
use super::ring::{ring_len, Consumer, Producer};
use super::shm::SharedMemory;
use super::steer::{self, Destination, Identity, Route, Why, RESERVED_SLOT, SLOTS};
use crate::afxdp::AfXdpBackend;
use crate::backend::{flow_entropy, Backend, MAX_FRAME};
use crate::xdp::XdpMode;

/// Data bytes of the ring the switch fills for each client (frames to it).
pub const TO_CLIENT_RING: usize = 4 << 20;
/// Data bytes of the ring each client fills (frames from it).
pub const FROM_CLIENT_RING: usize = 4 << 20;
/// Most frames taken from the wire per turn.
const RX_BUDGET: usize = 1024;
/// Most frames taken from one client's ring per turn.
const TX_BATCH: usize = 128;
/// REQs held for a service nobody listens on yet, at most, and for how long (as a
/// process's own CM holds them, `CmConfig::unlistened_hold`).
const MAX_HELD: usize = 64;
const HOLD: Duration = Duration::from_millis(500);
/// How long an on-demand switch waits for its first client before it leaves.
const FIRST_CLIENT_WAIT: Duration = Duration::from_secs(10);
/// Longest sleep, so a stop request is seen.
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// How often control sockets are looked at while the loop is busy (it sleeps on them
/// otherwise).
const CONTROL_CHECK: Duration = Duration::from_millis(1);
/// How long the switch keeps trying to bind the device after its lender let go.
const OPEN_TRIES: Duration = Duration::from_secs(5);
/// How long a newcomer's welcome waits for the process that holds the device to let it
/// go, at most (one that does not answer is not waited for longer).
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// What a switch serves, and how.
#[derive(Debug, Clone)]
pub struct SwitchConfig {
    /// The interface.
    pub interface: String,
    /// Its index (clients name it, so a switch of a vanished interface is not mistaken).
    pub ifindex: u32,
    /// Its MAC and addresses, against which clients' frames are checked.
    pub identity: Identity,
    /// AF_XDP mode; `None`: native, else generic.
    pub mode: Option<XdpMode>,
    /// Leave once the last client has (started by a client); else run until stopped.
    pub on_demand: bool,
    /// How long the loop keeps polling after its last work before it sleeps (a frame or a
    /// client's next batch usually comes sooner than a wake-up would), as the engine
    /// thread's `ROCE_SPIN_US`.
    pub spin: Duration,
    /// Lend the device to a process while it is the only one (see the module docs).
    pub lend: bool,
}

/// Where a client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Holds the device itself.
    Direct,
    /// Asked to let the device go.
    Releasing,
    /// Uses its rings.
    Ring,
}

/// One attached process.
struct Client {
    socket: OwnedFd,
    pid: i32,
    state: State,
    to_client: Producer,
    from_client: Consumer,
    /// Written to wake the client when frames wait for it.
    wake: OwnedFd,
    services: Vec<ServiceId>,
    steered: u64,
    ring_full: u64,
    refused: u64,
}

/// Where the device stands.
enum Device {
    /// Not opened (lent to a client, or no client yet).
    Closed,
    /// To be opened at `next` (after a release), giving up at `until`.
    Opening { next: Instant, until: Instant },
    /// Ours.
    Open(Box<dyn Backend>),
}

/// A REQ or SIDR_REQ waiting for its service's listener.
struct Held {
    service: ServiceId,
    until: Instant,
    frame: Vec<u8>,
}

/// A running switch; see the module docs.
pub struct Switch {
    config: SwitchConfig,
    listener: OwnedFd,
    /// Clients ring it (an eventfd) when they publish frames while we sleep.
    doorbell: OwnedFd,
    device: Device,
    clients: Vec<Option<Client>>,
    /// Connections that have not said hello yet.
    pending: Vec<OwnedFd>,
    /// Hellos (socket, version, ifindex) answered once the process that holds the device
    /// has let it go, or at the deadline: a newcomer then starts on its ring while the
    /// other already uses its own, so neither sends to the other where it cannot be seen
    /// (a REQ a lender looped to its own CM, which listens on nothing: refused).
    welcoming: Vec<(OwnedFd, u64, u32)>,
    welcome_by: Option<Instant>,
    /// Who listens on which service.
    services: HashMap<ServiceId, u8>,
    held: Vec<Held>,
    /// Where the next slot search starts (slots are reused as late as possible, so frames
    /// still on their way to a gone process's QPs find nobody rather than a newcomer).
    next_slot: usize,
    /// The client served first in the next transmit turn.
    next_tx: usize,
    /// A frame being looped back or sent to several processes.
    scratch: Vec<u8>,
    stats: SwitchStats,
    /// Whether a client ever attached.
    served: bool,
    started: Instant,
}

impl Switch {
    /// A switch over `wire` rather than the interface's AF_XDP sockets (an in-memory wire in
    /// tests); it never lends the device.
    pub fn with_backend(config: SwitchConfig, wire: Box<dyn Backend>) -> io::Result<Switch> {
        let mut switch = Switch::bind(SwitchConfig {
            lend: false,
            ..config
        })?;
        switch.device = Device::Open(wire);
        Ok(switch)
    }

    /// Claims the device's switch address; `AddrInUse` when another switch serves it.
    pub fn bind(config: SwitchConfig) -> io::Result<Switch> {
        let listener = protocol::seqpacket()?;
        bind(
            &listener,
            &protocol::address(config.ifindex, &config.interface)?,
        )?;
        listen(&listener, 64)?;
        rustix::io::ioctl_fionbio(&listener, true)?;
        let device = if config.lend {
            Device::Closed
        } else {
            let now = Instant::now();
            Device::Opening {
                next: now,
                until: now + OPEN_TRIES,
            }
        };
        Ok(Switch {
            config,
            listener,
            doorbell: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
            device,
            clients: (0..SLOTS).map(|_| None).collect(),
            pending: Vec::new(),
            welcoming: Vec::new(),
            welcome_by: None,
            services: HashMap::new(),
            held: Vec::new(),
            next_slot: 0,
            next_tx: 0,
            scratch: vec![0; MAX_FRAME],
            stats: SwitchStats::default(),
            served: false,
            started: Instant::now(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> SwitchStats {
        SwitchStats {
            clients: self.clients.iter().flatten().count() as u64,
            ..self.stats
        }
    }

    /// Serves until `stop` is set, or (on demand) the last client has left. An error is
    /// the device's: every client then sees its socket close.
    pub fn run(&mut self, stop: &AtomicBool) -> io::Result<()> {
        let mut last_control = Instant::now();
        let mut last_work = last_control;
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let mut worked = false;
            if now - last_control >= CONTROL_CHECK {
                last_control = now;
                worked |= self.serve_control()?;
            }
            self.open_device(now)?;
            worked |= self.receive_wire()?;
            worked |= self.transmit_clients()?;
            self.publish();
            self.expire_held(now);
            if self.config.on_demand && self.finished(now) {
                tracing::debug!(interface = %self.config.interface, stats = ?self.stats(), "last client left");
                return Ok(());
            }
            if worked {
                last_work = now;
            } else if now.saturating_duration_since(last_work) < self.config.spin {
                std::thread::yield_now();
            } else {
                self.sleep(now)?;
                last_control = Instant::now();
                self.serve_control()?;
            }
        }
        Ok(())
    }

    /// Whether an on-demand switch has nobody left to serve.
    fn finished(&self, now: Instant) -> bool {
        let nobody = self.pending.is_empty()
            && self.welcoming.is_empty()
            && self.clients.iter().all(Option::is_none);
        nobody && (self.served || now - self.started >= FIRST_CLIENT_WAIT)
    }

    /// Sleeps until a frame, a doorbell, a connection or a message, or the next deadline.
    fn sleep(&mut self, now: Instant) -> io::Result<()> {
        // Ask every client to ring the doorbell when it publishes; if one already has
        // frames waiting, do not sleep.
        // (While the device is not ours, frames for the wire wait in their rings: sleep
        // until it is due rather than spin on them.)
        let open = matches!(self.device, Device::Open(_));
        let mut waiting = false;
        for client in self.clients.iter_mut().flatten() {
            if client.state == State::Ring {
                waiting |= client.from_client.arm().unwrap_or(true);
            }
        }
        if waiting && open {
            return Ok(());
        }
        let mut timeout = MAX_SLEEP;
        if let Some(until) = self.held.iter().map(|held| held.until).min() {
            timeout = timeout.min(until.saturating_duration_since(now));
        }
        if let Device::Opening { next, .. } = self.device {
            timeout = timeout.min(next.saturating_duration_since(now));
        }
        if waiting {
            timeout = timeout.min(Duration::from_millis(1));
        }
        if let Device::Open(device) = &mut self.device {
            device.listen(true)?;
        }
        let device = match &self.device {
            Device::Open(device) => device.readiness_fd(),
            _ => None,
        };
        let mut fds: Vec<PollFd<'_>> = vec![
            PollFd::new(&self.listener, PollFlags::IN),
            PollFd::new(&self.doorbell, PollFlags::IN),
        ];
        if let Some(device) = device {
            fds.push(PollFd::from_borrowed_fd(device, PollFlags::IN));
        }
        for socket in self
            .clients
            .iter()
            .flatten()
            .map(|client| &client.socket)
            .chain(&self.pending)
        {
            fds.push(PollFd::new(socket, PollFlags::IN));
        }
        let timeout = Timespec::try_from(timeout).map_err(io::Error::other)?;
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(error) => return Err(error.into()),
        }
        let rang = fds[1].revents().contains(PollFlags::IN);
        drop(fds);
        if let Device::Open(device) = &mut self.device {
            device.listen(false)?;
        }
        if rang {
            let mut count = [0u8; 8];
            let _ = rustix::io::read(&self.doorbell, &mut count);
        }
        Ok(())
    }

    /// Accepts connections and answers every message waiting; `true` if any came.
    fn serve_control(&mut self) -> io::Result<bool> {
        let mut worked = false;
        loop {
            match accept_with(&self.listener, SocketFlags::CLOEXEC) {
                Ok(socket) => {
                    rustix::io::ioctl_fionbio(&socket, true)?;
                    self.pending.push(socket);
                    worked = true;
                }
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => {}
                Err(error) => return Err(error.into()),
            }
        }
        let mut index = 0;
        while index < self.pending.len() {
            match protocol::recv(&self.pending[index]) {
                Ok(Received::Nothing) => index += 1,
                Ok(Received::Message(Message::Hello { version, ifindex }, _)) => {
                    let socket = self.pending.swap_remove(index);
                    if self.lent() {
                        self.take_device_back();
                        self.welcome_by.get_or_insert(Instant::now() + RELEASE_WAIT);
                        self.welcoming.push((socket, version, ifindex));
                    } else {
                        self.attach(socket, version, ifindex)?;
                    }
                    worked = true;
                }
                // Anything else before a hello, or a closed or broken connection: gone.
                _ => {
                    self.pending.swap_remove(index);
                    worked = true;
                }
            }
        }
        for slot in 0..SLOTS {
            while let Some(client) = &self.clients[slot] {
                let received = protocol::recv(&client.socket);
                let message = match received {
                    Ok(Received::Nothing) => break,
                    Ok(Received::Message(message, _)) => message,
                    Ok(Received::Closed) | Err(_) => {
                        // What it published before it went (the DREQ of a program that
                        // disconnects and exits) still leaves.
                        self.flush(slot as u8);
                        self.detach(slot as u8);
                        worked = true;
                        break;
                    }
                };
                worked = true;
                if !self.answer(slot as u8, message)? {
                    break;
                }
            }
        }
        if !self.welcoming.is_empty()
            && (!self.lent() || self.welcome_by.is_some_and(|by| Instant::now() >= by))
        {
            self.welcome_by = None;
            for (socket, version, ifindex) in std::mem::take(&mut self.welcoming) {
                self.attach(socket, version, ifindex)?;
            }
            worked = true;
        }
        Ok(worked)
    }

    /// Whether a client holds the device (or has not said it let it go).
    fn lent(&self) -> bool {
        self.clients
            .iter()
            .flatten()
            .any(|client| client.state != State::Ring)
    }

    /// Attaches a process that said hello, or refuses it.
    fn attach(&mut self, socket: OwnedFd, version: u64, ifindex: u32) -> io::Result<()> {
        let refuse = |errno: i32| protocol::send(&socket, &Message::Refused { errno }, &[]);
        if version != PROTOCOL_VERSION {
            // A reply the other build can read: tag and errno are in every version.
            return refuse(libc::EPROTO).or(Ok(()));
        }
        if ifindex != self.config.ifindex {
            return refuse(libc::ENODEV).or(Ok(()));
        }
        let Some(slot) = (0..SLOTS)
            .map(|step| (self.next_slot + step) % SLOTS)
            .find(|&slot| slot != usize::from(RESERVED_SLOT) && self.clients[slot].is_none())
        else {
            return refuse(libc::EUSERS).or(Ok(()));
        };
        self.next_slot = slot + 1;
        let len = ring_len(TO_CLIENT_RING) + ring_len(FROM_CLIENT_RING);
        let (memory, memfd) = SharedMemory::create("roce-switch-rings", len)?;
        let memory = Arc::new(memory);
        let to_client = Producer::new(Arc::clone(&memory), 0, TO_CLIENT_RING)?;
        let from_client = Consumer::new(
            Arc::clone(&memory),
            ring_len(TO_CLIENT_RING),
            FROM_CLIENT_RING,
        )?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let others: Vec<u8> = self.slots().collect();
        let mode = match self.device {
            Device::Closed if others.is_empty() && self.config.lend => Mode::Direct,
            _ => Mode::Ring,
        };
        let welcome = Message::Welcome {
            slot: slot as u8,
            mode,
            to_client: TO_CLIENT_RING as u64,
            from_client: FROM_CLIENT_RING as u64,
        };
        let fds = [memfd.as_fd(), wake.as_fd(), self.doorbell.as_fd()];
        if protocol::send(&socket, &welcome, &fds).is_err() {
            return Ok(()); // gone already
        }
        let pid = socket_peercred(&socket).map_or(0, |cred| cred.pid.as_raw_nonzero().get());
        tracing::debug!(slot, pid, ?mode, "client attached");
        self.served = true;
        self.clients[slot] = Some(Client {
            socket,
            pid,
            state: if mode == Mode::Direct {
                State::Direct
            } else {
                State::Ring
            },
            to_client,
            from_client,
            wake,
            services: Vec::new(),
            steered: 0,
            ring_full: 0,
            refused: 0,
        });
        if mode == Mode::Ring {
            self.take_device_back();
        }
        Ok(())
    }

    /// The slots of the attached clients.
    fn slots(&self) -> impl Iterator<Item = u8> + '_ {
        (0..SLOTS)
            .filter(|&slot| self.clients[slot].is_some())
            .map(|slot| slot as u8)
    }

    /// Asks a client that holds the device to let it go, or opens the device if nobody
    /// holds it (the ring client that just came needs it).
    fn take_device_back(&mut self) {
        if !matches!(self.device, Device::Closed) {
            return;
        }
        let mut lent = false;
        for client in self.clients.iter_mut().flatten() {
            match client.state {
                State::Direct => {
                    client.state = State::Releasing;
                    let _ = protocol::send(&client.socket, &Message::Release, &[]);
                    lent = true;
                }
                State::Releasing => lent = true,
                State::Ring => {}
            }
        }
        if !lent {
            let now = Instant::now();
            self.device = Device::Opening {
                next: now,
                until: now + OPEN_TRIES,
            };
        }
    }

    /// Answers one message of client `slot`; `false` when the client was dropped.
    fn answer(&mut self, slot: u8, message: Message) -> io::Result<bool> {
        let reply = match message {
            Message::Listen { service_id } => {
                let service = ServiceId(service_id);
                let errno = match self.services.get(&service) {
                    Some(&owner) if owner != slot => libc::EADDRINUSE,
                    _ => {
                        self.services.insert(service, slot);
                        if let Some(client) = &mut self.clients[usize::from(slot)] {
                            client.services.push(service);
                        }
                        self.offer_held(service);
                        0
                    }
                };
                Some(Message::Done { errno })
            }
            Message::Unlisten { service_id } => {
                let service = ServiceId(service_id);
                if self.services.get(&service) == Some(&slot) {
                    self.services.remove(&service);
                }
                if let Some(client) = &mut self.clients[usize::from(slot)] {
                    client.services.retain(|&held| held != service);
                }
                Some(Message::Done { errno: 0 })
            }
            Message::Released => {
                if let Some(client) = &mut self.clients[usize::from(slot)] {
                    if client.state != State::Ring {
                        client.state = State::Ring;
                        self.lender_gone();
                    }
                }
                None
            }
            Message::Stats => {
                let client = self.clients[usize::from(slot)].as_ref();
                Some(Message::StatsAre(SwitchStats {
                    client_steered: client.map_or(0, |c| c.steered),
                    client_ring_full: client.map_or(0, |c| c.ring_full),
                    client_refused: client.map_or(0, |c| c.refused),
                    ..self.stats()
                }))
            }
            // Messages only the switch sends: a client that sends them is broken.
            _ => {
                self.stats.clients_broken += 1;
                self.detach(slot);
                return Ok(false);
            }
        };
        if let (Some(reply), Some(client)) = (reply, &self.clients[usize::from(slot)]) {
            if protocol::send(&client.socket, &reply, &[]).is_err() {
                self.detach(slot);
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The process that held the device let it go (or left): open ours, if others remain.
    fn lender_gone(&mut self) {
        if matches!(self.device, Device::Closed) && self.slots().next().is_some() {
            let now = Instant::now();
            self.device = Device::Opening {
                next: now,
                until: now + OPEN_TRIES,
            };
        }
    }

    /// Forgets client `slot`: its block, its services; frames for it are dropped from now
    /// on (counted as having no owner).
    fn detach(&mut self, slot: u8) {
        let Some(client) = self.clients[usize::from(slot)].take() else {
            return;
        };
        tracing::debug!(slot, pid = client.pid, "client left");
        self.stats.clients_lost += 1;
        for service in &client.services {
            if self.services.get(service) == Some(&slot) {
                self.services.remove(service);
            }
        }
        if client.state != State::Ring {
            // It held the device; its sockets closed with it.
            self.lender_gone();
        }
        if self.config.lend && self.slots().next().is_none() {
            // Nobody left: the next process to come alone gets the device itself.
            self.device = Device::Closed;
        }
    }

    /// Sends everything client `slot` published and we have not taken yet (bounded by its
    /// ring; nothing if its ring is broken or the wire is not ours).
    fn flush(&mut self, slot: u8) {
        let mut device = match &mut self.device {
            Device::Open(device) => Some(device),
            _ => None,
        };
        if self.clients[usize::from(slot)]
            .as_ref()
            .is_none_or(|client| client.state != State::Ring)
        {
            return;
        }
        for _ in 0..FROM_CLIENT_RING / (64 * TX_BATCH) {
            let taken = drain(
                slot,
                device.as_deref_mut(),
                &mut self.clients,
                &self.services,
                &mut self.held,
                &mut self.stats,
                &self.config.identity,
                &mut self.scratch,
            );
            if !matches!(taken, Ok(count) if count > 0) {
                break;
            }
        }
        if let Some(device) = device {
            let _ = device.submit();
        }
    }

    /// Opens the device when it is due.
    fn open_device(&mut self, now: Instant) -> io::Result<()> {
        let Device::Opening { next, until } = self.device else {
            return Ok(());
        };
        if now < next {
            return Ok(());
        }
        let interface = &self.config.interface;
        let opened = match self.config.mode {
            Some(mode) => AfXdpBackend::open(interface, mode),
            None => AfXdpBackend::open(interface, XdpMode::Native)
                .or_else(|_| AfXdpBackend::open(interface, XdpMode::Generic)),
        };
        match opened {
            Ok(device) => {
                tracing::debug!(%interface, "device opened");
                self.device = Device::Open(Box::new(device) as Box<dyn Backend>);
                Ok(())
            }
            // The lender's sockets may not be released yet.
            Err(error) if now < until => {
                tracing::trace!(%interface, %error, "device not free yet");
                self.device = Device::Opening {
                    next: now + Duration::from_millis(10),
                    until,
                };
                Ok(())
            }
            Err(error) => Err(io::Error::new(
                error.kind(),
                format!("{interface}: cannot open AF_XDP: {error}"),
            )),
        }
    }

    /// Steers what waits on the wire; `true` if anything did.
    fn receive_wire(&mut self) -> io::Result<bool> {
        let Device::Open(device) = &mut self.device else {
            return Ok(false);
        };
        let mut steering = Steering {
            clients: &mut self.clients,
            services: &self.services,
            held: &mut self.held,
            stats: &mut self.stats,
        };
        let received = device.receive(RX_BUDGET, &mut |frame| {
            steering.stats.wire_rx += 1;
            steering.deliver(frame, None);
        })?;
        Ok(received > 0)
    }

    /// Drains the clients' rings, a batch each in turn; `true` if any frame moved. Frames
    /// between processes move while the device is not ours yet; a frame for the wire then
    /// waits in its ring (with those behind it).
    fn transmit_clients(&mut self) -> io::Result<bool> {
        let mut device = match &mut self.device {
            Device::Open(device) => Some(device),
            _ => None,
        };
        let mut moved = false;
        let mut broken = Vec::new();
        for step in 0..SLOTS {
            let slot = (self.next_tx + step) % SLOTS;
            let Some(client) = &self.clients[slot] else {
                continue;
            };
            if client.state != State::Ring {
                continue;
            }
            match drain(
                slot as u8,
                device.as_deref_mut(),
                &mut self.clients,
                &self.services,
                &mut self.held,
                &mut self.stats,
                &self.config.identity,
                &mut self.scratch,
            ) {
                Ok(count) => moved |= count > 0,
                Err(error) => {
                    tracing::debug!(slot, %error, "client broke its ring");
                    broken.push(slot as u8);
                }
            }
        }
        self.next_tx = (self.next_tx + 1) % SLOTS;
        if let Some(device) = device {
            device.submit()?;
        }
        for slot in broken {
            self.stats.clients_broken += 1;
            self.detach(slot);
        }
        Ok(moved)
    }

    /// Publishes every client's new frames, waking those that asked.
    fn publish(&mut self) {
        for client in self.clients.iter_mut().flatten() {
            if client.to_client.publish() {
                let _ = rustix::io::write(&client.wake, &1u64.to_ne_bytes());
            }
        }
    }

    /// Hands the REQs held for `service` to its new listener.
    fn offer_held(&mut self, service: ServiceId) {
        let (waiting, others) = std::mem::take(&mut self.held)
            .into_iter()
            .partition::<Vec<_>, _>(|held| held.service == service);
        self.held = others;
        let mut steering = Steering {
            clients: &mut self.clients,
            services: &self.services,
            held: &mut self.held,
            stats: &mut self.stats,
        };
        for held in waiting {
            steering.deliver(&held.frame, None);
        }
    }

    /// Drops the REQs whose listener did not come in time; the requester's CM resends or
    /// gives up.
    fn expire_held(&mut self, now: Instant) {
        let before = self.held.len();
        self.held.retain(|held| held.until > now);
        self.stats.dropped_no_listener += (before - self.held.len()) as u64;
    }
}

/// The parts of the switch that steering a frame touches.
struct Steering<'a> {
    clients: &'a mut [Option<Client>],
    services: &'a HashMap<ServiceId, u8>,
    held: &'a mut Vec<Held>,
    stats: &'a mut SwitchStats,
}

impl Steering<'_> {
    /// Copies `frame` into the ring of the process it is for (every process but `from`
    /// for multicast), or drops and counts it.
    fn deliver(&mut self, frame: &[u8], from: Option<u8>) {
        match steer::route(frame) {
            Route::Slot(slot) => self.push(slot, frame),
            Route::Service(service) => match self.services.get(&service) {
                Some(&slot) => self.push(slot, frame),
                None if self.held.len() < MAX_HELD => self.held.push(Held {
                    service,
                    until: Instant::now() + HOLD,
                    frame: frame.to_vec(),
                }),
                None => self.stats.dropped_no_listener += 1,
            },
            Route::Everyone => {
                for slot in 0..self.clients.len() {
                    if Some(slot as u8) != from && self.clients[slot].is_some() {
                        self.push(slot as u8, frame);
                    }
                }
            }
            Route::Drop(Why::NotCm) => self.stats.dropped_not_cm += 1,
            Route::Drop(_) => self.stats.dropped_malformed += 1,
        }
    }

    /// Copies `frame` into client `slot`'s ring (a client that holds the device itself
    /// reads its ring too, for frames from the processes that came meanwhile).
    fn push(&mut self, slot: u8, frame: &[u8]) {
        let Some(client) = self.clients[usize::from(slot)].as_mut() else {
            self.stats.dropped_no_owner += 1;
            return;
        };
        match client.to_client.push(frame) {
            Ok(true) => {
                client.steered += 1;
                self.stats.steered += 1;
            }
            Ok(false) => {
                client.ring_full += 1;
                self.stats.dropped_ring_full += 1;
            }
            // Its side of the ring is corrupt: nothing more reaches it, and its socket
            // will be closed when its own ring is looked at (or it leaves).
            Err(_) => {
                client.ring_full += 1;
                self.stats.dropped_ring_full += 1;
            }
        }
    }
}

/// Sends up to [`TX_BATCH`] frames from client `slot`'s ring: to the wire, copied straight
/// into a UMEM slot and checked there; to a process here, checked in `scratch` and copied
/// into its ring. Returns how many were taken; an error when the client broke its ring.
#[allow(clippy::too_many_arguments)]
fn drain(
    slot: u8,
    mut device: Option<&mut Box<dyn Backend>>,
    clients: &mut [Option<Client>],
    services: &HashMap<ServiceId, u8>,
    held: &mut Vec<Held>,
    stats: &mut SwitchStats,
    identity: &Identity,
    scratch: &mut [u8],
) -> io::Result<usize> {
    let mut taken = 0;
    while taken < TX_BATCH {
        let Some(client) = clients[usize::from(slot)].as_mut() else {
            break;
        };
        let Some(len) = client.from_client.next_len()? else {
            break;
        };
        // A first look, to choose the way; whatever is decided is checked again on our own
        // copy, which the client can no longer change.
        let len = client.from_client.copy_current(&mut scratch[..len]);
        let frame = &scratch[..len];
        let way = steer::destination(identity, frame);
        if way != Destination::Here && device.is_none() {
            break; // the wire is not ours yet
        }
        if let (Destination::Wire, Some(device)) = (way, device.as_deref_mut()) {
            let from_client = &client.from_client;
            let mut verdict = Ok(());
            let sent = device.transmit(len, flow_entropy(frame), &mut |buffer| {
                let copied = from_client.copy_current(buffer);
                verdict = steer::check_sent(identity, slot, &buffer[..copied]).and_then(|()| {
                    match steer::destination(identity, &buffer[..copied]) {
                        Destination::Wire => Ok(()),
                        _ => Err(Why::Refused),
                    }
                });
                if verdict.is_ok() {
                    copied
                } else {
                    0
                }
            });
            match sent {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    stats.wire_full += 1;
                    break; // the wire has no room: the frame waits in the ring
                }
                Err(error) => {
                    tracing::debug!(slot, %error, "the link refused a frame");
                }
                Ok(()) if verdict.is_ok() => stats.wire_tx += 1,
                Ok(()) => {
                    client.refused += 1;
                    stats.tx_refused += 1;
                }
            }
        } else if steer::check_sent(identity, slot, frame).is_err() {
            client.refused += 1;
            stats.tx_refused += 1;
        } else {
            if let (Destination::Both, Some(device)) = (way, device.as_deref_mut()) {
                if let Err(error) = device.send(frame) {
                    tracing::debug!(slot, %error, "the link refused a multicast frame");
                } else {
                    stats.wire_tx += 1;
                }
            }
            let before = stats.steered;
            Steering {
                clients,
                services,
                held,
                stats,
            }
            .deliver(frame, Some(slot));
            stats.looped += stats.steered - before;
        }
        let Some(client) = clients[usize::from(slot)].as_mut() else {
            break;
        };
        client.from_client.advance();
        taken += 1;
    }
    if let Some(client) = clients[usize::from(slot)].as_mut() {
        client.from_client.release();
    }
    Ok(taken)
}

impl AsFd for Switch {
    /// The listening socket.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

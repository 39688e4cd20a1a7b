//! A process's side of the switch: [`SwitchClient`] attaches to the device's switch
//! (starting one if none runs) and answers it; [`SwitchBackend`] is the [`Backend`] the
//! process's engine drives, over the process's AF_XDP sockets while the switch lends it
//! the device ([`Mode::Direct`]), over its rings otherwise.
//!
//! Nothing happens until [`SwitchClient::claim`] (the verbs layer calls it before the first
//! QP or CM listener): a program that only queries the device (`ibv_devinfo`) never talks to
//! the switch, never starts one and never waits for one. A small thread per attached
//! device reads the switch's socket: it gives the device back when the switch asks (so a
//! program that drives its engine only when it polls still lets a newcomer in), passes
//! replies on, and notices the switch's death (the socket closes): the engine then fails
//! every QP with `IBV_EVENT_DEVICE_FATAL` ([`device_lost`]).

use std::collections::VecDeque;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{epoll, eventfd, EventfdFlags};
use rustix::net::{connect, shutdown, Shutdown};

use super::protocol::{self, Message, Mode, Received, SwitchStats, PROTOCOL_VERSION};
use super::ring::{ring_len, Consumer, Producer};
use super::shm::SharedMemory;
use crate::afxdp::AfXdpBackend;
use crate::backend::{device_lost, poll_readable, Backend, Fill};
use crate::xdp::XdpMode;

/// How long attaching may take, a switch's start included.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request to the switch may wait for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a lent device may take to be free (the switch's sockets closing).
const LEND_WAIT: Duration = Duration::from_secs(2);

/// Where the client is.
const DORMANT: u8 = 0;
const DIRECT: u8 = 1;
const RING: u8 = 2;
const DEAD: u8 = 3;

/// What attaching gave.
struct Attached {
    socket: Arc<OwnedFd>,
    slot: u8,
    helper: Option<JoinHandle<()>>,
}

/// The rings of an attached client, for the engine.
struct Rings {
    to_client: Consumer,
    from_client: Producer,
    /// The switch writes it when frames wait for us (and we armed).
    wake: OwnedFd,
    /// We write it when we publish and the switch sleeps (it armed).
    doorbell: OwnedFd,
}

/// State the helper thread and the engine share.
struct Inner {
    state: AtomicU8,
    /// The device's AF_XDP sockets while we hold it ourselves.
    direct: Mutex<Option<AfXdpBackend>>,
    /// The rings, until the engine's backend takes them.
    rings: Mutex<Option<Rings>>,
    /// Answers to requests, in order.
    replies: Mutex<VecDeque<Message>>,
    answered: Condvar,
    /// Written when the state changes, to wake an engine thread asleep on the backend.
    changed: OwnedFd,
    /// What the engine thread sleeps on: `changed`, the ring's wake-up, and the AF_XDP
    /// sockets while direct and a sleeper listens ([`Backend::listen`]).
    epoll: OwnedFd,
    /// Why the device was lost, once it was.
    lost: Mutex<Option<String>>,
}

impl Inner {
    fn set_state(&self, state: u8) {
        self.state.store(state, Ordering::Release);
        let _ = rustix::io::write(&self.changed, &1u64.to_ne_bytes());
    }

    fn lose(&self, why: &str) {
        if let Ok(mut lost) = self.lost.lock() {
            lost.get_or_insert_with(|| why.to_owned());
        }
        // Its sockets close now, so a new switch can take the device.
        if let Ok(mut direct) = self.direct.lock() {
            *direct = None;
        }
        self.set_state(DEAD);
        self.answered.notify_all();
    }
}

/// A process's link to its device's switch, shared by the verbs layer (which claims and
/// registers listeners) and the engine's [`SwitchBackend`].
pub struct SwitchClient {
    interface: String,
    ifindex: u32,
    /// AF_XDP mode when the device is lent to us; `None`: native, else generic.
    mode: Option<XdpMode>,
    /// The `roce` executable to start a switch with, if none runs.
    program: Option<PathBuf>,
    inner: Arc<Inner>,
    attached: Mutex<Option<Attached>>,
    /// Held across a request and its answer.
    requesting: Mutex<()>,
}

impl std::fmt::Debug for SwitchClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchClient")
            .field("interface", &self.interface)
            .field("state", &self.inner.state.load(Ordering::Relaxed))
            .finish()
    }
}

impl SwitchClient {
    /// A client of the switch of `interface` (index `ifindex`, in this thread's network
    /// namespace), not attached yet; `program` starts a switch when none runs.
    pub fn new(
        interface: &str,
        ifindex: u32,
        mode: Option<XdpMode>,
        program: Option<PathBuf>,
    ) -> io::Result<Arc<SwitchClient>> {
        let changed = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &epoll,
            &changed,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )?;
        Ok(Arc::new(SwitchClient {
            interface: interface.to_owned(),
            ifindex,
            mode,
            program,
            inner: Arc::new(Inner {
                state: AtomicU8::new(DORMANT),
                direct: Mutex::new(None),
                rings: Mutex::new(None),
                replies: Mutex::new(VecDeque::new()),
                answered: Condvar::new(),
                changed,
                epoll,
                lost: Mutex::new(None),
            }),
            attached: Mutex::new(None),
            requesting: Mutex::new(()),
        }))
    }

    /// The interface.
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// Whether the device is ours alone right now (the switch lent it).
    pub fn is_direct(&self) -> bool {
        self.inner.state.load(Ordering::Acquire) == DIRECT
    }

    /// Whether the device was lost (the switch died).
    pub fn is_lost(&self) -> bool {
        self.inner.state.load(Ordering::Acquire) == DEAD
    }

    /// Attaches to the device's switch, starting one if none runs, and returns this
    /// process's block of QP numbers and CM IDs; at once if attached already.
    pub fn claim(&self) -> io::Result<u8> {
        let mut attached = self.lock_attached()?;
        if let Some(attached) = attached.as_ref() {
            return match self.inner.state.load(Ordering::Acquire) {
                DEAD => Err(self.lost_error()),
                _ => Ok(attached.slot),
            };
        }
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        let (socket, slot, mode, sizes, fds) = loop {
            let socket = self.connect(deadline)?;
            let hello = Message::Hello {
                version: PROTOCOL_VERSION,
                ifindex: self.ifindex,
            };
            let answer =
                protocol::send(&socket, &hello, &[]).and_then(|()| protocol::recv(&socket));
            match answer {
                Ok(Received::Message(
                    Message::Welcome {
                        slot,
                        mode,
                        to_client,
                        from_client,
                    },
                    fds,
                )) => break (socket, slot, mode, (to_client, from_client), fds),
                Ok(Received::Message(Message::Refused { errno }, _)) => {
                    let error = io::Error::from_raw_os_error(errno);
                    return Err(io::Error::new(
                        error.kind(),
                        format!("the switch of {} refused us: {error}", self.interface),
                    ));
                }
                // A switch leaving as its last client left: start another.
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                _ => return Err(io::Error::other("the switch did not answer")),
            }
        };
        let rings = map_rings(sizes, fds)?;
        epoll::add(
            &self.inner.epoll,
            &rings.wake,
            epoll::EventData::new_u64(1),
            epoll::EventFlags::IN,
        )?;
        *self.inner.rings.lock().map_err(|_| poisoned())? = Some(rings);
        if mode == Mode::Direct {
            let device = self.open_direct()?;
            *self.inner.direct.lock().map_err(|_| poisoned())? = Some(device);
            self.inner.set_state(DIRECT);
        } else {
            self.inner.set_state(RING);
        }
        // The socket blocks from here on, read by the helper alone.
        let socket = Arc::new(socket);
        let helper = {
            let (inner, socket) = (Arc::clone(&self.inner), Arc::clone(&socket));
            std::thread::Builder::new()
                .name(format!("roce-sw-{}", self.interface))
                .spawn(move || listen_to_switch(&inner, &socket))?
        };
        tracing::debug!(interface = %self.interface, slot, ?mode, "attached to the switch");
        *attached = Some(Attached {
            socket,
            slot,
            helper: Some(helper),
        });
        Ok(slot)
    }

    fn lock_attached(&self) -> io::Result<MutexGuard<'_, Option<Attached>>> {
        self.attached.lock().map_err(|_| poisoned())
    }

    fn lost_error(&self) -> io::Error {
        let why = self.inner.lost.lock().ok().and_then(|lost| lost.clone());
        io::Error::new(
            io::ErrorKind::NotConnected,
            format!(
                "the switch of {} is gone: {}",
                self.interface,
                why.unwrap_or_default()
            ),
        )
    }

    /// Opens the device's AF_XDP sockets ourselves (the switch lent it). A switch whose
    /// last client just left closes its own sockets and lends the device to the next one;
    /// the kernel may not have let go of them yet, so we retry for a while.
    fn open_direct(&self) -> io::Result<AfXdpBackend> {
        let until = Instant::now() + LEND_WAIT;
        loop {
            let opened = match self.mode {
                Some(mode) => AfXdpBackend::open(&self.interface, mode),
                None => AfXdpBackend::open(&self.interface, XdpMode::Native)
                    .or_else(|_| AfXdpBackend::open(&self.interface, XdpMode::Generic)),
            };
            match opened {
                Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                opened => return opened,
            }
        }
    }

    /// Connects to the switch, starting one when none answers.
    fn connect(&self, deadline: Instant) -> io::Result<OwnedFd> {
        let address = protocol::address(self.ifindex, &self.interface)?;
        let mut started = false;
        loop {
            let socket = protocol::seqpacket()?;
            let error = match connect(&socket, &address) {
                Ok(()) => {
                    set_receive_timeout(&socket, Some(ATTACH_TIMEOUT))?;
                    return Ok(socket);
                }
                Err(error) => io::Error::from(error),
            };
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    error.kind(),
                    format!("no switch for {} answers: {error}", self.interface),
                ));
            }
            if !started {
                let program = self.program.as_deref().ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        "no switch runs and no roce executable to start one (ROCE_SWITCH_BIN)",
                    )
                })?;
                start_switch(program, &self.interface)?;
                started = true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends `message` and waits for the switch's answer.
    fn request(&self, message: &Message) -> io::Result<Message> {
        let _turn = self.requesting.lock().map_err(|_| poisoned())?;
        let socket = match self.lock_attached()?.as_ref() {
            Some(attached) => Arc::clone(&attached.socket),
            None => return Err(io::Error::from(io::ErrorKind::NotConnected)),
        };
        protocol::send(&*socket, message, &[])?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let mut replies = self.inner.replies.lock().map_err(|_| poisoned())?;
        loop {
            if let Some(reply) = replies.pop_front() {
                return Ok(reply);
            }
            if self.is_lost() {
                return Err(self.lost_error());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the switch did not answer",
                ));
            }
            replies = self
                .inner
                .answered
                .wait_timeout(replies, left)
                .map_err(|_| poisoned())?
                .0;
        }
    }

    /// Tells the switch that REQs and SIDR_REQs for `service_id` are ours; `AddrInUse`
    /// when another process listens on it. Claims first.
    pub fn listen(&self, service_id: u64) -> io::Result<()> {
        self.claim()?;
        match self.request(&Message::Listen { service_id })? {
            Message::Done { errno: 0 } => Ok(()),
            Message::Done { errno } => Err(io::Error::from_raw_os_error(errno)),
            _ => Err(io::Error::other("the switch answered something else")),
        }
    }

    /// Tells the switch we no longer listen on `service_id` (nothing when not attached).
    pub fn unlisten(&self, service_id: u64) -> io::Result<()> {
        if self.lock_attached()?.is_none() || self.is_lost() {
            return Ok(());
        }
        self.request(&Message::Unlisten { service_id }).map(drop)
    }

    /// The switch's counters, with ours; `None` when not attached (or the switch is gone).
    pub fn stats(&self) -> Option<SwitchStats> {
        if self.lock_attached().ok()?.is_none() || self.is_lost() {
            return None;
        }
        match self.request(&Message::Stats) {
            Ok(Message::StatsAre(stats)) => Some(stats),
            _ => None,
        }
    }
}

impl Drop for SwitchClient {
    fn drop(&mut self) {
        // Our sockets close before the switch hears we left, so it can take the device.
        if let Ok(mut direct) = self.inner.direct.lock() {
            *direct = None;
        }
        let attached = self.attached.get_mut().ok().and_then(Option::take);
        if let Some(mut attached) = attached {
            let _ = shutdown(&*attached.socket, Shutdown::Both);
            if let Some(helper) = attached.helper.take() {
                let _ = helper.join();
            }
        }
    }
}

fn poisoned() -> io::Error {
    io::Error::other("a thread panicked inside the switch client")
}

fn set_receive_timeout(socket: &OwnedFd, timeout: Option<Duration>) -> io::Result<()> {
    Ok(rustix::net::sockopt::set_socket_timeout(
        socket,
        rustix::net::sockopt::Timeout::Recv,
        timeout,
    )?)
}

/// Maps the rings the switch sent: its memfd, our wake-up eventfd, its doorbell.
fn map_rings((to_client, from_client): (u64, u64), fds: Vec<OwnedFd>) -> io::Result<Rings> {
    let [memfd, wake, doorbell]: [OwnedFd; 3] = fds
        .try_into()
        .map_err(|_| io::Error::other("the switch sent the wrong fds"))?;
    let to_client = usize::try_from(to_client).map_err(io::Error::other)?;
    let from_client = usize::try_from(from_client).map_err(io::Error::other)?;
    let memory = Arc::new(SharedMemory::map(&memfd)?);
    Ok(Rings {
        to_client: Consumer::new(Arc::clone(&memory), 0, to_client)?,
        from_client: Producer::new(memory, ring_len(to_client), from_client)?,
        wake,
        doorbell,
    })
}

/// The helper thread: reads the switch's socket until it closes.
fn listen_to_switch(inner: &Inner, socket: &OwnedFd) {
    if set_receive_timeout(socket, None).is_err() {
        inner.lose("cannot read the switch's socket");
        return;
    }
    loop {
        match protocol::recv(socket) {
            Ok(Received::Message(Message::Release, _)) => {
                // Close our AF_XDP sockets first: the switch binds its own after.
                if let Ok(mut direct) = inner.direct.lock() {
                    *direct = None;
                    inner.set_state(RING);
                }
                if protocol::send(socket, &Message::Released, &[]).is_err() {
                    inner.lose("the switch closed its socket");
                    return;
                }
                tracing::debug!("handed the device to the switch");
            }
            Ok(Received::Message(reply, _)) => {
                if let Ok(mut replies) = inner.replies.lock() {
                    replies.push_back(reply);
                }
                inner.answered.notify_all();
            }
            Ok(Received::Nothing) => {}
            Ok(Received::Closed) => {
                inner.lose("the switch closed its socket");
                return;
            }
            Err(error) => {
                inner.lose(&error.to_string());
                return;
            }
        }
    }
}

/// Starts `program switch INTERFACE --on-demand` as a daemon of its own: a grandchild
/// (reparented, never our zombie, never seen by our `wait`), in a process group of its own
/// (no signal for the program's group reaches it) that ignores SIGHUP, with none of our fds
/// but 0 to 2 (/dev/null; stderr kept with `ROCE_LOG`).
///
/// It stays in the program's session, so in its scheduling autogroup: in a session of its
/// own (setsid) the switch was an autogroup alone, whose share of a CPU shrinks while it
/// sleeps, and under two busy perftest pairs on two cores it sat runnable for 440 ms at a
/// time past its 100 ms poll timeout; the pairs' QPs ran out of retries (`RETRY_EXC_ERR`)
/// in 5 of 12 runs, none of 14 with autogroups off or in the starter's session.
fn start_switch(program: &Path, interface: &str) -> io::Result<()> {
    let arguments: Vec<OsString> = vec![
        program.as_os_str().to_owned(),
        "switch".into(),
        interface.into(),
        "--on-demand".into(),
    ];
    let arguments: Vec<CString> = arguments
        .iter()
        .map(|argument| CString::new(argument.as_bytes()).map_err(io::Error::other))
        .collect::<io::Result<_>>()?;
    let mut pointers: Vec<*const libc::c_char> = arguments.iter().map(|a| a.as_ptr()).collect();
    pointers.push(std::ptr::null());
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    let keep_stderr = std::env::var_os("ROCE_LOG").is_some_and(|value| value != "0");
    tracing::debug!(program = %program.display(), %interface, "starting a switch");
    // SAFETY: between fork and exec the children call only async-signal-safe functions
    // (fork, setpgid, signal, dup2, close_range, sigprocmask, execv, _exit) on memory prepared
    // before the fork; the parent only waits for the first child.
    #[allow(unsafe_code)]
    unsafe {
        let child = libc::fork();
        if child < 0 {
            return Err(io::Error::last_os_error());
        }
        if child == 0 {
            if libc::fork() != 0 {
                libc::_exit(0);
            }
            libc::setpgid(0, 0);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            let fd = null.as_raw_fd();
            libc::dup2(fd, 0);
            libc::dup2(fd, 1);
            if !keep_stderr {
                libc::dup2(fd, 2);
            }
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::execv(pointers[0], pointers.as_ptr());
            libc::_exit(127);
        }
        let mut status = 0;
        while libc::waitpid(child, &mut status, 0) < 0 {
            if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
    }
    Ok(())
}

/// The `roce` executable that can start a switch: `ROCE_SWITCH_BIN`, else a `roce` beside
/// the library or executable this code is in (or one directory up: `roce exec`'s
/// library links and cargo's test binaries live one below `roce`).
pub fn switch_program() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ROCE_SWITCH_BIN") {
        return Some(PathBuf::from(path)).filter(|path| path.is_file());
    }
    let mut places = Vec::new();
    if let Some(object) = this_object() {
        places.push(object);
    }
    if let Ok(exe) = std::env::current_exe() {
        places.push(exe);
    }
    let found = places
        .iter()
        .filter_map(|file| file.parent())
        .flat_map(|dir| [Some(dir), dir.parent()])
        .flatten()
        .map(|dir| dir.join("roce"))
        .find(|candidate| candidate.is_file());
    found
}

/// The file of the shared object (or executable) this function is in.
fn this_object() -> Option<PathBuf> {
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let address = this_object as *const () as *const libc::c_void;
    // SAFETY: `dladdr` fills `info` for an address of ours; the name it points to lives
    // as long as the object stays loaded (we are in it), and is copied at once.
    #[allow(unsafe_code)]
    unsafe {
        if libc::dladdr(address, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        let name = std::ffi::CStr::from_ptr(info.dli_fname);
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
    }
}

/// The [`Backend`] of a process on a device its switch shares: the process's own AF_XDP
/// sockets while the switch lends it the device, its rings otherwise; nothing (no frames,
/// none sent) before [`SwitchClient::claim`]; once the switch is gone, [`device_lost`]
/// once, then nothing.
pub struct SwitchBackend {
    client: Arc<SwitchClient>,
    rings: Option<Rings>,
    /// The state last seen, to notice changes (and drain `changed`).
    seen: u8,
    /// Whether the device's sockets are in the epoll (a sleeper listens).
    listening: bool,
    /// Whether the loss was reported.
    reported: bool,
}

impl SwitchBackend {
    /// The backend over `client`'s link.
    pub fn new(client: Arc<SwitchClient>) -> SwitchBackend {
        SwitchBackend {
            client,
            rings: None,
            seen: DORMANT,
            listening: false,
            reported: false,
        }
    }

    /// The state, noticing changes.
    fn state(&mut self) -> u8 {
        let state = self.client.inner.state.load(Ordering::Acquire);
        if state != self.seen {
            self.seen = state;
            // A device given back took its sockets out of the epoll as it closed them.
            self.listening = false;
            let mut count = [0u8; 8];
            let _ = rustix::io::read(&self.client.inner.changed, &mut count);
            if self.rings.is_none() {
                self.rings = self
                    .client
                    .inner
                    .rings
                    .lock()
                    .ok()
                    .and_then(|mut rings| rings.take());
            }
        }
        state
    }

    /// The device's sockets while direct; `None` once given back.
    fn direct(&self) -> io::Result<MutexGuard<'_, Option<AfXdpBackend>>> {
        self.client.inner.direct.lock().map_err(|_| poisoned())
    }

    fn receive_rings(
        &mut self,
        budget: usize,
        handler: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        let Some(rings) = self.rings.as_mut().filter(|_| budget > 0) else {
            return Ok(0);
        };
        let mut delivered = 0;
        for _ in 0..2 {
            while delivered < budget {
                let Some(frame) = rings.to_client.peek()? else {
                    break;
                };
                handler(frame);
                rings.to_client.advance();
                delivered += 1;
            }
            rings.to_client.release();
            if delivered > 0 || rings.to_client.is_armed() {
                break;
            }
            // Empty and not armed: the switch took our last arm and wrote the eventfd (or
            // we never armed). Take the wake-up, then ask for the next; look once more in
            // case frames came in between.
            let mut count = [0u8; 8];
            let _ = rustix::io::read(&rings.wake, &mut count);
            if !rings.to_client.arm()? {
                break;
            }
        }
        Ok(delivered)
    }
}

impl Backend for SwitchBackend {
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        match self.state() {
            DORMANT => Ok(0),
            // Our own sockets, then the ring: the switch puts there what the processes that
            // came since send us until we give the device back.
            DIRECT => {
                let mut direct = self.direct()?;
                let taken = match direct.as_mut() {
                    Some(device) => device.receive(budget, handler)?,
                    None => 0,
                };
                drop(direct);
                Ok(taken + self.receive_rings(budget - taken, handler)?)
            }
            RING => self.receive_rings(budget, handler),
            _ if !self.reported => {
                self.reported = true;
                Err(device_lost(&self.client.lost_error().to_string()))
            }
            _ => Ok(0),
        }
    }

    fn transmit(&mut self, len: usize, flow: u16, fill: Fill<'_>) -> io::Result<()> {
        match self.state() {
            DIRECT => {
                let mut direct = self.direct()?;
                if let Some(device) = direct.as_mut() {
                    return device.transmit(len, flow, fill);
                }
            }
            RING => {}
            // Nowhere to go: as a wire that is down.
            _ => return Ok(()),
        }
        let Some(rings) = self.rings.as_mut() else {
            return Ok(());
        };
        let Some(room) = rings.from_client.reserve(len)? else {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the ring to the switch is full",
            ));
        };
        let written = fill(room).min(len);
        rings.from_client.commit(written);
        Ok(())
    }

    fn submit(&mut self) -> io::Result<()> {
        if self.seen == DIRECT {
            if let Some(device) = self.direct()?.as_mut() {
                return device.submit();
            }
        }
        if let Some(rings) = self.rings.as_mut() {
            if rings.from_client.publish() {
                let _ = rustix::io::write(&rings.doorbell, &1u64.to_ne_bytes());
            }
        }
        Ok(())
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.listen(true)?;
        let waited = poll_readable(&[self.client.inner.epoll.as_fd()], timeout);
        self.listen(false)?;
        waited
    }

    fn readiness_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.client.inner.epoll.as_fd())
    }

    fn listen(&mut self, on: bool) -> io::Result<()> {
        if on == self.listening {
            return Ok(());
        }
        if self.seen == DIRECT {
            let epoll = &self.client.inner.epoll;
            if let Some(device) = self
                .client
                .inner
                .direct
                .lock()
                .map_err(|_| poisoned())?
                .as_ref()
            {
                for fd in device.fds() {
                    let done = if on {
                        epoll::add(
                            epoll,
                            fd,
                            epoll::EventData::new_u64(2),
                            epoll::EventFlags::IN,
                        )
                    } else {
                        epoll::delete(epoll, fd)
                    };
                    // Not there: the device was given back (and closed) meanwhile.
                    match done {
                        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                        Err(error) => return Err(error.into()),
                    }
                }
            }
        }
        self.listening = on;
        Ok(())
    }

    fn loops_back(&self) -> bool {
        self.seen == RING
    }

    fn received_per_queue(&self) -> Vec<u64> {
        match self.direct() {
            Ok(direct) => direct
                .as_ref()
                .map_or_else(Vec::new, AfXdpBackend::received_per_queue),
            Err(_) => Vec::new(),
        }
    }
}

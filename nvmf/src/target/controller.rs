//! Controllers: what a host's Connect creates, and everything its admin queue asks of it —
//! properties, Identify, log pages, features, keep alive, asynchronous events. No I/O
//! here: each call takes the command and returns the completion's status, result and the
//! data for the host, so these rules are tested without RDMA. What Linux's target
//! (`drivers/nvme/target`) does is the reference where the specification leaves a choice.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::subsystem::Subsystem;
use crate::wire::fabrics::{
    cc, csts, invalid, property, Connect, ConnectData, CATTR_DISABLE_SQ_FLOW, CNTLID_DYNAMIC,
    DISCOVERY_NQN, VERSION_1_3,
};
use crate::wire::identify::{
    self, IdentifyController, CONTROLLER_DISCOVERY, CONTROLLER_IO, IDENTIFY_LEN, ONCS_DSM,
    ONCS_WRITE_ZEROES, SGLS_KEYED, SGLS_OFFSETS, SGLS_SUPPORTED,
};
use crate::wire::log::{self, DiscoveryEntry, ErrorEntry, GetLogPage, Smart};
use crate::wire::{admin, feature, io, Sqe, Status};

/// Linux's admin queue depth: the most an admin queue may have (`NVME_AQ_DEPTH`).
pub const ADMIN_QUEUE_DEPTH: u16 = 32;
/// Maximum data transfer: 2^5 pages of 4 KiB, 128 KiB.
pub const MDTS: u8 = 5;
/// Bytes of the largest transfer.
pub const MAX_TRANSFER: u32 = 4096 << MDTS;
/// Keep alive granularity, in 100 ms units (Linux's target: 1 s).
const KAS: u16 = 10;
/// Keep alive timeout of a discovery controller whose host asked for none (Linux's
/// `NVMET_DISC_KATO_MS`), so that stale discovery sessions end.
const DISCOVERY_KATO_MS: u32 = 120_000;
/// Asynchronous event requests a controller holds at once.
const AER_LIMIT: u8 = 4;
/// Error log entries kept.
const ERROR_LOG_ENTRIES: usize = 64;
/// Asynchronous events an I/O controller may report: namespace attribute changes.
const IO_EVENTS: u32 = feature::AEN_NAMESPACE_ATTRIBUTE;
/// Asynchronous events a discovery controller may report.
const DISCOVERY_EVENTS: u32 = feature::AEN_DISCOVERY_CHANGE;
/// Admin commands a controller supports, for the effects log.
const ADMIN_COMMANDS: [u8; 7] = [
    admin::GET_LOG_PAGE,
    admin::IDENTIFY,
    admin::ABORT,
    admin::SET_FEATURES,
    admin::GET_FEATURES,
    admin::ASYNC_EVENT,
    admin::KEEP_ALIVE,
];
/// I/O commands a controller supports.
const IO_COMMANDS: [u8; 5] = [
    io::FLUSH,
    io::WRITE,
    io::READ,
    io::WRITE_ZEROES,
    io::DATASET_MANAGEMENT,
];

/// What the target offers every controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// I/O queues a controller may have (queue IDs 1 to this).
    pub max_io_queues: u16,
    /// Entries of an I/O queue, at most.
    pub max_queue_depth: u16,
    /// Bytes of in-capsule data an I/O command may carry.
    pub in_capsule: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_io_queues: 8,
            max_queue_depth: 128,
            in_capsule: 8192,
        }
    }
}

/// How a command ended: its status, the completion's result, and data for the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// Status.
    pub status: Status,
    /// Dwords 0–1 of the completion.
    pub result: u64,
    /// Data to move to the host (exactly its SGL's length).
    pub data: Option<Vec<u8>>,
}

impl Done {
    fn status(status: Status) -> Done {
        Done {
            status,
            result: 0,
            data: None,
        }
    }

    fn result(result: u64) -> Done {
        Done {
            status: Status::SUCCESS,
            result,
            data: None,
        }
    }

    fn data(data: Vec<u8>) -> Done {
        Done {
            status: Status::SUCCESS,
            result: 0,
            data: Some(data),
        }
    }
}

/// An admin command's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Answer now.
    Done(Done),
    /// Keep it unanswered (an Asynchronous Event Request, until an event or the end).
    Hold,
}

/// Why a Connect failed: the status, and the invalid parameter's location for the
/// completion's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Status.
    pub status: Status,
    /// Linux's IPO/IATTR value, 0 if none.
    pub location: u32,
}

fn refuse(status: Status, location: u32) -> Refusal {
    Refusal {
        status: status.dnr(),
        location,
    }
}

/// Where the target listens, for discovery log entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// Address family (1 IPv4, 2 IPv6).
    pub adrfam: u8,
    /// Address, as text.
    pub traddr: String,
    /// Port, as text.
    pub trsvcid: String,
}

/// One controller.
#[derive(Debug)]
pub struct Controller {
    /// Its ID.
    pub cntlid: u16,
    /// Its subsystem's index, `None` for the discovery subsystem.
    pub subsystem: Option<usize>,
    /// The host's NQN.
    pub hostnqn: String,
    /// The host's identifier.
    pub hostid: [u8; 16],
    /// Keep alive timeout in milliseconds, 0 for none.
    pub kato_ms: u32,
    /// When the host last sent a command (any command keeps it alive, as Linux's target
    /// counts traffic).
    pub last_seen: Instant,
    /// Its I/O queues.
    pub io_queues: BTreeSet<u16>,
    cc: u32,
    csts: u32,
    aen: u32,
    /// Asynchronous event requests held.
    pub aers: u8,
    errors: VecDeque<ErrorEntry>,
    error_count: u64,
}

/// Every controller of the target, by ID.
#[derive(Debug, Default)]
pub struct Registry {
    /// The controllers.
    pub controllers: BTreeMap<u16, Controller>,
    next: u16,
}

impl Registry {
    /// An admin queue's Connect: a new controller of the subsystem the data names, for a
    /// host it allows; its ID.
    pub fn admin_connect(
        &mut self,
        connect: &Connect,
        data: &ConnectData,
        subsystems: &[Subsystem],
        now: Instant,
    ) -> Result<u16, Refusal> {
        check_connect(connect, ADMIN_QUEUE_DEPTH)?;
        if data.cntlid != CNTLID_DYNAMIC {
            return Err(refuse(
                Status::CONNECT_INVALID_PARAMETERS,
                invalid::DATA_CNTLID,
            ));
        }
        let subsystem = find_subsystem(&data.subnqn, subsystems)?;
        if let Some(index) = subsystem {
            if !subsystems[index].hosts.allows(&data.hostnqn) {
                return Err(refuse(Status::CONNECT_INVALID_HOST, invalid::DATA_HOSTNQN));
            }
        }
        let cntlid = self
            .free_id()
            .ok_or(refuse(Status::CONNECT_CONTROLLER_BUSY, 0))?;
        let kato_ms = match (subsystem, connect.kato) {
            (None, 0) => DISCOVERY_KATO_MS,
            (_, kato) => kato,
        };
        self.controllers.insert(
            cntlid,
            Controller {
                cntlid,
                subsystem,
                hostnqn: data.hostnqn.clone(),
                hostid: data.hostid,
                kato_ms,
                last_seen: now,
                io_queues: BTreeSet::new(),
                cc: 0,
                csts: 0,
                aen: 0,
                aers: 0,
                errors: VecDeque::new(),
                error_count: 0,
            },
        );
        Ok(cntlid)
    }

    /// An I/O queue's Connect: joins the controller the data names, if the same host
    /// created it for the same subsystem and the queue ID is free.
    pub fn io_connect(
        &mut self,
        connect: &Connect,
        data: &ConnectData,
        subsystems: &[Subsystem],
        limits: &Limits,
        now: Instant,
    ) -> Result<u16, Refusal> {
        check_connect(connect, limits.max_queue_depth)?;
        let subsystem = find_subsystem(&data.subnqn, subsystems)?;
        let controller = self
            .controllers
            .get_mut(&data.cntlid)
            .filter(|c| c.subsystem == subsystem && c.hostnqn == data.hostnqn)
            .ok_or(refuse(
                Status::CONNECT_INVALID_PARAMETERS,
                invalid::DATA_CNTLID,
            ))?;
        if subsystem.is_none() || connect.qid > limits.max_io_queues {
            return Err(refuse(Status::CONNECT_INVALID_PARAMETERS, invalid::SQE_QID));
        }
        if controller.csts & csts::RDY == 0 {
            return Err(refuse(Status::COMMAND_SEQUENCE, 0));
        }
        if !controller.io_queues.insert(connect.qid) {
            return Err(refuse(Status::COMMAND_SEQUENCE, invalid::SQE_QID));
        }
        controller.last_seen = now;
        Ok(controller.cntlid)
    }

    /// The lowest free controller ID (1–0xFFEF), after the last one handed out.
    fn free_id(&mut self) -> Option<u16> {
        for _ in 0..0xFFEF {
            self.next = if self.next >= 0xFFEF {
                1
            } else {
                self.next + 1
            };
            if !self.controllers.contains_key(&self.next) {
                return Some(self.next);
            }
        }
        None
    }
}

/// The subsystem `nqn` names: `Some(index)`, or `None` for the discovery subsystem.
fn find_subsystem(nqn: &str, subsystems: &[Subsystem]) -> Result<Option<usize>, Refusal> {
    if nqn == DISCOVERY_NQN {
        return Ok(None);
    }
    subsystems
        .iter()
        .position(|s| s.nqn == nqn)
        .map(Some)
        .ok_or(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid::DATA_SUBNQN,
        ))
}

fn check_connect(connect: &Connect, max_depth: u16) -> Result<(), Refusal> {
    if connect.recfmt != 0 {
        return Err(refuse(Status::CONNECT_FORMAT, 0));
    }
    if connect.sqsize == 0 || connect.sqsize >= max_depth {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid::SQE_SQSIZE,
        ));
    }
    if connect.cattr & !CATTR_DISABLE_SQ_FLOW != 0 {
        return Err(refuse(Status::CONNECT_INVALID_PARAMETERS, 46));
    }
    Ok(())
}

impl Controller {
    /// Whether its keep alive timer ran out at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        self.kato_ms != 0
            && now.saturating_duration_since(self.last_seen)
                > Duration::from_millis(u64::from(self.kato_ms))
    }

    /// Whether CC.EN and CSTS.RDY are set: the only state in which it takes admin and I/O
    /// commands.
    pub fn ready(&self) -> bool {
        self.cc & cc::EN != 0 && self.csts & csts::RDY != 0
    }

    /// The CAP property: `max_depth` entries per queue, 7.5 s to become ready, the NVM
    /// command set, 4 KiB pages.
    pub fn capabilities(max_depth: u16) -> u64 {
        u64::from(max_depth - 1) | 15 << 24 | 1 << 37
    }

    /// Property Get. CAP.MQES is the I/O queues' depth for a discovery controller too,
    /// as Linux's target says (a host warns when it is below the depth it asks for).
    pub fn property_get(&self, offset: u32, wide: bool, limits: &Limits) -> Result<u64, Status> {
        match (offset, wide) {
            (property::CAP, true) => Ok(Self::capabilities(limits.max_queue_depth)),
            (property::VS, false) => Ok(u64::from(VERSION_1_3)),
            (property::CC, false) => Ok(u64::from(self.cc)),
            (property::CSTS, false) => Ok(u64::from(self.csts)),
            _ => Err(Status::INVALID_FIELD.dnr()),
        }
    }

    /// Property Set: only CC is writable; enabling checks the configuration (queue entry
    /// sizes for an I/O controller, 4 KiB pages, round robin, the NVM command set) and
    /// sets CSTS.RDY or CSTS.CFS; a shutdown notification completes at once.
    pub fn property_set(&mut self, offset: u32, wide: bool, value: u64) -> Status {
        if wide || offset != property::CC {
            return Status::INVALID_FIELD.dnr();
        }
        let new = value as u32;
        let old = self.cc;
        self.cc = new;
        if new & cc::EN != 0 && old & cc::EN == 0 {
            let field = |shift: u32, mask: u32| (new >> shift) & mask;
            let entry_sizes_ok = self.subsystem.is_none()
                || (field(cc::IOSQES_SHIFT, 0xF) == 6 && field(cc::IOCQES_SHIFT, 0xF) == 4);
            let css = field(cc::CSS_SHIFT, 7);
            self.csts = if entry_sizes_ok
                && field(cc::MPS_SHIFT, 0xF) == 0
                && field(cc::AMS_SHIFT, 7) == 0
                && (css == 0 || css == 6)
            {
                csts::RDY
            } else {
                csts::CFS
            };
        }
        if new & cc::EN == 0 && old & cc::EN != 0 {
            self.csts &= !csts::RDY;
        }
        let shutdown = (new >> cc::SHN_SHIFT) & 3 != 0;
        let was_shutdown = (old >> cc::SHN_SHIFT) & 3 != 0;
        if shutdown && !was_shutdown {
            self.csts = (self.csts & !csts::RDY) | csts::SHST_COMPLETE;
        }
        if !shutdown && was_shutdown {
            self.csts &= !csts::SHST_COMPLETE;
        }
        Status::SUCCESS
    }

    /// Records a failed command in the error log and returns its status with More set.
    pub fn log_error(&mut self, sqid: u16, sqe: &Sqe, status: Status) -> Status {
        self.error_count += 1;
        let status = status.more();
        if self.errors.len() == ERROR_LOG_ENTRIES {
            self.errors.pop_back();
        }
        self.errors.push_front(ErrorEntry {
            count: self.error_count,
            sqid,
            cid: sqe.cid(),
            status_field: status.to_field(),
            location: 0xFFFF,
            lba: 0,
            nsid: sqe.nsid(),
        });
        status
    }

    /// An admin command (not a Fabrics one) whose SGL covers `transfer_len` bytes.
    pub fn admin(
        &mut self,
        sqe: &Sqe,
        transfer_len: u32,
        subsystems: &[Subsystem],
        limits: &Limits,
        port: &Port,
    ) -> Reply {
        if !self.ready() {
            return Reply::Done(Done::status(if self.subsystem.is_some() {
                Status::COMMAND_SEQUENCE.dnr()
            } else {
                Status::INVALID_OPCODE.dnr()
            }));
        }
        // The data each command moves; a mismatched SGL fails before anything is done.
        let expected = match sqe.opcode() {
            admin::IDENTIFY => IDENTIFY_LEN as u64,
            admin::GET_LOG_PAGE => GetLogPage::parse(sqe).len,
            admin::GET_FEATURES if sqe.dword(10) as u8 == feature::HOST_ID => 16,
            _ => 0,
        };
        if u64::from(transfer_len) != expected {
            return Reply::Done(Done::status(Status::SGL_INVALID_DATA.dnr()));
        }
        let done = match (sqe.opcode(), self.subsystem) {
            (admin::IDENTIFY, _) => self.identify(sqe, subsystems, limits),
            (admin::GET_LOG_PAGE, _) => self.get_log_page(sqe, subsystems, port),
            (admin::SET_FEATURES, _) => self.set_features(sqe, limits),
            (admin::GET_FEATURES, _) => self.get_features(sqe, subsystems, limits),
            (admin::KEEP_ALIVE, _) if self.kato_ms == 0 => {
                Done::status(Status::KEEP_ALIVE_INVALID.dnr())
            }
            (admin::KEEP_ALIVE, _) => Done::result(0),
            (admin::ASYNC_EVENT, _) if self.aers >= AER_LIMIT => {
                Done::status(Status::ASYNC_LIMIT.dnr())
            }
            (admin::ASYNC_EVENT, _) => {
                self.aers += 1;
                return Reply::Hold;
            }
            // Abort: nothing is ever aborted (bit 0 of the result: "not aborted").
            (admin::ABORT, Some(_)) => Done::result(1),
            _ => Done::status(Status::INVALID_OPCODE.dnr()),
        };
        Reply::Done(done)
    }

    fn identify(&self, sqe: &Sqe, subsystems: &[Subsystem], limits: &Limits) -> Done {
        let cns = sqe.dword(10) as u8;
        let csi = (sqe.dword(11) >> 24) as u8;
        let Some(index) = self.subsystem else {
            return match cns {
                identify::CNS_CONTROLLER => Done::data(self.identify_controller(None, limits)),
                _ => Done::status(Status::INVALID_FIELD.dnr()),
            };
        };
        let subsystem = &subsystems[index];
        let nsid = sqe.nsid();
        match cns {
            identify::CNS_CONTROLLER => {
                Done::data(self.identify_controller(Some(subsystem), limits))
            }
            identify::CNS_NAMESPACE if nsid == u32::MAX => Done::status(Status::INVALID_NS.dnr()),
            // An inactive namespace is all zeros, as Linux's target answers.
            identify::CNS_NAMESPACE => Done::data(
                subsystem
                    .namespace(nsid)
                    .map_or_else(|| vec![0; IDENTIFY_LEN], |ns| ns.identify().emit()),
            ),
            identify::CNS_ACTIVE_NAMESPACES => Done::data(identify::emit_namespace_list(
                subsystem.namespaces.iter().map(|ns| ns.nsid),
                nsid,
            )),
            identify::CNS_NAMESPACE_DESCRIPTORS => match subsystem.namespace(nsid) {
                Some(ns) => Done::data(ns.descriptors()),
                None => Done::status(Status::INVALID_NS.dnr()),
            },
            identify::CNS_CONTROLLER_NVM if csi == 0 => Done::data(vec![0; IDENTIFY_LEN]),
            _ => Done::status(Status::INVALID_FIELD.dnr()),
        }
    }

    /// Identify Controller data for this controller.
    pub fn identify_controller(&self, subsystem: Option<&Subsystem>, limits: &Limits) -> Vec<u8> {
        let mut id = IdentifyController {
            serial: subsystem.map_or_else(|| "discovery".into(), |s| s.serial.clone()),
            model: "roce-xdp NVMe over RDMA".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            mdts: MDTS,
            cntlid: self.cntlid,
            ver: VERSION_1_3,
            maxcmd: limits.max_queue_depth,
            sgls: SGLS_SUPPORTED | SGLS_KEYED | SGLS_OFFSETS,
            subnqn: subsystem.map_or(DISCOVERY_NQN, |s| &s.nqn).to_string(),
            ioccsz: (64 + limits.in_capsule) / 16,
            iorcsz: 1,
            msdbd: 1,
            lpa: 1 << 2,
            kas: KAS,
            ..IdentifyController::default()
        };
        match subsystem {
            None => {
                id.cntrltype = CONTROLLER_DISCOVERY;
                id.oaes = DISCOVERY_EVENTS;
            }
            Some(subsystem) => {
                id.cntrltype = CONTROLLER_IO;
                id.rab = 6;
                // Several controllers per subsystem; no ANA.
                id.cmic = 1 << 1;
                id.oaes = IO_EVENTS;
                // A 128-bit host identifier.
                id.ctratt = 1;
                id.acl = 3;
                id.aerl = AER_LIMIT - 1;
                id.frmw = 1 << 0 | 1 << 1;
                // SMART per namespace, the effects log, extended data.
                id.lpa = 1 << 0 | 1 << 1 | 1 << 2;
                id.elpe = ERROR_LOG_ENTRIES as u8 - 1;
                id.sqes = 0x66;
                id.cqes = 0x44;
                id.nn = subsystem
                    .namespaces
                    .iter()
                    .map(|ns| ns.nsid)
                    .max()
                    .unwrap_or(0);
                id.mnan = id.nn;
                id.oncs = ONCS_DSM | ONCS_WRITE_ZEROES;
                id.vwc = u8::from(subsystem.has_files());
            }
        }
        id.emit()
    }

    fn get_log_page(&self, sqe: &Sqe, subsystems: &[Subsystem], port: &Port) -> Done {
        let page = GetLogPage::parse(sqe);
        if page.offset & 3 != 0 {
            return Done::status(Status::INVALID_FIELD.dnr());
        }
        let bytes = match (page.lid, self.subsystem) {
            (log::LID_DISCOVERY, None) => {
                log::emit_discovery(0, &self.discovery_entries(subsystems, port))
            }
            (log::LID_ERROR, Some(_)) => {
                let mut bytes = vec![0u8; ERROR_LOG_ENTRIES * log::ERROR_ENTRY_LEN];
                for (slot, entry) in bytes
                    .chunks_exact_mut(log::ERROR_ENTRY_LEN)
                    .zip(&self.errors)
                {
                    slot.copy_from_slice(&entry.emit());
                }
                bytes
            }
            (log::LID_SMART, Some(index)) => {
                let subsystem = &subsystems[index];
                let nsid = sqe.nsid();
                let counted: Vec<_> = subsystem
                    .namespaces
                    .iter()
                    .filter(|ns| nsid == u32::MAX || ns.nsid == nsid)
                    .collect();
                if counted.is_empty() {
                    return Done::status(Status::INVALID_NS.dnr());
                }
                let sum = |f: fn(&super::subsystem::Counters) -> u64| {
                    counted.iter().map(|ns| f(&ns.counters)).sum::<u64>()
                };
                Smart {
                    // 20 °C, and every spare block available.
                    temperature: 293,
                    available_spare: 100,
                    data_units_read: sum(|c| c.blocks_read).div_ceil(1000),
                    data_units_written: sum(|c| c.blocks_written).div_ceil(1000),
                    host_reads: sum(|c| c.reads),
                    host_writes: sum(|c| c.writes),
                    error_entries: self.error_count,
                }
                .emit()
            }
            (log::LID_FIRMWARE_SLOT, Some(_)) => vec![0; log::FIRMWARE_SLOT_LEN],
            (log::LID_CHANGED_NAMESPACES, Some(_)) => vec![0; log::CHANGED_NAMESPACES_LEN],
            (log::LID_EFFECTS, Some(_)) => log::emit_effects(&ADMIN_COMMANDS, &IO_COMMANDS),
            _ => return Done::status(Status::INVALID_FIELD.dnr()),
        };
        match log::window(&bytes, page.offset, page.len as usize) {
            Some(data) => Done::data(data),
            None => Done::status(Status::INVALID_FIELD.dnr()),
        }
    }

    /// The subsystems this controller's host may reach, where this port serves them.
    pub fn discovery_entries(&self, subsystems: &[Subsystem], port: &Port) -> Vec<DiscoveryEntry> {
        subsystems
            .iter()
            .filter(|s| s.hosts.allows(&self.hostnqn))
            .map(|s| DiscoveryEntry {
                trtype: log::TRTYPE_RDMA,
                adrfam: port.adrfam,
                subtype: log::SUBTYPE_NVME,
                treq: 0,
                portid: 1,
                cntlid: CNTLID_DYNAMIC,
                asqsz: ADMIN_QUEUE_DEPTH,
                trsvcid: port.trsvcid.clone(),
                subnqn: s.nqn.clone(),
                traddr: port.traddr.clone(),
                rdma: [
                    log::RDMA_QPTYPE_CONNECTED,
                    log::RDMA_PRTYPE_NOT_SPECIFIED,
                    log::RDMA_CMS_RDMA_CM,
                ],
            })
            .collect()
    }

    fn events_supported(&self) -> u32 {
        if self.subsystem.is_some() {
            IO_EVENTS
        } else {
            DISCOVERY_EVENTS
        }
    }

    fn set_features(&mut self, sqe: &Sqe, limits: &Limits) -> Done {
        let value = sqe.dword(11);
        match (sqe.dword(10) as u8, self.subsystem) {
            (feature::NUMBER_OF_QUEUES, Some(_)) => {
                if value & 0xFFFF == 0xFFFF || value >> 16 == 0xFFFF {
                    return Done::status(Status::INVALID_FIELD.dnr());
                }
                Done::result(queues_result(limits))
            }
            (feature::KEEP_ALIVE_TIMER, _) => {
                // Whole seconds, as the granularity (KAS) says.
                self.kato_ms = value.div_ceil(1000).saturating_mul(1000);
                Done::result(u64::from(self.kato_ms / 1000))
            }
            (feature::ASYNC_EVENT_CONFIG, _) => {
                if value & !self.events_supported() != 0 {
                    return Done::status(Status::INVALID_FIELD.dnr());
                }
                self.aen = value;
                Done::result(u64::from(value))
            }
            (feature::HOST_ID, Some(_)) => Done::status(Status::COMMAND_SEQUENCE.dnr()),
            _ => Done::status(Status::INVALID_FIELD.dnr()),
        }
    }

    fn get_features(&self, sqe: &Sqe, subsystems: &[Subsystem], limits: &Limits) -> Done {
        match (sqe.dword(10) as u8, self.subsystem) {
            (feature::NUMBER_OF_QUEUES, Some(_)) => Done::result(queues_result(limits)),
            (feature::KEEP_ALIVE_TIMER, _) => Done::result(u64::from(self.kato_ms)),
            (feature::ASYNC_EVENT_CONFIG, _) => Done::result(u64::from(self.aen)),
            (feature::VOLATILE_WRITE_CACHE, Some(index)) => {
                Done::result(u64::from(subsystems[index].has_files()))
            }
            // The 128-bit identifier, asked for with EXHID.
            (feature::HOST_ID, Some(_)) if sqe.dword(11) & 1 == 1 => {
                Done::data(self.hostid.to_vec())
            }
            _ => Done::status(Status::INVALID_FIELD.dnr()),
        }
    }
}

/// Number of Queues' result: I/O submission and completion queues allocated, 0's based.
fn queues_result(limits: &Limits) -> u64 {
    let queues = u64::from(limits.max_io_queues.max(1) - 1);
    queues | queues << 16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::subsystem::HostAccess;
    use crate::wire::fabrics::{Fabrics, CONNECT_DATA_LEN};
    use crate::wire::identify::IdentifyController;

    const SUBNQN: &str = "nqn.2026-12.io.roce-xdp:test";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:1";

    fn subsystems(hosts: HostAccess) -> Vec<Subsystem> {
        vec![Subsystem {
            nqn: SUBNQN.into(),
            serial: "0123".into(),
            hosts,
            namespaces: Vec::new(),
        }]
    }

    fn connect(qid: u16, sqsize: u16) -> Connect {
        Connect {
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato: 5000,
        }
    }

    fn data(subnqn: &str, cntlid: u16) -> ConnectData {
        ConnectData {
            hostid: [1; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: HOST.into(),
        }
    }

    fn port() -> Port {
        Port {
            adrfam: log::ADRFAM_IPV4,
            traddr: "10.0.0.1".into(),
            trsvcid: "4420".into(),
        }
    }

    fn status(result: Result<u16, Refusal>) -> Option<(Status, u32)> {
        result.err().map(|r| (r.status, r.location))
    }

    #[test]
    fn connects_as_linux_target_checks_them() {
        let now = Instant::now();
        let limits = Limits::default();
        let subsystems = subsystems(HostAccess::Only(vec![HOST.into()]));
        let mut registry = Registry::default();
        let d = data(SUBNQN, CNTLID_DYNAMIC);
        let invalid = Status::CONNECT_INVALID_PARAMETERS.dnr();
        // Bad format, sizes, controller ID, subsystem, host.
        let mut bad = connect(0, 31);
        bad.recfmt = 1;
        assert_eq!(
            status(registry.admin_connect(&bad, &d, &subsystems, now)),
            Some((Status::CONNECT_FORMAT.dnr(), 0))
        );
        for sqsize in [0, 32] {
            assert_eq!(
                status(registry.admin_connect(&connect(0, sqsize), &d, &subsystems, now)),
                Some((invalid, invalid::SQE_SQSIZE))
            );
        }
        assert_eq!(
            status(registry.admin_connect(&connect(0, 31), &data(SUBNQN, 1), &subsystems, now)),
            Some((invalid, invalid::DATA_CNTLID))
        );
        assert_eq!(
            status(registry.admin_connect(
                &connect(0, 31),
                &data("nqn.other", CNTLID_DYNAMIC),
                &subsystems,
                now
            )),
            Some((invalid, invalid::DATA_SUBNQN))
        );
        let mut stranger = d.clone();
        stranger.hostnqn = "nqn.stranger".into();
        assert_eq!(
            status(registry.admin_connect(&connect(0, 31), &stranger, &subsystems, now)),
            Some((Status::CONNECT_INVALID_HOST.dnr(), invalid::DATA_HOSTNQN))
        );
        // The discovery subsystem takes any host.
        assert!(registry
            .admin_connect(
                &connect(0, 31),
                &ConnectData {
                    subnqn: DISCOVERY_NQN.into(),
                    ..stranger
                },
                &subsystems,
                now
            )
            .is_ok());
        let cntlid = registry
            .admin_connect(&connect(0, 31), &d, &subsystems, now)
            .unwrap();
        // I/O queues: only once the controller is enabled, each ID once, within limits.
        let io = data(SUBNQN, cntlid);
        assert_eq!(
            status(registry.io_connect(&connect(1, 127), &io, &subsystems, &limits, now)),
            Some((Status::COMMAND_SEQUENCE.dnr(), 0))
        );
        let controller = registry.controllers.get_mut(&cntlid).unwrap();
        assert_eq!(
            controller.property_set(property::CC, false, 0x0046_0001),
            Status::SUCCESS
        );
        assert!(controller.ready());
        assert_eq!(
            registry.io_connect(&connect(1, 127), &io, &subsystems, &limits, now),
            Ok(cntlid)
        );
        assert_eq!(
            status(registry.io_connect(&connect(1, 127), &io, &subsystems, &limits, now)),
            Some((Status::COMMAND_SEQUENCE.dnr(), invalid::SQE_QID))
        );
        assert_eq!(
            status(registry.io_connect(&connect(9, 127), &io, &subsystems, &limits, now)),
            Some((invalid, invalid::SQE_QID))
        );
        assert_eq!(
            status(registry.io_connect(&connect(2, 128), &io, &subsystems, &limits, now)),
            Some((invalid, invalid::SQE_SQSIZE))
        );
        assert_eq!(
            status(registry.io_connect(
                &connect(2, 127),
                &data(SUBNQN, 77),
                &subsystems,
                &limits,
                now
            )),
            Some((invalid, invalid::DATA_CNTLID))
        );
        assert_eq!(CONNECT_DATA_LEN, 1024);
    }

    #[test]
    fn enabling_checks_the_configuration_and_shutdown_completes() {
        let now = Instant::now();
        let subsystems = subsystems(HostAccess::Any);
        let mut registry = Registry::default();
        let cntlid = registry
            .admin_connect(
                &connect(0, 31),
                &data(SUBNQN, CNTLID_DYNAMIC),
                &subsystems,
                now,
            )
            .unwrap();
        let c = registry.controllers.get_mut(&cntlid).unwrap();
        let limits = Limits::default();
        assert_eq!(
            c.property_get(property::CAP, true, &limits),
            Ok(127 | 15 << 24 | 1 << 37)
        );
        assert_eq!(
            c.property_get(property::CAP, false, &limits),
            Err(Status::INVALID_FIELD.dnr())
        );
        assert_eq!(
            c.property_set(property::CSTS, false, 1),
            Status::INVALID_FIELD.dnr()
        );
        // Linux's first write: disabled, CSS 6; then enabled.
        c.property_set(property::CC, false, 0x0046_0060);
        assert_eq!(c.property_get(property::CSTS, false, &limits), Ok(0));
        c.property_set(property::CC, false, 0x0046_0061);
        assert_eq!(c.property_get(property::CSTS, false, &limits), Ok(1));
        c.property_set(property::CC, false, 0x0046_4061);
        assert_eq!(c.property_get(property::CSTS, false, &limits), Ok(8));
        // Wrong queue entry sizes: controller fatal status.
        c.property_set(property::CC, false, 0);
        c.property_set(property::CC, false, 0x0055_0001);
        assert_eq!(c.property_get(property::CSTS, false, &limits), Ok(2));
    }

    #[test]
    fn admin_commands() {
        let now = Instant::now();
        let subsystems = subsystems(HostAccess::Any);
        let limits = Limits::default();
        let mut registry = Registry::default();
        let cntlid = registry
            .admin_connect(
                &connect(0, 31),
                &data(SUBNQN, CNTLID_DYNAMIC),
                &subsystems,
                now,
            )
            .unwrap();
        let c = registry.controllers.get_mut(&cntlid).unwrap();
        let mut identify = Sqe::new(admin::IDENTIFY, 1);
        identify.set_dword(10, 1);
        let run =
            |c: &mut Controller, sqe: &Sqe, len| c.admin(sqe, len, &subsystems, &limits, &port());
        // Not yet enabled.
        assert_eq!(
            run(c, &identify, 4096),
            Reply::Done(Done::status(Status::COMMAND_SEQUENCE.dnr()))
        );
        c.property_set(property::CC, false, 0x0046_0001);
        let Reply::Done(done) = run(c, &identify, 4096) else {
            panic!()
        };
        let id = IdentifyController::parse(done.data.as_deref().unwrap()).unwrap();
        assert_eq!(
            (id.cntlid, id.subnqn.as_str(), id.mdts),
            (cntlid, SUBNQN, MDTS)
        );
        assert!(id.kas > 0 && id.sgls & SGLS_KEYED != 0);
        assert_eq!(id.in_capsule_len(), limits.in_capsule);
        // The SGL must cover the data exactly.
        assert_eq!(
            run(c, &identify, 512),
            Reply::Done(Done::status(Status::SGL_INVALID_DATA.dnr()))
        );
        // Unknown opcode, unknown CNS, log page, feature.
        assert_eq!(
            run(c, &Sqe::new(0x7E, 2), 0),
            Reply::Done(Done::status(Status::INVALID_OPCODE.dnr()))
        );
        identify.set_dword(10, 0x17);
        assert_eq!(
            run(c, &identify, 4096),
            Reply::Done(Done::status(Status::INVALID_FIELD.dnr()))
        );
        let mut get_log = Sqe::new(admin::GET_LOG_PAGE, 3);
        GetLogPage {
            lid: 0x42,
            lsp: 0,
            rae: false,
            len: 512,
            offset: 0,
        }
        .emit(&mut get_log);
        assert_eq!(
            run(c, &get_log, 512),
            Reply::Done(Done::status(Status::INVALID_FIELD.dnr()))
        );
        let mut features = Sqe::new(admin::SET_FEATURES, 4);
        features.set_dword(10, u32::from(feature::NUMBER_OF_QUEUES));
        features.set_dword(11, 0x0003_0003);
        assert_eq!(run(c, &features, 0), Reply::Done(Done::result(0x0007_0007)));
        // Asynchronous event requests: held, up to the limit.
        let aer = Sqe::new(admin::ASYNC_EVENT, 5);
        for _ in 0..AER_LIMIT {
            assert_eq!(run(c, &aer, 0), Reply::Hold);
        }
        assert_eq!(
            run(c, &aer, 0),
            Reply::Done(Done::status(Status::ASYNC_LIMIT.dnr()))
        );
        // Keep alive; the error log holds what failed.
        assert_eq!(
            run(c, &Sqe::new(admin::KEEP_ALIVE, 6), 0),
            Reply::Done(Done::result(0))
        );
        c.log_error(0, &identify, Status::INVALID_FIELD.dnr());
        let mut error_log = Sqe::new(admin::GET_LOG_PAGE, 7);
        GetLogPage {
            lid: log::LID_ERROR,
            lsp: 0,
            rae: false,
            len: 64,
            offset: 0,
        }
        .emit(&mut error_log);
        let Reply::Done(done) = run(c, &error_log, 64) else {
            panic!()
        };
        let entry = ErrorEntry::parse(done.data.as_deref().unwrap()).unwrap();
        assert_eq!((entry.count, entry.cid), (1, identify.cid()));
        let _ = Fabrics::Disconnect { recfmt: 0 };
    }

    #[test]
    fn discovery_lists_what_the_host_may_reach() {
        let now = Instant::now();
        let subsystems = subsystems(HostAccess::Only(vec!["nqn.friend".into()]));
        let mut registry = Registry::default();
        let discovery = |host: &str| ConnectData {
            hostid: [0; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: DISCOVERY_NQN.into(),
            hostnqn: host.into(),
        };
        // A discovery host asking for no keep alive gets Linux's 2 minutes.
        let mut without_kato = connect(0, 31);
        without_kato.kato = 0;
        for (host, entries) in [("nqn.friend", 1), ("nqn.stranger", 0)] {
            let cntlid = registry
                .admin_connect(&without_kato, &discovery(host), &subsystems, now)
                .unwrap();
            let c = registry.controllers.get_mut(&cntlid).unwrap();
            assert_eq!(c.kato_ms, DISCOVERY_KATO_MS);
            c.property_set(property::CC, false, 1);
            let mut get_log = Sqe::new(admin::GET_LOG_PAGE, 1);
            let len = 1024 * (1 + entries);
            GetLogPage {
                lid: log::LID_DISCOVERY,
                lsp: 0,
                rae: false,
                len,
                offset: 0,
            }
            .emit(&mut get_log);
            let Reply::Done(done) = c.admin(
                &get_log,
                len as u32,
                &subsystems,
                &Limits::default(),
                &port(),
            ) else {
                panic!()
            };
            let page = done.data.unwrap();
            assert_eq!(log::parse_discovery_header(&page), Some((0, entries)));
            if entries == 1 {
                let entry = DiscoveryEntry::parse(&page[1024..]).unwrap();
                assert_eq!(
                    (entry.subnqn.as_str(), entry.traddr.as_str()),
                    (SUBNQN, "10.0.0.1")
                );
            }
            // A discovery controller has no I/O commands' logs.
            let mut smart = Sqe::new(admin::GET_LOG_PAGE, 2);
            GetLogPage {
                lid: log::LID_SMART,
                lsp: 0,
                rae: false,
                len: 512,
                offset: 0,
            }
            .emit(&mut smart);
            assert_eq!(
                c.admin(&smart, 512, &subsystems, &Limits::default(), &port()),
                Reply::Done(Done::status(Status::INVALID_FIELD.dnr()))
            );
        }
    }
}

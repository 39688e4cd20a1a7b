//! Ethernet frames in pcap and pcapng files, as tcpdump and Wireshark read and write them.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, Endianness};

use crate::backend::{Backend, Fill};

/// Why a capture file could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The file could not be opened or read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a pcap or pcapng file, or a record is damaged.
    #[error("not a readable pcap/pcapng file: {0}")]
    Format(String),
    /// A link type other than Ethernet.
    #[error("link type {0} is not Ethernet")]
    LinkType(String),
}

impl From<pcap_file::PcapError> for CaptureError {
    fn from(error: pcap_file::PcapError) -> Self {
        CaptureError::Format(error.to_string())
    }
}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedFrame {
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// The frame from the Ethernet header on (as captured: possibly truncated to the snap length).
    pub data: Vec<u8>,
}

enum Format {
    Pcap(PcapReader<BufReader<File>>),
    /// pcapng names a link type per interface; frames refer to interfaces by index.
    PcapNg(PcapNgReader<BufReader<File>>, Vec<DataLink>),
}

/// Iterates over the Ethernet frames of a pcap or pcapng file.
pub struct CaptureReader {
    format: Format,
}

const PCAPNG_MAGIC: [u8; 4] = [0x0A, 0x0D, 0x0D, 0x0A];

impl CaptureReader {
    /// Opens a file, telling pcap from pcapng by its first bytes.
    pub fn open(path: &Path) -> Result<Self, CaptureError> {
        let mut magic = [0u8; 4];
        File::open(path)?.read_exact(&mut magic)?;
        let file = BufReader::new(File::open(path)?);
        let format = if magic == PCAPNG_MAGIC {
            Format::PcapNg(PcapNgReader::new(file)?, Vec::new())
        } else {
            let reader = PcapReader::new(file)?;
            let link = reader.header().datalink;
            if link != DataLink::ETHERNET {
                return Err(CaptureError::LinkType(format!("{link:?}")));
            }
            Format::Pcap(reader)
        };
        Ok(CaptureReader { format })
    }

    fn next_frame(&mut self) -> Option<Result<CapturedFrame, CaptureError>> {
        match &mut self.format {
            Format::Pcap(reader) => {
                let packet = reader.next_packet()?;
                Some(
                    packet
                        .map_err(CaptureError::from)
                        .map(|packet| CapturedFrame {
                            timestamp: packet.timestamp,
                            data: packet.data.into_owned(),
                        }),
                )
            }
            Format::PcapNg(reader, links) => loop {
                let block = match reader.next_block()? {
                    Ok(block) => block,
                    Err(error) => return Some(Err(error.into())),
                };
                let (interface, timestamp, data) = match block {
                    Block::InterfaceDescription(interface) => {
                        links.push(interface.linktype);
                        continue;
                    }
                    Block::EnhancedPacket(packet) => {
                        (packet.interface_id as usize, packet.timestamp, packet.data)
                    }
                    Block::SimplePacket(packet) => (0, Duration::ZERO, packet.data),
                    _ => continue,
                };
                return Some(match links.get(interface) {
                    Some(DataLink::ETHERNET) => Ok(CapturedFrame {
                        timestamp,
                        data: data.into_owned(),
                    }),
                    Some(link) => Err(CaptureError::LinkType(format!("{link:?}"))),
                    None => Err(CaptureError::Format(format!(
                        "unknown interface {interface}"
                    ))),
                });
            },
        }
    }
}

impl Iterator for CaptureReader {
    type Item = Result<CapturedFrame, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_frame()
    }
}

/// Reads every frame of a capture file.
pub fn read_frames(path: &Path) -> Result<Vec<CapturedFrame>, CaptureError> {
    CaptureReader::open(path)?.collect()
}

/// Wraps a backend and writes every frame it sends or receives to a pcap file, readable by
/// `roce dump` and Wireshark.
///
/// Records gather in memory and reach the file whole, one write(2) of whole records at a
/// time: at least every [`FLUSH_INTERVAL`] while frames flow, before the backend waits, on
/// [`flush`](Self::flush) or a [`CaptureFlusher`]'s, on drop, and when the process exits
/// (exit(3), a return from `main`): a C program that never closes its device, or a Rust one
/// that calls `std::process::exit`, drops nothing. So a run stopped by a signal leaves a file
/// that ends with a whole record, missing at most the last interval.
pub struct PcapRecorder<B> {
    inner: B,
    writer: PcapWriter<SharedFile>,
    /// The same file as the writer's, kept to flush it (pcap-file lends no `get_mut`).
    file: SharedFile,
    last_flush: Instant,
}

/// Longest records wait in memory while frames flow.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// Most bytes of records held in memory before they are written.
const FLUSH_SIZE: usize = 256 << 10;

/// A file whose writes gather in memory until `flush`, which writes them in one call. The
/// writer hands it whole records between flushes, so the file only ever grows by whole
/// records.
#[derive(Clone)]
struct SharedFile(Arc<Mutex<Gathered>>);

struct Gathered {
    file: File,
    pending: Vec<u8>,
    /// The process that created the recorder: a child forked since shares the memory of
    /// what was pending, not the duty to write it.
    owner: u32,
}

impl SharedFile {
    fn pending_len(&self) -> usize {
        self.0.lock().map_or(0, |gathered| gathered.pending.len())
    }
}

impl Write for SharedFile {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let mut gathered = self.0.lock().map_err(|_| io::Error::other("poisoned"))?;
        gathered.pending.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let mut gathered = self.0.lock().map_err(|_| io::Error::other("poisoned"))?;
        let Gathered { file, pending, .. } = &mut *gathered;
        let result = file.write_all(pending);
        pending.clear();
        result
    }
}

/// Every recorder's file, so [`flush_all`] reaches the ones deep inside an engine.
static LIVE: Mutex<Vec<Weak<Mutex<Gathered>>>> = Mutex::new(Vec::new());

/// Writes every whole record gathered so far by every live [`PcapRecorder`] to its file:
/// for an exit path that cannot reach the recorders, such as a Ctrl-C/SIGTERM handler
/// running on its own thread (the `ctrlc` crate's). Not for a raw signal handler: it locks.
pub fn flush_all() -> io::Result<()> {
    let live = LIVE.lock().map_err(|_| io::Error::other("poisoned"))?;
    let mut result = Ok(());
    for file in live.iter().filter_map(Weak::upgrade) {
        let flushed = SharedFile(file).flush();
        result = result.and(flushed);
    }
    result
}

/// [`flush_all`] for the files of this process, as it exits (registered with atexit(3) by
/// the first recorder). Bounded: a lock held by a thread that exit(3) stopped for good would
/// otherwise hang the exit, so each is tried for a moment and given up.
extern "C" fn flush_at_exit() {
    let me = std::process::id();
    let Some(live) = lock_briefly(&LIVE) else {
        return;
    };
    for file in live.iter().filter_map(Weak::upgrade) {
        if let Some(mut gathered) = lock_briefly(&file) {
            if gathered.owner == me {
                let Gathered { file, pending, .. } = &mut *gathered;
                let _ = file.write_all(pending);
                pending.clear();
            }
        }
    }
}

/// `mutex`'s guard, if it comes free within 100 ms (never poisoned: only whole records are
/// added under it).
fn lock_briefly<T>(mutex: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    let deadline = Instant::now() + Duration::from_millis(100);
    loop {
        match mutex.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

/// Flushes a [`PcapRecorder`]'s file from anywhere, e.g. a thread that watches for signals
/// while the recorder sits inside an engine.
#[derive(Clone)]
pub struct CaptureFlusher(SharedFile);

impl CaptureFlusher {
    /// Writes every whole record gathered so far to the file.
    pub fn flush(&self) -> io::Result<()> {
        self.0.clone().flush()
    }
}

impl<B: Backend> PcapRecorder<B> {
    /// Records `inner`'s traffic into a new file at `path`.
    pub fn create(inner: B, path: &Path) -> Result<Self, CaptureError> {
        let gathered = Gathered {
            file: File::create(path)?,
            pending: Vec::with_capacity(FLUSH_SIZE),
            owner: std::process::id(),
        };
        static AT_EXIT: std::sync::Once = std::sync::Once::new();
        AT_EXIT.call_once(|| {
            #[allow(unsafe_code)]
            // SAFETY: registers an `extern "C"` function without arguments that does not
            // panic, to run at exit(3); it stays loaded, being part of this binary or of a
            // library that is not unloaded while a recorder lives.
            unsafe {
                libc::atexit(flush_at_exit);
            }
        });
        let mut file = SharedFile(Arc::new(Mutex::new(gathered)));
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|file| file.strong_count() > 0);
            live.push(Arc::downgrade(&file.0));
        }
        let writer = PcapWriter::with_header(file.clone(), pcap_header())?;
        file.flush()?;
        Ok(PcapRecorder {
            inner,
            writer,
            file,
            last_flush: Instant::now(),
        })
    }

    /// A handle that flushes this recorder's file from another thread.
    pub fn flusher(&self) -> CaptureFlusher {
        CaptureFlusher(self.file.clone())
    }

    /// Writes every whole record gathered so far to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.last_flush = Instant::now();
        self.file.flush()
    }

    /// Flushes when records have waited [`FLUSH_INTERVAL`] or fill the buffer.
    fn flush_if_due(&mut self) -> io::Result<()> {
        let pending = self.file.pending_len();
        if pending >= FLUSH_SIZE || (pending > 0 && self.last_flush.elapsed() >= FLUSH_INTERVAL) {
            self.flush()?;
        }
        Ok(())
    }
}

/// Writes one record.
fn record(writer: &mut PcapWriter<SharedFile>, frame: &[u8]) -> io::Result<()> {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let packet = PcapPacket::new(since_epoch, frame.len() as u32, frame);
    writer
        .write_packet(&packet)
        .map(|_| ())
        .map_err(io::Error::other)
}

impl<B: Backend> Backend for PcapRecorder<B> {
    fn receive(&mut self, budget: usize, handler: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let (writer, mut failed) = (&mut self.writer, Ok(()));
        let received = self.inner.receive(budget, &mut |frame| {
            if failed.is_ok() {
                failed = record(writer, frame);
            }
            handler(frame);
        })?;
        failed?;
        self.flush_if_due()?;
        Ok(received)
    }

    fn transmit(&mut self, len: usize, flow: u16, fill: Fill<'_>) -> io::Result<()> {
        let (writer, mut failed) = (&mut self.writer, Ok(()));
        self.inner.transmit(len, flow, &mut |buffer| {
            let written = fill(buffer);
            if written > 0 {
                failed = record(writer, &buffer[..written.min(buffer.len())]);
            }
            written
        })?;
        failed
    }

    fn submit(&mut self) -> io::Result<()> {
        self.inner.submit()?;
        self.flush_if_due()
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        // Idle time: nothing recorded waits through it.
        if self.file.pending_len() > 0 {
            self.flush()?;
        }
        self.inner.wait(timeout)
    }

    fn readiness_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.readiness_fd()
    }

    fn listen(&mut self, on: bool) -> io::Result<()> {
        self.inner.listen(on)
    }

    fn received_per_queue(&self) -> Vec<u64> {
        self.inner.received_per_queue()
    }

    fn loops_back(&self) -> bool {
        self.inner.loops_back()
    }
}

impl<B> Drop for PcapRecorder<B> {
    fn drop(&mut self) {
        let _ = self.file.flush();
    }
}

fn pcap_header() -> PcapHeader {
    PcapHeader {
        datalink: DataLink::ETHERNET,
        endianness: Endianness::Little,
        ..PcapHeader::default()
    }
}

/// Writes frames to a new pcap file (Ethernet link type, microsecond timestamps).
pub fn write_frames<'a>(
    path: &Path,
    frames: impl IntoIterator<Item = &'a CapturedFrame>,
) -> Result<(), CaptureError> {
    let mut writer = PcapWriter::with_header(BufWriter::new(File::create(path)?), pcap_header())?;
    for frame in frames {
        let len = u32::try_from(frame.data.len())
            .map_err(|_| CaptureError::Format("frame longer than 4 GiB".into()))?;
        writer.write_packet(&PcapPacket::new(frame.timestamp, len, &frame.data))?;
    }
    writer
        .into_writer()
        .into_inner()
        .map_err(|e| CaptureError::Io(e.into_error()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_frames_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("frames.pcap");
        let frames: Vec<CapturedFrame> = (0u8..5)
            .map(|i| CapturedFrame {
                timestamp: Duration::from_micros(1_000_000 + u64::from(i)),
                data: vec![i; 60 + usize::from(i)],
            })
            .collect();
        write_frames(&path, &frames).unwrap();
        assert_eq!(read_frames(&path).unwrap(), frames);
    }

    #[test]
    fn recorder_keeps_both_directions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recorded.pcap");
        let (a, mut b) = crate::memory::memory_pair();
        let mut recorded = PcapRecorder::create(a, &path).unwrap();
        recorded.send(&[1; 60]).unwrap();
        b.send(&[2; 70]).unwrap();
        let mut buffer = [0u8; 128];
        recorded.wait(Some(Duration::from_secs(1))).unwrap();
        assert_eq!(recorded.recv(&mut buffer).unwrap(), Some(70));
        drop(recorded);
        let frames: Vec<Vec<u8>> = read_frames(&path)
            .unwrap()
            .into_iter()
            .map(|f| f.data)
            .collect();
        assert_eq!(frames, [vec![1; 60], vec![2; 70]]);
    }

    /// The frames the file at `path` holds right now, checking it ends with a whole record.
    fn on_disk(path: &Path) -> Vec<Vec<u8>> {
        let frames: Vec<Vec<u8>> = read_frames(path)
            .unwrap()
            .into_iter()
            .map(|frame| frame.data)
            .collect();
        let whole: usize = 24 + frames.iter().map(|frame| 16 + frame.len()).sum::<usize>();
        assert_eq!(std::fs::metadata(path).unwrap().len() as usize, whole);
        frames
    }

    #[test]
    fn records_reach_the_file_whole_while_the_recorder_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.pcap");
        let (a, _b) = crate::memory::memory_pair();
        let mut recorded = PcapRecorder::create(a, &path).unwrap();
        assert!(
            on_disk(&path).is_empty(),
            "the header is there from the start"
        );
        recorded.send(&[1; 60]).unwrap();
        recorded.send(&[2; 61]).unwrap();
        // From another thread, as a signal-watching thread of a tool would.
        let flusher = recorded.flusher();
        std::thread::spawn(move || flusher.flush().unwrap())
            .join()
            .unwrap();
        assert_eq!(on_disk(&path), [vec![1; 60], vec![2; 61]]);
        // Without a handle to it, as a Ctrl-C handler would.
        recorded.send(&[5; 64]).unwrap();
        std::thread::spawn(|| flush_all().unwrap()).join().unwrap();
        assert_eq!(on_disk(&path).len(), 3);
        // Periodically, while the engine keeps turning.
        recorded.send(&[3; 62]).unwrap();
        std::thread::sleep(FLUSH_INTERVAL);
        recorded.receive(1, &mut |_| {}).unwrap();
        assert_eq!(on_disk(&path).len(), 4);
        // Before the backend waits.
        recorded.send(&[4; 63]).unwrap();
        recorded.wait(Some(Duration::ZERO)).unwrap();
        assert_eq!(on_disk(&path).len(), 5);
        drop(recorded);
    }

    /// Set in the child of the exit test: the capture it records to.
    const EXIT_CHILD: &str = "ROCE_CAPTURE_EXIT_TEST_PCAP";

    #[test]
    fn records_reach_the_file_when_the_process_exits_without_dropping_the_recorder() {
        if let Some(path) = std::env::var_os(EXIT_CHILD) {
            // The child: two frames gathered, well within the flush interval, and an exit
            // that drops nothing.
            let (a, _b) = crate::memory::memory_pair();
            let mut recorded = PcapRecorder::create(a, Path::new(&path)).unwrap();
            recorded.send(&[7; 60]).unwrap();
            recorded.send(&[8; 61]).unwrap();
            std::process::exit(0);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exit.pcap");
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "capture::tests::records_reach_the_file_when_the_process_exits_without_dropping_the_recorder",
                "--test-threads=1",
            ])
            .env(EXIT_CHILD, &path)
            .output()
            .unwrap();
        assert!(child.status.success(), "{child:?}");
        assert_eq!(on_disk(&path), [vec![7; 60], vec![8; 61]]);
    }

    #[test]
    fn garbage_is_a_format_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("garbage.pcap");
        std::fs::write(&path, b"definitely not a capture file").unwrap();
        assert!(matches!(read_frames(&path), Err(CaptureError::Format(_))));
        assert!(matches!(
            read_frames(&dir.path().join("absent")),
            Err(CaptureError::Io(_))
        ));
    }
}

//! Ethernet frames in pcap and pcapng files, as tcpdump and Wireshark read and write them.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, Endianness};

use crate::backend::Backend;

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
pub struct PcapRecorder<B> {
    inner: B,
    writer: PcapWriter<SharedFile>,
    /// The same file as the writer's, kept to flush it (pcap-file lends no `get_mut`).
    file: SharedFile,
}

/// A buffered file that several owners can write and flush.
#[derive(Clone)]
struct SharedFile(Arc<Mutex<BufWriter<File>>>);

impl Write for SharedFile {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?
            .write(bytes)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?
            .flush()
    }
}

impl<B: Backend> PcapRecorder<B> {
    /// Records `inner`'s traffic into a new file at `path`.
    pub fn create(inner: B, path: &Path) -> Result<Self, CaptureError> {
        let file = SharedFile(Arc::new(Mutex::new(BufWriter::new(File::create(path)?))));
        let writer = PcapWriter::with_header(file.clone(), pcap_header())?;
        Ok(PcapRecorder {
            inner,
            writer,
            file,
        })
    }

    fn record(&mut self, frame: &[u8]) -> io::Result<()> {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let packet = PcapPacket::new(since_epoch, frame.len() as u32, frame);
        self.writer
            .write_packet(&packet)
            .map(|_| ())
            .map_err(io::Error::other)
    }

    /// Flushes the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl<B: Backend> Backend for PcapRecorder<B> {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.record(frame)?;
        self.inner.send(frame)
    }

    fn recv(&mut self, buffer: &mut [u8]) -> io::Result<Option<usize>> {
        let received = self.inner.recv(buffer)?;
        if let Some(len) = received {
            self.record(&buffer[..len])?;
        }
        Ok(received)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.wait(timeout)
    }

    fn readiness_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.readiness_fd()
    }

    fn received_per_queue(&self) -> Vec<u64> {
        self.inner.received_per_queue()
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

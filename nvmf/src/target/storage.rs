//! What a namespace stores its blocks in: a memory region of its own (RAM), or a file or
//! block device. A RAM namespace is registered memory, so the host's data moves straight
//! between it and the host with RDMA READ and WRITE; a file is read and written through
//! staging buffers.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use roce_verbs::{AccessFlags, Mr, Pd};

/// Where a namespace's blocks live, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// This many bytes of zeroed memory.
    Ram(u64),
    /// A regular file or a block device, read and written in place.
    File(PathBuf),
}

/// A namespace's blocks.
pub(crate) enum Storage {
    /// Registered memory: RDMA READs of host data land in it, RDMA WRITEs to the host
    /// leave from it.
    Ram(Mr),
    /// A file or block device.
    File(File),
}

/// Chunk in which zeros are written to a file.
const ZERO_CHUNK: usize = 1 << 20;

impl Storage {
    /// Opens or allocates the storage; the size is a whole number of blocks.
    pub(crate) fn open(backing: &Backing, pd: &Pd) -> io::Result<(Storage, u64)> {
        match backing {
            Backing::Ram(bytes) => {
                let len = usize::try_from(*bytes)
                    .map_err(|_| io::Error::other("a RAM namespace larger than memory"))?;
                let mr = pd
                    .reg_mr(len, AccessFlags::LOCAL_WRITE)
                    .map_err(|error| io::Error::other(format!("RAM namespace: {error}")))?;
                Ok((Storage::Ram(mr), *bytes))
            }
            Backing::File(path) => {
                let mut file = open(path)?;
                let size = file.seek(SeekFrom::End(0))?;
                Ok((Storage::File(file), size))
            }
        }
    }

    /// The region, for a RAM namespace.
    pub(crate) fn region(&self) -> Option<&Mr> {
        match self {
            Storage::Ram(mr) => Some(mr),
            Storage::File(_) => None,
        }
    }

    /// Reads `len` bytes at `offset`.
    pub(crate) fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        match self {
            Storage::Ram(mr) => mr
                .read(to_usize(offset)?, &mut out)
                .map_err(io::Error::other)?,
            Storage::File(file) => file.read_exact_at(&mut out, offset)?,
        }
        Ok(out)
    }

    /// Writes `data` at `offset`; with `durable`, it is on stable storage when this returns.
    pub(crate) fn write(&self, offset: u64, data: &[u8], durable: bool) -> io::Result<()> {
        match self {
            Storage::Ram(mr) => mr.write(to_usize(offset)?, data).map_err(io::Error::other),
            Storage::File(file) => {
                file.write_all_at(data, offset)?;
                if durable {
                    file.sync_data()?;
                }
                Ok(())
            }
        }
    }

    /// Makes everything written so far durable.
    pub(crate) fn flush(&self) -> io::Result<()> {
        match self {
            Storage::Ram(_) => Ok(()),
            Storage::File(file) => file.sync_data(),
        }
    }

    /// Zeroes `len` bytes at `offset`.
    pub(crate) fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        match self {
            Storage::Ram(mr) => {
                let (start, len) = (to_usize(offset)?, to_usize(len)?);
                let end = start.checked_add(len).ok_or_else(out_of_range)?;
                mr.with_bytes_mut(|bytes| bytes.get_mut(start..end).map(|range| range.fill(0)))
                    .map_err(io::Error::other)?
                    .ok_or_else(out_of_range)
            }
            Storage::File(file) => {
                let zeros = vec![0u8; ZERO_CHUNK.min(to_usize(len)?)];
                let mut done = 0;
                while done < len {
                    let chunk = (len - done).min(zeros.len() as u64) as usize;
                    file.write_all_at(&zeros[..chunk], offset + done)?;
                    done += chunk as u64;
                }
                Ok(())
            }
        }
    }

    /// Deallocates `len` bytes at `offset` (Dataset Management's advice): RAM reads zeros
    /// there afterwards; a file has the range punched out where its file system can (a
    /// block device, or a file system that cannot, keeps its data: the advice is optional).
    pub(crate) fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        match self {
            Storage::Ram(_) => self.zero(offset, len),
            Storage::File(file) => {
                let punched = rustix::fs::fallocate(
                    file,
                    rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                    offset,
                    len,
                );
                match punched {
                    Ok(()) | Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NODEV) => Ok(()),
                    Err(error) => Err(error.into()),
                }
            }
        }
    }
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|error| io::Error::new(error.kind(), format!("{}: {error}", path.display())))
}

fn to_usize(value: u64) -> io::Result<usize> {
    usize::try_from(value).map_err(|_| out_of_range())
}

fn out_of_range() -> io::Error {
    io::Error::other("outside the namespace")
}

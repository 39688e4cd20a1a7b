//! The device view: our devices in sysfs and `/dev` as the kernel shows rxe devices
//! ([`roce_verbs::sysfs`] says what), for the program `roce exec` runs and nobody else.
//!
//! This process moves into a mount namespace of its own whose mounts receive the host's but
//! never send back (propagation "slave"), then covers each of [`ROOTS`] (`/sys/class`,
//! `/sys/devices/virtual`, `/dev`) with a tmpfs holding, for each entry of the original, the
//! same entry (a bind mount of it, submounts included, or the same symbolic link), plus the
//! tree's own. The original stays reachable during the copy through a descriptor opened
//! before covering it (`/proc/self/fd/N/NAME`), as sysfs lets nobody add a directory. What
//! appears in those directories after the program starts (a new netdev, a hot-plugged
//! device) it does not see; what changes inside the entries (a netdev's state, counters)
//! it does.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use roce_verbs::sysfs::{Entry, Kind, ROOTS, TOP_LEVEL};
use rustix::fs::{FileType, Mode, CWD};
use rustix::mount::{MountFlags, MountPropagationFlags};
use rustix::thread::UnshareFlags;

/// Why the view could not be made: not allowed at all (not root; the program may run
/// without it), or broken half-way (it must not run in a half-made view).
pub enum Failure {
    NotPermitted(io::Error),
    Broken(String),
}

/// Gives this process (which is single-threaded: unshare refuses otherwise) a private
/// mount namespace in which `tree` exists.
pub fn install(tree: &[Entry]) -> Result<(), Failure> {
    // SAFETY: NEWNS alone does not unshare the file descriptor table (it implies only FS,
    // which the kernel refuses for a multi-threaded caller).
    match unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) } {
        Ok(()) => {}
        Err(error) if error == rustix::io::Errno::PERM => {
            return Err(Failure::NotPermitted(error.into()))
        }
        Err(error) => return Err(Failure::Broken(format!("unshare(CLONE_NEWNS): {error}"))),
    }
    let broken = |what: String| move |error: io::Error| Failure::Broken(format!("{what}: {error}"));
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
    )
    .map_err(|error| broken("making / a slave mount".into())(error.into()))?;
    for root in ROOTS {
        let prefix = format!("{root}/");
        let ours: Vec<&Entry> = tree
            .iter()
            .filter(|entry| entry.path.starts_with(&prefix))
            .collect();
        cover(root).map_err(broken(format!("covering {root}")))?;
        for entry in ours {
            create(entry).map_err(broken(entry.path.clone()))?;
        }
    }
    Ok(())
}

/// Mounts a tmpfs over `root` holding what `root` held (but [`TOP_LEVEL`] names, which the
/// tree provides).
fn cover(root: &str) -> io::Result<()> {
    let original = File::open(root)?;
    let under = format!("/proc/self/fd/{}", original.as_raw_fd());
    let mut names: Vec<_> = std::fs::read_dir(&under)?
        .map(|entry| entry.map(|entry| entry.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort();
    // No set-user-ID programs; device nodes only where device nodes belong.
    let mut flags = MountFlags::NOSUID | MountFlags::NOEXEC;
    if root != "/dev" {
        flags |= MountFlags::NODEV;
    }
    rustix::mount::mount("tmpfs", root, "tmpfs", flags, c"mode=755")?;
    for name in names {
        let path = Path::new(root).join(&name);
        if TOP_LEVEL.iter().any(|ours| Path::new(ours) == path) {
            continue;
        }
        let source = Path::new(&under).join(&name);
        let kind = std::fs::symlink_metadata(&source)?.file_type();
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &path)?;
            continue;
        }
        if kind.is_dir() {
            std::fs::create_dir(&path)?;
        } else {
            // A file, device node, socket or FIFO: bind mounted over an empty file.
            File::create(&path)?;
        }
        rustix::mount::mount_bind_recursive(&source, &path)?;
    }
    Ok(())
}

/// Creates one entry of the tree.
fn create(entry: &Entry) -> io::Result<()> {
    let path = Path::new(&entry.path);
    match &entry.kind {
        Kind::Dir => std::fs::create_dir(path)?,
        Kind::File(contents) => std::fs::write(path, contents)?,
        Kind::Link(target) => return std::os::unix::fs::symlink(target, path),
        Kind::CharDevice { major, minor } => rustix::fs::mknodat(
            CWD,
            path,
            FileType::CharacterDevice,
            Mode::from_raw_mode(entry.mode),
            rustix::fs::makedev(*major, *minor),
        )?,
    }
    // Not the umask's: the mode sysfs gives.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(entry.mode))
}

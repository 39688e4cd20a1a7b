//! Re-registration (`ibv_rereg_mr`) and on-demand paging: a region keeps its key while its
//! PD, rights or memory change; a receive whose own region fails is the responder's error
//! (Remote Operational Error), a message too long for it the sender's; on-demand regions
//! fail, never fault, where nothing is mapped, and the implicit one reaches any address.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use roce_transport::cq::WcStatus;
use roce_transport::mr::{AtomicOp, MrError, MrTable};
use roce_transport::qp_state::{PathMtu, QpType};
use roce_transport::sim::{LinkConfig, RetryConfig, Sim};
use roce_transport::wr::SendOp;
use roce_transport::{AccessFlags, CallerMemory};

mod common;
use common::*;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

fn rc_pair() -> (Sim, u32, u32) {
    let mut sim = Sim::new(LinkConfig::default(), 5);
    assert_eq!((sim.add_node(), sim.add_node()), (A, B));
    let pair = sim.connect(A, B, QpType::Rc, PathMtu::Mtu1024, RetryConfig::default());
    (sim, pair.a.1, pair.b.1)
}

/// Pages of anonymous memory the test maps, and may unmap in part.
struct Pages {
    base: *mut u8,
    len: usize,
}

fn page() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap()
}

impl Pages {
    fn map(count: usize) -> Pages {
        let len = count * page();
        // SAFETY: a fresh private anonymous mapping, owned by the returned value.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        Pages {
            base: base.cast(),
            len,
        }
    }

    fn at(&self, offset: usize) -> *mut u8 {
        self.base.wrapping_add(offset)
    }

    /// Unmaps page `index` (its address stays reserved by nothing: reads there fault).
    fn unmap(&self, index: usize) {
        // SAFETY: a page of our own mapping, which nothing references.
        assert_eq!(
            unsafe { libc::munmap(self.at(index * page()).cast(), page()) },
            0
        );
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: our mapping (unmapping a hole in it again is harmless).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// A receive into a region that moved to another PD fails at B (LOC_PROT_ERR) and A hears
/// Remote Operational Error, as rxe's malformed-WQE error; moved back, the next message lands.
#[test]
fn a_receive_in_a_region_of_another_pd_is_a_remote_operational_error() {
    let (mut sim, qa, qb) = rc_pair();
    let source = sim.reg(A, SRC, &pattern(64, 1));
    let target = sim.reg(B, DST, &[0; 64]);
    let other = sim.nodes[B].endpoint.mrs().alloc_pd();
    let home = sim.nodes[B].pd;
    let mrs = sim.nodes[B].endpoint.mrs();
    mrs.rereg(target, Some(other), None, None).unwrap();
    assert_eq!(mrs.dealloc_pd(other), Err(MrError::PdBusy));
    sim.post_recv(B, qb, &recv_wr(9, sge(DST, 64, target)))
        .unwrap();
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 64, source)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RemoteOperation)]
    );
    assert_eq!(
        summary(&wait_recv(&mut sim, B, 1)),
        [(9, WcStatus::LocalProtection)]
    );
    assert_eq!(sim.mr_bytes(B, target), [0; 64]);
    let mrs = sim.nodes[B].endpoint.mrs();
    mrs.rereg(target, Some(home), None, None).unwrap();
    assert_eq!(mrs.dealloc_pd(other), Ok(()), "the region left it");
}

/// A message longer than the receive is the sender's error: Remote Invalid Request at A,
/// LOC_LEN_ERR at B.
#[test]
fn a_message_longer_than_its_receive_is_an_invalid_request() {
    let (mut sim, qa, qb) = rc_pair();
    let source = sim.reg(A, SRC, &pattern(64, 1));
    let target = sim.reg(B, DST, &[0; 64]);
    sim.post_recv(B, qb, &recv_wr(9, sge(DST, 32, target)))
        .unwrap();
    sim.post_send(A, qa, &signaled(1, SendOp::Send, sge(SRC, 64, source)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::RemoteInvalidRequest)]
    );
    assert_eq!(
        summary(&wait_recv(&mut sim, B, 1)),
        [(9, WcStatus::LocalLength)]
    );
}

/// Rights and memory change under the same key; a refused change changes nothing.
#[test]
fn rereg_changes_rights_and_memory_under_the_same_key() {
    let mut table = MrTable::new([3; 32]);
    let pd = table.alloc_pd();
    let pages = Pages::map(2);
    // SAFETY: the pages outlive the table's use of them (dropped after it is done).
    let first = unsafe { CallerMemory::new(pages.at(0), 64, true) }.unwrap();
    let key = table.reg_mr_caller(pd, 0x1000, first, RW).unwrap();
    let write = AccessFlags::REMOTE_WRITE;
    table.write(pd, key, 0x1000, &[7], write).unwrap();
    table
        .rereg(key, None, None, Some(AccessFlags::LOCAL_WRITE))
        .unwrap();
    assert_eq!(
        table.write(pd, key, 0x1000, &[8], write),
        Err(MrError::AccessDenied)
    );
    assert_eq!(
        table.rereg(key, None, None, Some(AccessFlags::REMOTE_WRITE)),
        Err(MrError::InvalidAccess),
        "remote write needs local write"
    );
    // SAFETY: as above.
    let second = unsafe { CallerMemory::new(pages.at(page()), 32, true) }.unwrap();
    let iova = pages.at(page()) as u64;
    table
        .rereg(key, None, Some((iova, second)), Some(RW))
        .unwrap();
    assert_eq!(
        table.check(pd, key, 0x1000, 1, write),
        Err(MrError::OutOfBounds),
        "the old translation is gone"
    );
    table.write(pd, key, iova + 31, &[9], write).unwrap();
    assert_eq!(
        table.write(pd, key, iova + 32, &[9], write),
        Err(MrError::OutOfBounds)
    );
    // SAFETY: our mapping, no longer registered at offset 0, and no transfer runs.
    let (old, new) = unsafe { (*pages.at(0), *pages.at(page() + 31)) };
    assert_eq!((old, new), (7, 9));
    // SAFETY: a read-only view: refused for local write, so nothing changes.
    let read_only = unsafe { CallerMemory::new(pages.at(0), 8, false) }.unwrap();
    assert_eq!(
        table.rereg(key, None, Some((0x5000, read_only)), None),
        Err(MrError::InvalidAccess)
    );
    assert!(table.check(pd, key, iova, 32, write).is_ok());
    assert_eq!(
        table.rereg(key ^ 1, None, None, None),
        Err(MrError::UnknownKey)
    );
}

/// On-demand memory: reads, writes and atomics land where pages are mapped and fail with
/// `Unmapped` where none is, instead of faulting the process; prefetch faults pages in.
#[test]
fn on_demand_memory_fails_where_nothing_is_mapped() {
    let pages = Pages::map(2);
    let len = 2 * page();
    let memory = CallerMemory::on_demand(pages.at(0), len, true).unwrap();
    memory.write(8, &[1, 2, 3]).unwrap();
    assert_eq!(memory.atomic(16, AtomicOp::FetchAdd(5)), Ok(0));
    assert_eq!(memory.atomic(16, AtomicOp::FetchAdd(5)), Ok(5));
    let mut out = [0u8; 3];
    memory.read(8, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3]);
    memory.prefetch(0, len, true).unwrap();
    pages.unmap(1);
    let beyond = page() + 8;
    assert_eq!(memory.write(beyond, &[1]), Err(MrError::Unmapped));
    assert_eq!(memory.read(beyond, &mut out), Err(MrError::Unmapped));
    assert_eq!(
        memory.read(page() - 1, &mut out),
        Err(MrError::Unmapped),
        "a copy across into the hole fails whole"
    );
    let mut appended = vec![7];
    assert_eq!(
        memory.append(beyond, 4, &mut appended),
        Err(MrError::Unmapped)
    );
    assert_eq!(appended, [7], "nothing appended");
    assert_eq!(
        memory.atomic(beyond, AtomicOp::FetchAdd(1)),
        Err(MrError::Unmapped)
    );
    assert_eq!(memory.prefetch(0, len, false), Err(MrError::Unmapped));
    let read_only = CallerMemory::on_demand(pages.at(0), page(), false).unwrap();
    assert_eq!(read_only.write(0, &[1]), Err(MrError::AccessDenied));
}

/// An RDMA WRITE into an on-demand region: lands where the page is mapped, and where it is
/// not, the requester hears a remote access error and the process lives on.
#[test]
fn a_write_into_an_unmapped_on_demand_page_is_a_remote_access_error() {
    let pages = Pages::map(2);
    let (mut sim, qa, _qb) = rc_pair();
    let source = sim.reg(A, SRC, &pattern(16, 4));
    let memory = CallerMemory::on_demand(pages.at(0), 2 * page(), true).unwrap();
    let pd = sim.nodes[B].pd;
    let target = sim.nodes[B]
        .endpoint
        .mrs()
        .reg_mr_caller(pd, DST, memory, RW)
        .unwrap();
    let write = |remote_addr| SendOp::RdmaWrite {
        remote_addr,
        rkey: target,
    };
    sim.post_send(A, qa, &signaled(1, write(DST), sge(SRC, 16, source)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(1, WcStatus::Success)]
    );
    let mut landed = [0u8; 16];
    // SAFETY: our mapped first page; no transfer runs now.
    unsafe { ptr::copy_nonoverlapping(pages.at(0), landed.as_mut_ptr(), 16) };
    assert_eq!(landed.to_vec(), pattern(16, 4));
    pages.unmap(1);
    let into_hole = DST + page() as u64;
    sim.post_send(A, qa, &signaled(2, write(into_hole), sge(SRC, 16, source)))
        .unwrap();
    assert_eq!(
        summary(&wait_send(&mut sim, A, 1)),
        [(2, WcStatus::RemoteAccess)]
    );
}

/// The implicit region covers every address as itself: a word of a Vec is reached by its
/// address, and unmapped addresses fail.
#[test]
fn the_implicit_region_reaches_any_mapped_address() {
    let mut table = MrTable::new([4; 32]);
    let pd = table.alloc_pd();
    let all = AccessFlags::all();
    let implicit = CallerMemory::on_demand(ptr::null_mut(), usize::MAX, true).unwrap();
    assert!(implicit.is_implicit());
    assert_eq!(
        table.reg_mr_caller(
            pd,
            5,
            CallerMemory::on_demand(ptr::null_mut(), usize::MAX, true).unwrap(),
            all
        ),
        Err(MrError::AddressOverflow),
        "an implicit region is addressed from 0"
    );
    let key = table.reg_mr_caller(pd, 0, implicit, all).unwrap();
    // Atomics: interior mutability, as the table writes them behind our back.
    let words: [AtomicU64; 4] = Default::default();
    let at = words.as_ptr() as u64;
    table
        .write(
            pd,
            key,
            at + 8,
            &7u64.to_ne_bytes(),
            AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    assert_eq!(table.atomic(pd, key, at + 8, AtomicOp::FetchAdd(1)), Ok(7));
    assert_eq!(words[1].load(Ordering::SeqCst), 8);
    let pages = Pages::map(1);
    pages.unmap(0);
    assert_eq!(
        table.write(pd, key, pages.at(0) as u64, &[1], AccessFlags::REMOTE_WRITE),
        Err(MrError::Unmapped)
    );
    assert_eq!(
        CallerMemory::on_demand(ptr::null_mut(), 8, true).unwrap_err(),
        MrError::NullAddress,
        "only the implicit region starts at 0"
    );
}

/// Prefetch: only of on-demand regions, within them, writable for a write prefetch.
#[test]
fn prefetch_checks_before_it_faults_in() {
    let mut table = MrTable::new([5; 32]);
    let pd = table.alloc_pd();
    let other = table.alloc_pd();
    let pages = Pages::map(2);
    let len = 2 * page();
    let odp = CallerMemory::on_demand(pages.at(0), len, true).unwrap();
    let key = table.reg_mr_caller(pd, 0x10000, odp, RW).unwrap();
    let read_only = CallerMemory::on_demand(pages.at(0), len, false).unwrap();
    let ro_key = table
        .reg_mr_caller(pd, 0x10000, read_only, AccessFlags::REMOTE_READ)
        .unwrap();
    let pinned = table.reg_mr(pd, 0x40000, 64, RW).unwrap();
    let len = len as u64;
    assert_eq!(table.prefetch(pd, key, 0x10000, len, true, true), Ok(()));
    assert_eq!(
        table.prefetch(pd, ro_key, 0x10000, len, false, true),
        Ok(())
    );
    assert_eq!(
        table.prefetch(pd, ro_key, 0x10000, len, true, true),
        Err(MrError::AccessDenied)
    );
    assert_eq!(
        table.prefetch(pd, pinned, 0x40000, 64, false, true),
        Err(MrError::NotOnDemand)
    );
    assert_eq!(
        table.prefetch(other, key, 0x10000, 8, false, true),
        Err(MrError::WrongPd)
    );
    assert_eq!(
        table.prefetch(pd, key, 0x10000, len + 1, false, true),
        Err(MrError::OutOfBounds)
    );
    pages.unmap(1);
    assert_eq!(
        table.prefetch(pd, key, 0x10000, len, false, true),
        Err(MrError::Unmapped)
    );
    assert_eq!(
        table.prefetch(pd, key, 0x10000, len, false, false),
        Ok(()),
        "without faulting, nothing is touched"
    );
}

//! The write connection's files go through a thin layer over SQLite's
//! `unix` VFS that hands a commit's write-ahead-log frames to the kernel
//! in a few large writes instead of two per frame (design 0059).
//!
//! SQLite writes a frame as its 24-byte header and then its page, each in
//! its own `pwrite`, at consecutive offsets of the WAL: a group commit of
//! forty pages is eighty system calls, each paying the kernel's per-call
//! work (entry, file checks, time stamps, the folio walk of a 24-byte
//! write). Here the WAL's writes are kept in memory while each continues
//! where the last ended, and are handed to the `unix` VFS before anything
//! that could need them in the file:
//! - the WAL's sync, read, size, truncation, file controls and close, and
//!   a write somewhere else;
//! - the database file's shared-memory barrier, which the connection
//!   passes while it publishes a commit in the WAL index: other
//!   connections find new frames only through that index, so none can
//!   read a frame still held here.
//!
//! Every other call goes straight to the `unix` VFS. A crash loses what
//! is held, which is never more than a commit that had not synced: what a
//! crash before the sync may lose anyway (the WAL's checksums end recovery
//! at the last whole commit). A write that fails when it is handed on
//! fails the call that needed it, normally the commit's sync, so the
//! commit fails and nobody is told it succeeded.
//!
//! The store's write connection is `synchronous=FULL`, so each commit is
//! handed on at its sync and the barrier finds nothing held (at most the
//! frames a rolled-back transaction spilled, which nothing will read). A
//! connection that does not sync its commits is still correct: its commit
//! is handed on at the barrier. If a write fails there, there is no way
//! to fail the commit any more (the barrier returns nothing), and going on
//! could publish frames that are not in the file, so the process aborts.

use std::ffi::{CStr, c_int, c_void};
use std::mem::size_of;
use std::ptr;
use std::sync::{Mutex, OnceLock, PoisonError};

use rusqlite::ffi;

use crate::StoreError;

/// The name a connection is opened with to use this VFS.
pub(super) const NAME: &CStr = c"corral-wal";

/// Held WAL bytes past which they are handed on without waiting (a group
/// commit writes a few hundred KiB).
const FLUSH_AT: usize = 4 << 20;

/// The most the `unix` VFS writes in one call (it keeps 17 bits of a
/// length): held bytes are handed on in pieces of this size.
const MAX_WRITE: usize = 126 * 1024;

/// What SQLite allocates for a file opened through this VFS: this header,
/// then the `unix` VFS's own file object at [`INNER_OFFSET`].
#[repr(C)]
struct File {
    /// First, so that SQLite can use a `File` as a `sqlite3_file`.
    base: ffi::sqlite3_file,
    /// The `unix` VFS's file, in the same allocation.
    inner: *mut ffi::sqlite3_file,
    /// For a WAL: the writes held back. Null for other files.
    held: *mut Held,
    /// For a main database: the WAL its connection has open. For a WAL:
    /// that database. Null when there is none.
    partner: *mut File,
}

const INNER_OFFSET: usize = size_of::<File>().next_multiple_of(8);

/// Consecutive WAL writes, starting at `offset`.
struct Held {
    offset: i64,
    bytes: Vec<u8>,
    /// The WAL's writes as SQLite made them, and as they were handed on.
    #[cfg(test)]
    counts: tests::Counts,
}

/// The registered VFS and the method tables of its files, one per
/// `sqlite3_io_methods` version (a file gets the version of its `unix`
/// file).
struct Shim {
    vfs: ffi::sqlite3_vfs,
    unix: *mut ffi::sqlite3_vfs,
    methods: [ffi::sqlite3_io_methods; 3],
}

/// The main database files open through this VFS, by the address of the
/// file name SQLite opened them with. A connection's WAL is opened with a
/// name whose database part (`sqlite3_filename_database`) is that very
/// string, which is how a WAL finds its connection's database file. The
/// addresses are kept as integers: nothing dereferences them from here.
static DATABASES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// Registers the VFS with SQLite, once per process.
pub(super) fn register() -> Result<(), StoreError> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(build)
        .clone()
        .map_err(StoreError::Unavailable)
}

fn build() -> Result<(), String> {
    // SAFETY: looks a VFS up by a NUL-terminated name (SQLite initialises
    // itself first if it has not).
    let unix = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
    if unix.is_null() {
        return Err("sqlite has no unix VFS to hold WAL writes over".into());
    }
    // SAFETY: `unix` is a registered VFS, which lives as long as the
    // process; it is copied, not changed.
    let mut vfs = unsafe { ptr::read(unix) };
    let unix_file = usize::try_from(vfs.szOsFile).unwrap_or(0);
    vfs.szOsFile = c_int::try_from(INNER_OFFSET + unix_file)
        .map_err(|_| "the unix VFS's file object is too large to wrap".to_string())?;
    vfs.pNext = ptr::null_mut();
    vfs.zName = NAME.as_ptr();
    // The other calls are the unix VFS's own; none of them reads the VFS
    // object it is passed beyond the fields copied above.
    vfs.xOpen = Some(open);
    let shim: &'static mut Shim = Box::leak(Box::new(Shim {
        vfs,
        unix,
        methods: [methods(1), methods(2), methods(3)],
    }));
    shim.vfs.pAppData = ptr::from_mut(shim).cast::<c_void>();
    // SAFETY: the VFS and all it points to live as long as the process
    // (leaked above); it does not become the default VFS.
    let rc = unsafe { ffi::sqlite3_vfs_register(&raw mut shim.vfs, 0) };
    if rc != ffi::SQLITE_OK {
        return Err(format!("sqlite refused the WAL-holding VFS (code {rc})"));
    }
    Ok(())
}

/// The method table of `version`: the calls a file of that version has.
fn methods(version: c_int) -> ffi::sqlite3_io_methods {
    ffi::sqlite3_io_methods {
        iVersion: version,
        xClose: Some(close),
        xRead: Some(read),
        xWrite: Some(write),
        xTruncate: Some(truncate),
        xSync: Some(sync),
        xFileSize: Some(file_size),
        xLock: Some(lock),
        xUnlock: Some(unlock),
        xCheckReservedLock: Some(check_reserved_lock),
        xFileControl: Some(file_control),
        xSectorSize: Some(sector_size),
        xDeviceCharacteristics: Some(device_characteristics),
        xShmMap: (version >= 2).then_some(shm_map as _),
        xShmLock: (version >= 2).then_some(shm_lock as _),
        xShmBarrier: (version >= 2).then_some(shm_barrier as _),
        xShmUnmap: (version >= 2).then_some(shm_unmap as _),
        xFetch: (version >= 3).then_some(fetch as _),
        xUnfetch: (version >= 3).then_some(unfetch as _),
    }
}

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite calls this with our registered VFS, whose app data is
    // the leaked shim, and `szOsFile` writable bytes at `file`: a `File`,
    // then the unix VFS's file at INNER_OFFSET. `name` is a file name as
    // SQLite passes it to xOpen (or null for a temporary file).
    unsafe {
        let shim = &*(*vfs).pAppData.cast::<Shim>();
        let wrapper = file.cast::<File>();
        let inner = file
            .cast::<u8>()
            .add(INNER_OFFSET)
            .cast::<ffi::sqlite3_file>();
        // No methods tell SQLite there is nothing to close if this fails.
        (*wrapper).base.pMethods = ptr::null();
        (*wrapper).inner = inner;
        (*wrapper).held = ptr::null_mut();
        (*wrapper).partner = ptr::null_mut();
        let Some(unix_open) = (*shim.unix).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        let rc = unix_open(shim.unix, name, inner, flags, out_flags);
        if rc != ffi::SQLITE_OK || (*inner).pMethods.is_null() {
            return rc;
        }
        let version = (*(*inner).pMethods).iVersion.clamp(1, 3);
        // `version` is 1 to 3.
        (*wrapper).base.pMethods = &raw const shim.methods[(version - 1) as usize];
        if name.is_null() {
            return ffi::SQLITE_OK;
        }
        if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
            lock_databases().push((name as usize, wrapper as usize));
        } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
            (*wrapper).held = Box::into_raw(Box::new(Held {
                offset: 0,
                bytes: Vec::new(),
                #[cfg(test)]
                counts: tests::Counts::new(CStr::from_ptr(name)),
            }));
            let database = ffi::sqlite3_filename_database(name) as usize;
            let found = lock_databases()
                .iter()
                .find(|(name, _)| *name == database)
                .map(|(_, file)| *file as *mut File);
            if let Some(database) = found {
                (*database).partner = wrapper;
                (*wrapper).partner = database;
            }
        }
        ffi::SQLITE_OK
    }
}

fn lock_databases() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    DATABASES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `unix` file under `file`, and its methods.
///
/// # Safety
/// `file` was opened by this VFS and is not closed.
unsafe fn unix_file(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'static ffi::sqlite3_io_methods) {
    // SAFETY: per the contract, `file` is a `File` whose unix file is open;
    // the unix VFS's method tables are static.
    unsafe {
        let inner = (*file.cast::<File>()).inner;
        (inner, &*(*inner).pMethods)
    }
}

/// Hands the writes `file` holds to the `unix` VFS; nothing to do for a
/// file that holds none.
///
/// # Safety
/// `file` was opened by this VFS and is not closed. SQLite uses a file
/// from one thread at a time; the caller is that thread.
unsafe fn hand_on(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: per the contract.
    unsafe {
        let held = (*file.cast::<File>()).held;
        if held.is_null() || (*held).bytes.is_empty() {
            return ffi::SQLITE_OK;
        }
        let (inner, methods) = unix_file(file);
        let Some(write) = methods.xWrite else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let held = &mut *held;
        let mut rc = ffi::SQLITE_OK;
        let mut offset = held.offset;
        for piece in held.bytes.chunks(MAX_WRITE) {
            // A piece is at most MAX_WRITE bytes: an int.
            let amount = c_int::try_from(piece.len()).unwrap_or(c_int::MAX);
            rc = write(inner, piece.as_ptr().cast(), amount, offset);
            #[cfg(test)]
            {
                held.counts.handed += 1;
            }
            if rc != ffi::SQLITE_OK {
                break;
            }
            offset += i64::from(amount);
        }
        held.bytes.clear();
        rc
    }
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite passes a file this VFS opened and `amount` readable
    // bytes at `data`.
    unsafe {
        let held = (*file.cast::<File>()).held;
        if held.is_null() {
            let (inner, methods) = unix_file(file);
            return methods.xWrite.map_or(ffi::SQLITE_IOERR_WRITE, |write| {
                write(inner, data, amount, offset)
            });
        }
        let ends_at = (*held).offset + (*held).bytes.len() as i64;
        if !(*held).bytes.is_empty() && ends_at != offset {
            let rc = hand_on(file);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        let held = &mut *held;
        #[cfg(test)]
        {
            held.counts.received += 1;
        }
        if held.bytes.is_empty() {
            held.offset = offset;
        }
        let len = usize::try_from(amount).unwrap_or(0);
        held.bytes
            .extend_from_slice(std::slice::from_raw_parts(data.cast::<u8>(), len));
        if held.bytes.len() >= FLUSH_AT {
            return hand_on(file);
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a file this VFS opened, once. Its held writes
    // were boxed by `open` and are freed here only; its partner, if any,
    // is open (a connection closes its WAL before its database).
    unsafe {
        let handed_on = hand_on(file);
        let wrapper = file.cast::<File>();
        let partner = (*wrapper).partner;
        if !partner.is_null() {
            (*partner).partner = ptr::null_mut();
        }
        if !(*wrapper).held.is_null() {
            #[cfg(test)]
            tests::closed(&(*(*wrapper).held).counts);
            drop(Box::from_raw((*wrapper).held));
            (*wrapper).held = ptr::null_mut();
        } else {
            let address = wrapper as usize;
            lock_databases().retain(|(_, file)| *file != address);
        }
        let (inner, methods) = unix_file(file);
        let closed = methods.xClose.map_or(ffi::SQLITE_OK, |close| close(inner));
        if handed_on != ffi::SQLITE_OK {
            handed_on
        } else {
            closed
        }
    }
}

/// Forwards a call to the `unix` file once the held writes are handed on;
/// a failed hand-on is the call's error.
macro_rules! after_hand_on {
    ($file:ident, $method:ident, $missing:expr $(, $arg:expr)*) => {{
        // SAFETY: SQLite passes a file this VFS opened and has not closed,
        // and arguments valid for the call.
        unsafe {
            let rc = hand_on($file);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            let (inner, methods) = unix_file($file);
            methods.$method.map_or($missing, |call| call(inner $(, $arg)*))
        }
    }};
}

/// Forwards a call that does not touch the file's contents.
macro_rules! forward {
    ($file:ident, $method:ident, $missing:expr $(, $arg:expr)*) => {{
        // SAFETY: SQLite passes a file this VFS opened and has not closed,
        // and arguments valid for the call.
        unsafe {
            let (inner, methods) = unix_file($file);
            methods.$method.map_or($missing, |call| call(inner $(, $arg)*))
        }
    }};
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    data: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    after_hand_on!(file, xRead, ffi::SQLITE_IOERR_READ, data, amount, offset)
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    after_hand_on!(file, xTruncate, ffi::SQLITE_IOERR_TRUNCATE, size)
}

unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    after_hand_on!(file, xSync, ffi::SQLITE_IOERR_FSYNC, flags)
}

unsafe extern "C" fn file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    after_hand_on!(file, xFileSize, ffi::SQLITE_IOERR_FSTAT, size)
}

unsafe extern "C" fn file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    after_hand_on!(file, xFileControl, ffi::SQLITE_NOTFOUND, op, arg)
}

unsafe extern "C" fn lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(file, xLock, ffi::SQLITE_IOERR_LOCK, level)
}

unsafe extern "C" fn unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    forward!(file, xUnlock, ffi::SQLITE_IOERR_UNLOCK, level)
}

unsafe extern "C" fn check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    forward!(
        file,
        xCheckReservedLock,
        ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
        out
    )
}

unsafe extern "C" fn sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    forward!(file, xSectorSize, 4096)
}

unsafe extern "C" fn device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    forward!(file, xDeviceCharacteristics, 0)
}

unsafe extern "C" fn shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(
        file,
        xShmMap,
        ffi::SQLITE_IOERR_SHMMAP,
        region,
        size,
        extend,
        out
    )
}

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    count: c_int,
    flags: c_int,
) -> c_int {
    forward!(
        file,
        xShmLock,
        ffi::SQLITE_IOERR_SHMLOCK,
        offset,
        count,
        flags
    )
}

/// The barrier a connection passes while it publishes a commit in the WAL
/// index (and while it reads the index): the commit's frames must be in
/// the WAL file before any other connection can find them.
unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: SQLite passes a database file this VFS opened; its partner,
    // if set, is its connection's open WAL, used by this same thread.
    let rc = unsafe {
        let wal = (*file.cast::<File>()).partner;
        if wal.is_null() {
            ffi::SQLITE_OK
        } else {
            hand_on(wal.cast::<ffi::sqlite3_file>())
        }
    };
    if rc != ffi::SQLITE_OK {
        // Only a connection that does not sync its commits gets here with
        // writes held (see the module's comment).
        tracing::error!(
            code = rc,
            "writing a commit's WAL frames failed while publishing it; aborting rather than \
             publish frames that are not in the file"
        );
        std::process::abort();
    }
    forward!(file, xShmBarrier, ())
}

unsafe extern "C" fn shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    forward!(file, xShmUnmap, ffi::SQLITE_OK, delete)
}

unsafe extern "C" fn fetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    amount: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(
        file,
        xFetch,
        {
            *out = ptr::null_mut();
            ffi::SQLITE_OK
        },
        offset,
        amount,
        out
    )
}

unsafe extern "C" fn unfetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    page: *mut c_void,
) -> c_int {
    forward!(file, xUnfetch, ffi::SQLITE_OK, offset, page)
}

#[cfg(test)]
#[path = "wal_vfs_tests.rs"]
mod tests;

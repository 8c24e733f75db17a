//! SQLite's process-wide memory setup: allocation statistics off, and
//! SQLite's allocations through the process's allocator.

use std::ffi::c_int;

/// Sets up SQLite's memory for this process; call it before anything opens
/// a database (SQLite refuses it afterwards, and nothing is lost then but
/// speed).
///
/// - Allocation statistics off. Nothing reads them, and keeping them takes
///   one mutex for every allocation and free in the process: the
///   connection's thread allocates a row's values and the task that reads
///   the row frees them, so in a burn-down that mutex was contended (about a
///   third of the service's `futex` calls).
/// - SQLite allocates through the process's allocator (`allocator`: the
///   service's is mimalloc) rather than glibc's malloc, which took a tenth
///   of the service's CPU in a SQLite burn-down, most of it SQLite's values
///   and pages.
pub fn prepare_sqlite_memory() {
    let methods = libsqlite3_sys::sqlite3_mem_methods {
        xMalloc: Some(allocator::malloc),
        xFree: Some(allocator::free),
        xRealloc: Some(allocator::realloc),
        xSize: Some(allocator::size),
        xRoundup: Some(allocator::roundup),
        xInit: Some(allocator::init),
        xShutdown: Some(allocator::shutdown),
        pAppData: std::ptr::null_mut(),
    };
    // SAFETY: the caller runs this before any other SQLite call in the
    // process, as `sqlite3_config` requires; `SQLITE_CONFIG_MEMSTATUS` takes
    // one int, `SQLITE_CONFIG_MALLOC` a pointer to the methods, which SQLite
    // copies before it returns.
    unsafe {
        libsqlite3_sys::sqlite3_config(libsqlite3_sys::SQLITE_CONFIG_MEMSTATUS, 0 as c_int);
        libsqlite3_sys::sqlite3_config(
            libsqlite3_sys::SQLITE_CONFIG_MALLOC,
            &methods as *const libsqlite3_sys::sqlite3_mem_methods,
        );
    }
}

/// SQLite's allocation methods over Rust's global allocator. A block starts
/// with its size, which SQLite asks for back (`size`) and which freeing it
/// needs; the header keeps SQLite's 8-byte alignment.
mod allocator {
    use std::alloc::Layout;
    use std::ffi::{c_int, c_void};
    use std::ptr::null_mut;

    const HEADER: usize = 8;

    /// The layout of a block holding `size` bytes after its header.
    fn layout(size: usize) -> Option<Layout> {
        Layout::from_size_align(size.checked_add(HEADER)?, HEADER).ok()
    }

    /// The header of a block `malloc` or `realloc` returned, and the size it holds.
    ///
    /// # Safety
    /// `p` is such a block, not yet freed.
    unsafe fn header(p: *mut c_void) -> (*mut u8, usize) {
        // SAFETY: the block's header is the `HEADER` bytes before it, aligned
        // for a `usize` and written when the block was made.
        unsafe {
            let base = p.cast::<u8>().sub(HEADER);
            (base, base.cast::<usize>().read())
        }
    }

    /// # Safety
    /// As SQLite's `xMalloc`.
    pub(super) unsafe extern "C" fn malloc(size: c_int) -> *mut c_void {
        let Some(layout) = usize::try_from(size).ok().and_then(layout) else {
            return null_mut();
        };
        // SAFETY: the layout is never empty (it holds the header); the block
        // is aligned for the `usize` written at its start.
        unsafe {
            let base = std::alloc::alloc(layout);
            if base.is_null() {
                return null_mut();
            }
            base.cast::<usize>().write(layout.size() - HEADER);
            base.add(HEADER).cast()
        }
    }

    /// # Safety
    /// As SQLite's `xFree`: `p` came from `malloc` or `realloc`.
    pub(super) unsafe extern "C" fn free(p: *mut c_void) {
        if p.is_null() {
            return;
        }
        // SAFETY: `p` is a live block; its layout is the one it was made with.
        unsafe {
            let (base, size) = header(p);
            if let Some(layout) = layout(size) {
                std::alloc::dealloc(base, layout);
            }
        }
    }

    /// # Safety
    /// As SQLite's `xRealloc`: `p` came from `malloc` or `realloc`. On
    /// failure the block stays as it was.
    pub(super) unsafe extern "C" fn realloc(p: *mut c_void, size: c_int) -> *mut c_void {
        if p.is_null() {
            // SAFETY: as `malloc`.
            return unsafe { malloc(size) };
        }
        let Some(new) = usize::try_from(size).ok().and_then(layout) else {
            return null_mut();
        };
        // SAFETY: `p` is a live block made with `layout(old)`; the new size
        // is not zero and fits a layout of the same alignment.
        unsafe {
            let (base, old) = header(p);
            let Some(old) = layout(old) else {
                return null_mut();
            };
            let grown = std::alloc::realloc(base, old, new.size());
            if grown.is_null() {
                return null_mut();
            }
            grown.cast::<usize>().write(new.size() - HEADER);
            grown.add(HEADER).cast()
        }
    }

    /// # Safety
    /// As SQLite's `xSize`: `p` came from `malloc` or `realloc`.
    pub(super) unsafe extern "C" fn size(p: *mut c_void) -> c_int {
        if p.is_null() {
            return 0;
        }
        // SAFETY: `p` is a live block.
        let (_, size) = unsafe { header(p) };
        c_int::try_from(size).unwrap_or(c_int::MAX)
    }

    pub(super) unsafe extern "C" fn roundup(size: c_int) -> c_int {
        size.saturating_add(7) & !7
    }

    pub(super) unsafe extern "C" fn init(_: *mut c_void) -> c_int {
        libsqlite3_sys::SQLITE_OK
    }

    pub(super) unsafe extern "C" fn shutdown(_: *mut c_void) {}
}

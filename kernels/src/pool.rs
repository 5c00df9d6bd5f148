//! A caching allocator for large blocks: tensor buffers whose lifetimes do not overlap reuse
//! the same memory instead of going back to the operating system.
//!
//! The C allocator serves every block above its mmap threshold (at most 32 MiB in glibc) with a
//! fresh mapping and unmaps it on free, so a loop that makes a 64 MiB tensor per step pays for
//! 16,384 page faults and the kernel zeroing every page, each step — measured on W2
//! (`gelu(x * w + b)`, 16M floats) as half the run time; and blocks of a few hundred KiB, which
//! it keeps in its heap, go back to the system when the heap's top is trimmed (the transformer
//! example at `-O1`: 12M page faults, 32 s of system time). [`Pool`] wraps an allocator and keeps
//! freed blocks of at least [`MIN_BLOCK`] bytes (up to [`CAP`] bytes and [`SLOTS`] blocks); the
//! next request of the same size and alignment takes one back. A zeroed request that reuses a
//! block clears it, so every caller sees exactly what the wrapped allocator would give. When
//! the cache is full the oldest block is freed first. [`release`] empties it.
//!
//! This is the run-time half of `-O2`'s memory plan (`lang::ir::memplan`): the plan gives each
//! value a buffer and lets values whose lifetimes do not overlap share one of the same size;
//! the interpreter frees a value at its last use (`ir::opt::last_uses`), and the pool hands its
//! block to the next value of that size.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Mutex;

/// Blocks smaller than this go straight to the wrapped allocator (whose heap reuses them
/// without trimming).
pub const MIN_BLOCK: usize = 64 << 10;
/// The most bytes the cache keeps.
pub const CAP: usize = 2 << 30;
/// The most blocks the cache keeps.
pub const SLOTS: usize = 256;

#[derive(Clone, Copy)]
struct Block {
    ptr: usize,
    size: usize,
    align: usize,
}

struct Cache {
    blocks: [Block; SLOTS],
    n: usize,
    bytes: usize,
    hits: u64,
}

static CACHE: Mutex<Cache> =
    Mutex::new(Cache { blocks: [Block { ptr: 0, size: 0, align: 0 }; SLOTS], n: 0, bytes: 0, hits: 0 });

fn lock() -> std::sync::MutexGuard<'static, Cache> {
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cache {
    /// Takes a cached block of exactly this layout.
    fn take(&mut self, l: Layout) -> Option<*mut u8> {
        let i = self.blocks[..self.n].iter().rposition(|b| b.size == l.size() && b.align == l.align())?;
        let b = self.blocks[i];
        // Keep the order (oldest first) so that eviction frees the block unused the longest.
        let n = self.n;
        self.blocks.copy_within(i + 1..n, i);
        self.n -= 1;
        self.bytes -= b.size;
        self.hits += 1;
        Some(b.ptr as *mut u8)
    }
}

/// Wraps `A`, caching its large blocks (see the module documentation).
pub struct Pool<A>(pub A);

// SAFETY: a cached block was allocated by `self.0` with exactly the layout it is handed out
// for again (same size and alignment), and is owned by the cache alone while cached; blocks
// leave the cache only through `take` (to one caller) or by being freed with their layout.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Pool<A> {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() >= MIN_BLOCK {
            if let Some(p) = lock().take(l) {
                return p;
            }
        }
        // SAFETY: forwarded as is.
        unsafe { self.0.alloc(l) }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() >= MIN_BLOCK {
            let hit = lock().take(l);
            if let Some(p) = hit {
                // SAFETY: the block is `l.size()` bytes, owned by the caller now.
                unsafe { std::ptr::write_bytes(p, 0, l.size()) };
                return p;
            }
        }
        // SAFETY: forwarded as is.
        unsafe { self.0.alloc_zeroed(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if l.size() >= MIN_BLOCK && l.size() <= CAP {
            let mut evicted = None;
            {
                let mut c = lock();
                if c.n == SLOTS || c.bytes + l.size() > CAP {
                    let old = c.blocks[0];
                    let n = c.n;
                    c.blocks.copy_within(1..n, 0);
                    c.n -= 1;
                    c.bytes -= old.size;
                    evicted = Some(old);
                }
                // One eviction may not make room for a block larger than the one freed; then
                // the new block is not cached.
                if c.n < SLOTS && c.bytes + l.size() <= CAP {
                    let n = c.n;
                    c.blocks[n] = Block { ptr: p as usize, size: l.size(), align: l.align() };
                    c.n += 1;
                    c.bytes += l.size();
                } else {
                    // SAFETY: `p` came from `self.0` with layout `l`.
                    unsafe { self.0.dealloc(p, l) };
                }
            }
            if let Some(b) = evicted {
                // SAFETY: the evicted block came from `self.0` with this size and alignment.
                unsafe { self.0.dealloc(b.ptr as *mut u8, Layout::from_size_align_unchecked(b.size, b.align)) };
            }
            return;
        }
        // SAFETY: forwarded as is.
        unsafe { self.0.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if l.size() < MIN_BLOCK && new < MIN_BLOCK {
            // SAFETY: forwarded as is.
            return unsafe { self.0.realloc(p, l, new) };
        }
        // SAFETY: the caller guarantees `new` with `l.align()` is a valid layout.
        let nl = unsafe { Layout::from_size_align_unchecked(new, l.align()) };
        // SAFETY: as `GlobalAlloc::realloc`'s default: a new block, the common prefix copied,
        // the old block freed (to the cache or the wrapped allocator).
        unsafe {
            let q = self.alloc(nl);
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(new));
                self.dealloc(p, l);
            }
            q
        }
    }
}

/// How many blocks and bytes the cache holds, and how many requests it has served.
pub fn stats() -> (usize, usize, u64) {
    let c = lock();
    (c.n, c.bytes, c.hits)
}

/// Frees every cached block to the allocator `a` they came from.
///
/// # Safety
/// `a` must be the allocator the process's [`Pool`] wraps.
pub unsafe fn release<A: GlobalAlloc>(a: &A) {
    let mut c = lock();
    for b in &c.blocks[..c.n] {
        // SAFETY: cached blocks came from `a` with this size and alignment (the caller's
        // guarantee), and are owned by the cache.
        unsafe { a.dealloc(b.ptr as *mut u8, Layout::from_size_align_unchecked(b.size, b.align)) };
    }
    c.n = 0;
    c.bytes = 0;
}

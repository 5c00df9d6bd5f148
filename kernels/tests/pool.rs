//! The caching allocator: a freed large block serves the next request of its size, zeroed
//! requests see zeros even when the block was written, and small blocks are not cached.

use kernels::pool::{self, Pool, MIN_BLOCK};
use std::alloc::System;

#[global_allocator]
static ALLOC: Pool<System> = Pool(System);

/// The pool is one per process and the tests count its blocks: they take turns (run in
/// parallel, a block the other test freed made `release`'s count flaky).
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn large_blocks_are_reused_and_zeroed_requests_see_zeros() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    // A size no other test uses (tests run in parallel in this process).
    let n = (3 * MIN_BLOCK + 4096) / 4;
    let mut a: Vec<f32> = vec![0.0; n];
    a.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32 + 1.0);
    let pa = a.as_ptr() as usize;
    drop(a);
    let (_, _, hits0) = pool::stats();
    // The same size again: the block just freed, cleared.
    let b: Vec<f32> = vec![0.0; n];
    assert_eq!(b.as_ptr() as usize, pa);
    assert!(b.iter().all(|&x| x == 0.0));
    assert!(pool::stats().2 > hits0);
    // Another size does not take it.
    let c: Vec<f32> = Vec::with_capacity(n + 1);
    assert_ne!(c.as_ptr() as usize, pa);
    drop((b, c));
    // Small blocks go to the system allocator.
    let (blocks, bytes, _) = pool::stats();
    let small: Vec<u8> = vec![1; 1000];
    drop(small);
    assert_eq!(pool::stats().0, blocks);
    assert_eq!(pool::stats().1, bytes);
    // SAFETY: the cached blocks came from `System`, which `ALLOC` wraps.
    unsafe { pool::release(&System) };
    assert_eq!(pool::stats().0, 0);
}

#[test]
fn growing_a_large_vector_keeps_its_contents() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let mut v: Vec<u32> = (0..MIN_BLOCK as u32).collect();
    v.reserve(3 * MIN_BLOCK);
    v.push(7);
    assert!(v[..MIN_BLOCK].iter().enumerate().all(|(i, &x)| x == i as u32));
    assert_eq!(v[MIN_BLOCK], 7);
}

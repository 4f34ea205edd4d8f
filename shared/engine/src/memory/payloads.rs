//! An object store: whole objects by key, as S3 keeps them, with its calls counted and its
//! writes and reads failing on demand.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::ports::Payloads;

/// What the store was asked, for the cost model and the invariants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PayloadStats {
    pub puts: u64,
    pub gets: u64,
    pub bytes_put: u64,
    pub bytes_got: u64,
}

#[derive(Debug, Default)]
struct Shelf {
    objects: HashMap<String, Vec<u8>>,
    stats: PayloadStats,
    failing_puts: u32,
    failing_gets: u32,
}

/// An in-memory object store.
#[derive(Debug, Default)]
pub struct MemoryPayloads {
    shelf: Mutex<Shelf>,
}

impl MemoryPayloads {
    /// The next `n` writes fail as S3 does when it is unavailable (nothing is written).
    pub fn fail_next_puts(&self, n: u32) {
        self.lock().failing_puts = n;
    }

    /// The next `n` reads fail as S3 does when it is unavailable.
    pub fn fail_next_gets(&self, n: u32) {
        self.lock().failing_gets = n;
    }

    /// Every object deleted, as a lifecycle rule deletes them once their retention is over.
    pub fn clear(&self) {
        self.lock().objects.clear();
    }

    pub fn stats(&self) -> PayloadStats {
        self.lock().stats
    }

    /// The keys of every object, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.lock().objects.keys().cloned().collect();
        keys.sort();
        keys
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shelf> {
        self.shelf.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Payloads for MemoryPayloads {
    async fn put(&self, key: &str, body: Vec<u8>) -> Result<()> {
        let mut shelf = self.lock();
        if shelf.failing_puts > 0 {
            shelf.failing_puts -= 1;
            return Err(Error::unavailable("payload store", "injected fault: slow down"));
        }
        shelf.stats.puts += 1;
        shelf.stats.bytes_put += body.len() as u64;
        shelf.objects.insert(key.to_owned(), body);
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let mut shelf = self.lock();
        if shelf.failing_gets > 0 {
            shelf.failing_gets -= 1;
            return Err(Error::unavailable("payload store", "injected fault: slow down"));
        }
        shelf.stats.gets += 1;
        let body = shelf.objects.get(key).cloned();
        shelf.stats.bytes_got += body.as_ref().map_or(0, |b| b.len() as u64);
        Ok(body)
    }
}

//! Pieces every backend shares: the preallocated completion queue a channel reports from,
//! SPDK-style UUIDs, and RPC parameter decoding.

use std::collections::VecDeque;
use std::io::Read;

use nvmf_rpc::RpcError;
use serde::de::DeserializeOwned;

use super::{BdevCompletion, BdevError, BdevIo, BdevRegistry, IoResult};

/// How many I/Os one channel accepts before `submit` hands them back. Completion queues are
/// sized to this once, when the channel opens, so the I/O path never allocates.
pub const CHANNEL_DEPTH: usize = 1024;

/// Finished I/O waiting for the next `poll`. Capacity is fixed at creation: `push` is only
/// called after `is_full` said there is room, so the deque never grows.
#[derive(Debug)]
pub struct CompletionQueue {
    queue: VecDeque<BdevCompletion>,
    capacity: usize,
}

impl CompletionQueue {
    pub fn new(capacity: usize) -> Self {
        Self {
            queue: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.queue.len() >= self.capacity
    }

    /// Queues a completion. Callers check `is_full` first; a push past capacity would still be
    /// correct, only no longer allocation-free.
    pub fn push(&mut self, completion: BdevCompletion) {
        debug_assert!(!self.is_full(), "completion queue pushed past its capacity");
        self.queue.push_back(completion);
    }

    /// Queues the completion of `io` with `result`, giving its buffer back.
    pub fn complete(&mut self, io: BdevIo, result: IoResult) {
        self.push(completion(io, result));
    }

    /// Reports everything queued, oldest first; returns how many.
    pub fn drain(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        let mut n = 0;
        while let Some(c) = self.queue.pop_front() {
            done(c);
            n += 1;
        }
        n
    }
}

/// The completion of `io`: same tag and kind, buffer handed back.
pub fn completion(io: BdevIo, result: IoResult) -> BdevCompletion {
    BdevCompletion {
        tag: io.tag,
        kind: io.kind,
        result,
        buf: io.buf,
    }
}

/// Parses SPDK's UUID string form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (either case).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let bytes = s.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut nibbles = 0usize;
    for (i, &c) in bytes.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
            continue;
        }
        let v = (c as char).to_digit(16)? as u8;
        out[nibbles / 2] |= if nibbles.is_multiple_of(2) { v << 4 } else { v };
        nibbles += 1;
    }
    Some(out)
}

/// Lowercase 8-4-4-4-12, as SPDK prints UUIDs.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// A random (version 4) UUID. Control path only: reads the kernel's random source.
pub fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut u));
    if filled.is_err() {
        // No /dev/urandom (odd containers): still unique enough for a device identifier.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let mixed = now ^ (u128::from(std::process::id()) << 64);
        u = mixed.to_le_bytes();
    }
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// The UUID an RPC asked for, or a fresh one; a malformed string is `-EINVAL` as in SPDK.
pub fn uuid_param(uuid: Option<&str>) -> Result<[u8; 16], RpcError> {
    match uuid {
        None => Ok(random_uuid()),
        Some(s) => parse_uuid(s)
            .ok_or_else(|| RpcError::errno(libc::EINVAL, format!("Failed to parse bdev UUID {s}"))),
    }
}

/// Decodes an RPC's `params` into its struct; a missing, mistyped or unknown field is
/// "Invalid params" with serde's description of what was wrong.
pub fn parse_params<T: DeserializeOwned>(params: serde_json::Value) -> Result<T, RpcError> {
    serde_json::from_value(params).map_err(|e| RpcError::invalid_params(e.to_string()))
}

/// `-EINVAL` with a message: what SPDK answers for a value it decoded but refuses.
pub fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::errno(libc::EINVAL, message)
}

/// Refuses metadata / DIF parameters other than their "off" values, naming the first one set.
pub fn reject_metadata(
    md_size: u32,
    md_interleave: bool,
    dif_type: i32,
    dif_is_head_of_md: bool,
    dif_pi_format: u32,
) -> Result<(), RpcError> {
    let set = [
        ("md_size", md_size != 0),
        ("md_interleave", md_interleave),
        ("dif_type", dif_type != 0),
        ("dif_is_head_of_md", dif_is_head_of_md),
        ("dif_pi_format", dif_pi_format != 0),
    ];
    match set.iter().find(|(_, on)| *on) {
        Some((field, _)) => Err(invalid(format!(
            "{field}: metadata and protection information are not supported by this target"
        ))),
        None => Ok(()),
    }
}

/// Deletes `name` if it is a bdev of type `T`: ENODEV when missing or of another type (SPDK's
/// answer when a module's delete finds no bdev of its own), EBUSY when claimed.
pub fn delete_typed<T: 'static>(
    bdevs: &mut BdevRegistry,
    name: &str,
) -> Result<serde_json::Value, RpcError> {
    let is_t = bdevs
        .get(name)
        .is_some_and(|b| b.as_any().downcast_ref::<T>().is_some());
    if !is_t {
        return Err(BdevError::NotFound(name.to_string()).into());
    }
    bdevs.unregister(name)?;
    Ok(serde_json::Value::Bool(true))
}

/// Gives bdev `name` (now `current` blocks) a size of `new` blocks through `set`: growing
/// always; shrinking only while nothing uses it, as SPDK refuses to shrink an open bdev
/// (`-EBUSY`): I/O in flight and hosts' idea of the size would both outrun it.
pub fn resize(
    bdevs: &BdevRegistry,
    name: &str,
    current: u64,
    new: u64,
    set: impl FnOnce(u64),
) -> Result<(), RpcError> {
    if new == 0 {
        return Err(invalid(format!("{name}: a size of 0 blocks")));
    }
    // Up the stack (a delay bdev on it, a split of that): one that keeps its bases' size
    // anywhere above keeps this one's.
    let mut below = name;
    while let Some(user) = bdevs.claimed_by(below).filter(|u| bdevs.contains(u)) {
        let keeps = bdevs.get(user).is_some_and(|b| b.keeps_base_size());
        if keeps && new != current {
            return Err(RpcError::errno(
                libc::EBUSY,
                format!("{name} is under {user}, which needs its size kept (a split's parts would move at the next start)"),
            ));
        }
        below = user;
    }
    if new < current {
        if let Some(user) = bdevs.claimed_by(name) {
            return Err(RpcError::errno(
                libc::EBUSY,
                format!("{name} is in use by {user}: it can grow, not shrink ({current} -> {new} blocks)"),
            ));
        }
    }
    if new != current {
        tracing::info!(bdev = name, from = current, to = new, "bdev resized");
        set(new);
    }
    Ok(())
}

/// A tiny xorshift generator, per channel: picks which I/O gets a p99 latency without a
/// syscall or a shared state.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_round_trips_and_rejects_garbage() {
        let s = "0123ABCD-4567-89ab-cdef-0123456789AB";
        let u = parse_uuid(s).unwrap();
        assert_eq!(u[0], 0x01);
        assert_eq!(u[15], 0xab);
        assert_eq!(format_uuid(&u), s.to_lowercase());
        assert!(parse_uuid("0123abcd-4567-89ab-cdef-0123456789a").is_none());
        assert!(parse_uuid("0123abcd+4567-89ab-cdef-0123456789ab").is_none());
        assert!(parse_uuid("0123abcd-4567-89ab-cdef-0123456789ag").is_none());
        let r = random_uuid();
        assert_ne!(r, random_uuid());
        assert_eq!(r[6] >> 4, 4);
        assert!(parse_uuid(&format_uuid(&r)) == Some(r));
    }

    #[test]
    fn completion_queue_drains_in_order() {
        let mut q = CompletionQueue::new(2);
        for tag in 0..2 {
            q.push(BdevCompletion {
                tag,
                kind: super::super::IoKind::Flush,
                result: Ok(()),
                buf: None,
            });
        }
        assert!(q.is_full());
        let mut tags = Vec::new();
        assert_eq!(q.drain(&mut |c| tags.push(c.tag)), 2);
        assert_eq!(tags, vec![0, 1]);
        assert!(q.is_empty());
    }
}

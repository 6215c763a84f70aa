//! Error injection bdev (SPDK's `vbdev_error`): `EE_<base>` passes I/O through to its base
//! bdev until an RPC arms an error for an I/O type.
//!
//! Injections live in atomics shared by every channel: one word per I/O type packs the error
//! type and how many I/Os are still to be hit, decremented with a compare-exchange, so exactly
//! `num` I/Os are hit however many reactors race for them. Held ("pending") I/Os stay in the
//! channel that got them; clearing an injection or deleting the bdev bumps a generation counter
//! that each channel checks on `poll`, and the channel then completes its held I/O with `EIO`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::json;

use super::util::{self, delete_typed, CompletionQueue, CHANNEL_DEPTH};
use super::{Bdev, BdevChannel, BdevCompletion, BdevError, BdevIo, BdevRef, BdevRegistry, IoKind};

/// What an armed injection does to the I/O it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// Complete with `EIO` without reaching the base bdev.
    Failure = 1,
    /// Hold the I/O until the injection is cleared (then `EIO`) or resumed (then the base).
    Pending = 2,
    /// Read from the base, then flip bits of one byte of the data.
    CorruptData = 3,
    /// Hand the I/O back from `submit`, as a channel out of resources does.
    Nomem = 4,
}

impl Effect {
    fn from_code(code: u64) -> Option<Self> {
        match code {
            1 => Some(Effect::Failure),
            2 => Some(Effect::Pending),
            3 => Some(Effect::CorruptData),
            4 => Some(Effect::Nomem),
            _ => None,
        }
    }
}

fn kind_index(kind: IoKind) -> usize {
    match kind {
        IoKind::Read => 0,
        IoKind::Write => 1,
        IoKind::Flush => 2,
        IoKind::WriteZeroes => 3,
        IoKind::Unmap => 4,
    }
}

fn pack(effect: Option<Effect>, remaining: u32) -> u64 {
    (effect.map_or(0, |e| e as u64) << 32) | u64::from(remaining)
}

/// The injection state of one error bdev, shared by the bdev and all its channels.
#[derive(Debug, Default)]
pub struct ErrorInjector {
    /// Per I/O type: effect code in the high half, I/Os still to hit in the low half.
    armed: [AtomicU64; 5],
    corrupt_offset: AtomicU64,
    corrupt_value: AtomicU64,
    /// Per I/O type: bumped when held I/O of that type must be failed.
    release_gen: [AtomicU64; 5],
    /// Bumped when held I/O must go on to the base bdev (`bdev_error_resume_pending`).
    resume_gen: AtomicU64,
}

impl ErrorInjector {
    fn arm(&self, kind: IoKind, effect: Option<Effect>, num: u32) {
        let i = kind_index(kind);
        self.armed[i].store(pack(effect, num), Ordering::Release);
        if effect.is_none() {
            self.release_gen[i].fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Claims one hit of the injection armed for `kind`, if any is left.
    fn take(&self, kind: IoKind) -> Option<Effect> {
        let slot = &self.armed[kind_index(kind)];
        // The hit is read from the value the update replaced, not noted inside the closure:
        // the closure runs again after each lost race, and a later run may find nothing left
        // (the last hit went to another thread) after an earlier one claimed it.
        slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            let effect = Effect::from_code(v >> 32)?;
            let remaining = (v & u64::from(u32::MAX)) as u32;
            let left = remaining.checked_sub(1)?;
            Some(pack(Some(effect), left))
        })
        .ok()
        .and_then(|claimed| Effect::from_code(claimed >> 32))
    }

    /// Returns a hit that could not be applied (the base refused the I/O), if the same
    /// injection is still armed.
    fn give_back(&self, kind: IoKind, effect: Effect) {
        let slot = &self.armed[kind_index(kind)];
        let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            (Effect::from_code(v >> 32) == Some(effect) && (v as u32) < u32::MAX).then_some(v + 1)
        });
    }

    /// Disarms every injection and fails every held I/O.
    pub fn clear_all(&self) {
        for kind in IoKind::ALL {
            self.arm(kind, None, 0);
        }
    }

    /// Sends every held I/O on to the base bdev.
    pub fn resume_pending(&self) {
        self.resume_gen.fetch_add(1, Ordering::AcqRel);
    }

    /// I/Os of `kind` the armed injection will still hit.
    pub fn remaining(&self, kind: IoKind) -> u32 {
        let v = self.armed[kind_index(kind)].load(Ordering::Acquire);
        if v >> 32 == 0 {
            0
        } else {
            v as u32
        }
    }
}

pub struct ErrorBdev {
    name: String,
    uuid: [u8; 16],
    base: BdevRef,
    inject: Arc<ErrorInjector>,
}

impl ErrorBdev {
    /// `EE_<base name>`, passing everything through until an injection is armed.
    pub fn new(base: BdevRef, uuid: Option<[u8; 16]>) -> Self {
        Self {
            name: format!("EE_{}", base.name()),
            uuid: uuid.unwrap_or_else(util::random_uuid),
            base,
            inject: Arc::new(ErrorInjector::default()),
        }
    }

    pub fn injector(&self) -> &ErrorInjector {
        &self.inject
    }
}

impl Bdev for ErrorBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn product_name(&self) -> &'static str {
        "Error Injection Disk"
    }
    fn block_size(&self) -> u32 {
        self.base.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.base.num_blocks()
    }
    fn uuid(&self) -> [u8; 16] {
        self.uuid
    }
    fn supports(&self, kind: IoKind) -> bool {
        self.base.supports(kind)
    }
    fn has_write_cache(&self) -> bool {
        self.base.has_write_cache()
    }
    fn read_only(&self) -> bool {
        self.base.read_only()
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        let inject = Arc::clone(&self.inject);
        let seen_release = std::array::from_fn(|i| inject.release_gen[i].load(Ordering::Acquire));
        let seen_resume = inject.resume_gen.load(Ordering::Acquire);
        Ok(Box::new(ErrorChannel {
            base: self.base.open_channel()?,
            inject,
            done: CompletionQueue::new(CHANNEL_DEPTH),
            held: VecDeque::with_capacity(CHANNEL_DEPTH),
            corrupt_tags: Vec::with_capacity(CHANNEL_DEPTH),
            seen_release,
            seen_resume,
            to_resume: 0,
        }))
    }
    fn config_entry(&self) -> serde_json::Value {
        json!({
            "method": "bdev_error_create",
            "params": {
                "base_name": self.base.name(),
                "uuid": util::format_uuid(&self.uuid),
            }
        })
    }
    fn base_bdevs(&self) -> Vec<String> {
        vec![self.base.name().to_string()]
    }
    fn on_delete(&self) {
        // Held I/O would otherwise wait forever for a clear that can no longer come.
        self.inject.clear_all();
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct ErrorChannel {
    base: Box<dyn BdevChannel>,
    inject: Arc<ErrorInjector>,
    done: CompletionQueue,
    /// I/O hit by a `pending` injection.
    held: VecDeque<BdevIo>,
    /// Reads to corrupt when the base completes them.
    corrupt_tags: Vec<u64>,
    seen_release: [u64; 5],
    seen_resume: u64,
    /// Held I/Os (from the front) still to be sent on after a resume.
    to_resume: usize,
}

impl ErrorChannel {
    fn release_and_resume(&mut self) {
        for (i, kind) in IoKind::ALL.into_iter().enumerate() {
            let gen = self.inject.release_gen[i].load(Ordering::Acquire);
            if gen == self.seen_release[i] {
                continue;
            }
            self.seen_release[i] = gen;
            // Rotate through the held queue once, failing this type and keeping the rest.
            for _ in 0..self.held.len() {
                let io = self.held.pop_front().expect("counted");
                if io.kind == kind {
                    self.to_resume = self.to_resume.saturating_sub(1);
                    self.done.complete(io, Err(libc::EIO));
                } else {
                    self.held.push_back(io);
                }
            }
        }
        let gen = self.inject.resume_gen.load(Ordering::Acquire);
        if gen != self.seen_resume {
            self.seen_resume = gen;
            self.to_resume = self.held.len();
        }
        while self.to_resume > 0 {
            let io = self.held.pop_front().expect("to_resume <= held");
            match self.base.submit(io) {
                Ok(()) => self.to_resume -= 1,
                Err(io) => {
                    self.held.push_front(io);
                    break;
                }
            }
        }
    }
}

impl BdevChannel for ErrorChannel {
    fn submit(&mut self, io: BdevIo) -> Result<(), BdevIo> {
        // Bounds `done` and `held`, so pushing to them never allocates.
        if self.in_flight() >= CHANNEL_DEPTH {
            return Err(io);
        }
        match self.inject.take(io.kind) {
            None => self.base.submit(io),
            Some(Effect::Failure) => {
                self.done.complete(io, Err(libc::EIO));
                Ok(())
            }
            Some(Effect::Pending) => {
                self.held.push_back(io);
                Ok(())
            }
            Some(Effect::Nomem) => Err(io),
            Some(Effect::CorruptData) => {
                let (tag, kind) = (io.tag, io.kind);
                self.corrupt_tags.push(tag);
                self.base.submit(io).inspect_err(|_| {
                    self.corrupt_tags.pop();
                    self.inject.give_back(kind, Effect::CorruptData);
                })
            }
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        self.release_and_resume();
        let corrupt_tags = &mut self.corrupt_tags;
        let inject = &self.inject;
        let mut n = self.base.poll(&mut |mut c| {
            if let Some(pos) = corrupt_tags.iter().position(|&t| t == c.tag) {
                corrupt_tags.swap_remove(pos);
                if c.result.is_ok() {
                    let offset = inject.corrupt_offset.load(Ordering::Acquire);
                    let value = inject.corrupt_value.load(Ordering::Acquire) as u8;
                    let byte = c
                        .buf
                        .as_mut()
                        .and_then(|b| usize::try_from(offset).ok().and_then(|o| b.get_mut(o)));
                    if let Some(byte) = byte {
                        *byte ^= value;
                    }
                }
            }
            done(c);
        });
        n += self.done.drain(done);
        n
    }

    fn in_flight(&self) -> usize {
        self.base.in_flight() + self.done.len() + self.held.len()
    }
}

/// `bdev_error_create`: creates `EE_<base_name>` and claims the base.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorCreateParams {
    pub base_name: String,
    #[serde(default)]
    pub uuid: Option<String>,
}

/// Answers `true`, as SPDK does (the new bdev's name is `EE_<base_name>`).
pub fn rpc_bdev_error_create(
    bdevs: &mut BdevRegistry,
    params: ErrorCreateParams,
) -> Result<serde_json::Value, RpcError> {
    let uuid = util::uuid_param(params.uuid.as_deref())?;
    let base = bdevs
        .get(&params.base_name)
        .cloned()
        .ok_or_else(|| BdevError::NotFound(params.base_name.clone()))?;
    let bdev = ErrorBdev::new(base, Some(uuid));
    bdevs.register(Arc::new(bdev))?;
    Ok(serde_json::Value::Bool(true))
}

/// `bdev_error_delete`: `name` is the error bdev (`EE_...`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorDeleteParams {
    pub name: String,
}

pub fn rpc_bdev_error_delete(
    bdevs: &mut BdevRegistry,
    params: ErrorDeleteParams,
) -> Result<serde_json::Value, RpcError> {
    delete_typed::<ErrorBdev>(bdevs, &params.name)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InjectIoType {
    Read,
    Write,
    Flush,
    Unmap,
    WriteZeroes,
    All,
    /// Disarms every I/O type, whatever `error_type` says.
    Clear,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InjectErrorType {
    Failure,
    Pending,
    CorruptData,
    Nomem,
    /// Completing with a chosen NVMe status needs a status path a bdev does not have here.
    NvmeFailure,
    Clear,
}

/// `bdev_error_inject_error`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorInjectParams {
    pub name: String,
    pub io_type: InjectIoType,
    pub error_type: InjectErrorType,
    #[serde(default = "one")]
    pub num: u32,
    #[serde(default)]
    pub queue_depth: u64,
    #[serde(default)]
    pub corrupt_offset: u64,
    #[serde(default)]
    pub corrupt_value: u8,
    #[serde(default)]
    pub nvme_sct: u32,
    #[serde(default)]
    pub nvme_sc: u32,
}

fn one() -> u32 {
    1
}

fn error_bdev<'a>(bdevs: &'a BdevRegistry, name: &str) -> Result<&'a ErrorBdev, RpcError> {
    bdevs
        .get(name)
        .and_then(|b| b.as_any().downcast_ref::<ErrorBdev>())
        .ok_or_else(|| BdevError::NotFound(name.to_string()).into())
}

pub fn rpc_bdev_error_inject_error(
    bdevs: &mut BdevRegistry,
    params: ErrorInjectParams,
) -> Result<serde_json::Value, RpcError> {
    let bdev = error_bdev(bdevs, &params.name)?;
    let inject = &bdev.inject;
    let kinds: &[IoKind] = match params.io_type {
        InjectIoType::Clear => {
            inject.clear_all();
            return Ok(serde_json::Value::Bool(true));
        }
        InjectIoType::All => &IoKind::ALL,
        InjectIoType::Read => &[IoKind::Read],
        InjectIoType::Write => &[IoKind::Write],
        InjectIoType::Flush => &[IoKind::Flush],
        InjectIoType::Unmap => &[IoKind::Unmap],
        InjectIoType::WriteZeroes => &[IoKind::WriteZeroes],
    };
    if params.queue_depth != 0 {
        return Err(util::invalid(
            "queue_depth-gated injection is not supported",
        ));
    }
    if params.nvme_sct != 0 || params.nvme_sc != 0 {
        return Err(util::invalid(
            "nvme_sct / nvme_sc apply only to nvme_failure, which is not supported",
        ));
    }
    let effect = match params.error_type {
        InjectErrorType::Clear => None,
        InjectErrorType::Failure => Some(Effect::Failure),
        InjectErrorType::Pending => Some(Effect::Pending),
        InjectErrorType::Nomem => Some(Effect::Nomem),
        InjectErrorType::CorruptData => Some(Effect::CorruptData),
        InjectErrorType::NvmeFailure => {
            return Err(util::invalid(
                "error_type nvme_failure is not supported: bdevs report errno values",
            ))
        }
    };
    if effect.is_some() && params.num == 0 {
        return Err(util::invalid("num must be at least 1"));
    }
    if effect == Some(Effect::CorruptData) {
        // Corrupting a write would alter the host's buffer, which a bdev gives back untouched.
        if !matches!(params.io_type, InjectIoType::Read | InjectIoType::All) {
            return Err(util::invalid(
                "corrupt_data is supported for reads only (io_type read or all)",
            ));
        }
        if params.corrupt_value == 0 {
            return Err(util::invalid(
                "corrupt_value must be non-zero for corrupt_data",
            ));
        }
        inject
            .corrupt_offset
            .store(params.corrupt_offset, Ordering::Release);
        inject
            .corrupt_value
            .store(u64::from(params.corrupt_value), Ordering::Release);
        inject.arm(IoKind::Read, effect, params.num);
        return Ok(serde_json::Value::Bool(true));
    }
    for &kind in kinds {
        inject.arm(kind, effect, params.num);
    }
    Ok(serde_json::Value::Bool(true))
}

/// `bdev_error_resume_pending`: held I/O goes on to the base bdev.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorResumePendingParams {
    pub name: String,
}

pub fn rpc_bdev_error_resume_pending(
    bdevs: &mut BdevRegistry,
    params: ErrorResumePendingParams,
) -> Result<serde_json::Value, RpcError> {
    error_bdev(bdevs, &params.name)?.inject.resume_pending();
    Ok(serde_json::Value::Bool(true))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{self, io};
    use super::super::util::parse_params;
    use super::*;

    fn setup() -> BdevRegistry {
        let mut reg = testutil::registry_with_malloc0();
        let p = parse_params(json!({"base_name": "Malloc0"})).unwrap();
        assert_eq!(rpc_bdev_error_create(&mut reg, p).unwrap(), json!(true));
        reg
    }

    fn inject(
        reg: &mut BdevRegistry,
        params: serde_json::Value,
    ) -> Result<serde_json::Value, RpcError> {
        let mut p = params;
        p["name"] = json!("EE_Malloc0");
        rpc_bdev_error_inject_error(reg, parse_params(p)?)
    }

    #[test]
    fn passes_data_through() {
        let reg = setup();
        let ee = reg.get("EE_Malloc0").unwrap();
        assert_eq!(ee.product_name(), "Error Injection Disk");
        testutil::data_contract(ee.as_ref());
    }

    #[test]
    fn failure_hits_exactly_num_ios_of_that_type() {
        let mut reg = setup();
        let ee = Arc::clone(reg.get("EE_Malloc0").unwrap());
        let pool = testutil::pool(512, 1);
        let mut ch = ee.open_channel().unwrap();
        let ch = ch.as_mut();
        inject(
            &mut reg,
            json!({"io_type": "read", "error_type": "failure", "num": 2}),
        )
        .unwrap();
        // Writes are not hit.
        for i in 0..3 {
            testutil::write(ch, &pool, 512, i, 1, 10 + i);
        }
        let mut results = Vec::new();
        for i in 0..4 {
            let c = testutil::run(
                ch,
                io(i, IoKind::Read, 0, 1, Some(testutil::buf(&pool, 512))),
            );
            results.push(c.result);
        }
        assert_eq!(results, [Err(libc::EIO), Err(libc::EIO), Ok(()), Ok(())]);
        testutil::expect_pattern(ch, &pool, 512, 1, 1, 11);

        // `all` arms every type once; the default num is 1.
        inject(&mut reg, json!({"io_type": "all", "error_type": "failure"})).unwrap();
        for kind in [IoKind::Flush, IoKind::Unmap, IoKind::WriteZeroes] {
            assert_eq!(
                testutil::run(ch, io(1, kind, 8, 1, None)).result,
                Err(libc::EIO)
            );
            assert_eq!(testutil::run(ch, io(2, kind, 8, 1, None)).result, Ok(()));
        }
        let c = testutil::run(
            ch,
            io(3, IoKind::Write, 0, 1, Some(testutil::buf(&pool, 512))),
        );
        assert_eq!(c.result, Err(libc::EIO));
        let c = testutil::run(
            ch,
            io(4, IoKind::Read, 0, 1, Some(testutil::buf(&pool, 512))),
        );
        assert_eq!(c.result, Err(libc::EIO));
        // The failed write never reached the base.
        testutil::expect_pattern(ch, &pool, 512, 0, 1, 10);
    }

    #[test]
    fn failure_count_is_exact_across_threads() {
        let mut reg = setup();
        let ee = Arc::clone(reg.get("EE_Malloc0").unwrap());
        inject(
            &mut reg,
            json!({"io_type": "flush", "error_type": "failure", "num": 50}),
        )
        .unwrap();
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let ee = Arc::clone(&ee);
                std::thread::spawn(move || {
                    let mut ch = ee.open_channel().unwrap();
                    (0..100)
                        .filter(|&t| {
                            testutil::run(ch.as_mut(), io(t, IoKind::Flush, 0, 1, None)).result
                                == Err(libc::EIO)
                        })
                        .count()
                })
            })
            .collect();
        let failed: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(failed, 50);
    }

    #[test]
    fn pending_is_held_until_clear_or_resume() {
        let mut reg = setup();
        let ee = Arc::clone(reg.get("EE_Malloc0").unwrap());
        let pool = testutil::pool(512, 1);
        let mut ch = ee.open_channel().unwrap();
        let ch = ch.as_mut();
        inject(
            &mut reg,
            json!({"io_type": "write", "error_type": "pending"}),
        )
        .unwrap();
        let mut b = testutil::buf(&pool, 512);
        b.fill(0x5A);
        ch.submit(io(1, IoKind::Write, 0, 1, Some(b))).unwrap();
        for _ in 0..100 {
            assert_eq!(ch.poll(&mut |c| panic!("held I/O completed: {c:?}")), 0);
        }
        assert_eq!(ch.in_flight(), 1);
        // Other types still pass.
        assert_eq!(
            testutil::run(ch, io(2, IoKind::Flush, 0, 1, None)).result,
            Ok(())
        );
        assert_eq!(ch.in_flight(), 1);
        // Clearing another type releases nothing; clearing writes fails the held one.
        inject(&mut reg, json!({"io_type": "read", "error_type": "clear"})).unwrap();
        assert_eq!(ch.poll(&mut |c| panic!("released early: {c:?}")), 0);
        inject(&mut reg, json!({"io_type": "write", "error_type": "clear"})).unwrap();
        let c = testutil::wait(ch, 1);
        assert_eq!(c.result, Err(libc::EIO));
        assert!(c.buf.unwrap().iter().all(|&x| x == 0x5A));
        assert_eq!(ch.in_flight(), 0);
        testutil::expect_zeroes(ch, &pool, 512, 0, 1);

        // Resume sends held I/O on to the base, where it takes effect.
        inject(
            &mut reg,
            json!({"io_type": "write", "error_type": "pending"}),
        )
        .unwrap();
        let mut b = testutil::buf(&pool, 512);
        b.fill(0x77);
        ch.submit(io(3, IoKind::Write, 0, 1, Some(b))).unwrap();
        assert_eq!(ch.poll(&mut |c| panic!("held I/O completed: {c:?}")), 0);
        let p = parse_params(json!({"name": "EE_Malloc0"})).unwrap();
        rpc_bdev_error_resume_pending(&mut reg, p).unwrap();
        assert_eq!(testutil::wait(ch, 3).result, Ok(()));
        assert!(testutil::read(ch, &pool, 512, 0, 1)
            .iter()
            .all(|&x| x == 0x77));

        // `io_type: clear` and deleting the bdev both release held I/O.
        inject(
            &mut reg,
            json!({"io_type": "read", "error_type": "pending", "num": 2}),
        )
        .unwrap();
        ch.submit(io(4, IoKind::Read, 0, 1, Some(testutil::buf(&pool, 512))))
            .unwrap();
        inject(&mut reg, json!({"io_type": "clear", "error_type": "clear"})).unwrap();
        assert_eq!(testutil::wait(ch, 4).result, Err(libc::EIO));
        inject(
            &mut reg,
            json!({"io_type": "read", "error_type": "pending"}),
        )
        .unwrap();
        ch.submit(io(5, IoKind::Read, 0, 1, Some(testutil::buf(&pool, 512))))
            .unwrap();
        let p = parse_params(json!({"name": "EE_Malloc0"})).unwrap();
        rpc_bdev_error_delete(&mut reg, p).unwrap();
        assert_eq!(testutil::wait(ch, 5).result, Err(libc::EIO));
        assert_eq!(ch.in_flight(), 0);
        assert_eq!(pool.available(), pool.count() as usize, "a buffer leaked");
    }

    #[test]
    fn nomem_hands_io_back_then_accepts_it() {
        let mut reg = setup();
        let ee = Arc::clone(reg.get("EE_Malloc0").unwrap());
        let pool = testutil::pool(512, 1);
        let mut ch = ee.open_channel().unwrap();
        let ch = ch.as_mut();
        inject(
            &mut reg,
            json!({"io_type": "write", "error_type": "nomem", "num": 2}),
        )
        .unwrap();
        let mut b = testutil::buf(&pool, 512);
        b.fill(0x33);
        let mut w = io(9, IoKind::Write, 2, 1, Some(b));
        for _ in 0..2 {
            w = ch.submit(w).expect_err("nomem must hand the I/O back");
            assert_eq!(ch.in_flight(), 0);
        }
        ch.submit(w).unwrap();
        assert_eq!(testutil::wait(ch, 9).result, Ok(()));
        assert!(testutil::read(ch, &pool, 512, 2, 1)
            .iter()
            .all(|&x| x == 0x33));
    }

    #[test]
    fn corrupt_data_flips_one_read_byte() {
        let mut reg = setup();
        let ee = Arc::clone(reg.get("EE_Malloc0").unwrap());
        let pool = testutil::pool(512, 1);
        let mut ch = ee.open_channel().unwrap();
        let ch = ch.as_mut();
        let params = json!({"io_type": "read", "error_type": "corrupt_data",
                            "corrupt_offset": 5, "corrupt_value": 0x81});
        inject(&mut reg, params).unwrap();
        let got = testutil::read(ch, &pool, 512, 0, 1);
        assert_eq!(got[5], 0x81);
        assert!(got.iter().enumerate().all(|(i, &b)| i == 5 || b == 0));
        assert!(testutil::read(ch, &pool, 512, 0, 1).iter().all(|&b| b == 0));
        let bad = json!({"io_type": "write", "error_type": "corrupt_data", "corrupt_value": 1});
        assert!(inject(&mut reg, bad)
            .unwrap_err()
            .message
            .contains("reads only"));
        let bad = json!({"io_type": "read", "error_type": "corrupt_data"});
        assert_eq!(inject(&mut reg, bad).unwrap_err().code, -libc::EINVAL);
    }

    #[test]
    fn rpc_errors_leave_state_unchanged() {
        let mut reg = setup();
        assert_eq!(reg.claimed_by("Malloc0"), Some("EE_Malloc0"));
        // Duplicate: the base is already claimed / EE_Malloc0 exists.
        let p: ErrorCreateParams = parse_params(json!({"base_name": "Malloc0"})).unwrap();
        assert_eq!(
            rpc_bdev_error_create(&mut reg, p).unwrap_err().code,
            -libc::EEXIST
        );
        let p: ErrorCreateParams = parse_params(json!({"base_name": "nope"})).unwrap();
        assert_eq!(
            rpc_bdev_error_create(&mut reg, p).unwrap_err().code,
            -libc::ENODEV
        );
        assert!(parse_params::<ErrorCreateParams>(json!({})).is_err());
        assert!(parse_params::<ErrorCreateParams>(json!({"base_name": "a", "b": 1})).is_err());
        assert_eq!(reg.len(), 2);

        // The claimed base cannot be deleted.
        let p = parse_params(json!({"name": "Malloc0"})).unwrap();
        let err = super::super::malloc::rpc_bdev_malloc_delete(&mut reg, p).unwrap_err();
        assert_eq!(err.code, -libc::EBUSY);
        assert_eq!(reg.len(), 2);

        // Injection parameters.
        assert!(inject(
            &mut reg,
            json!({"io_type": "reads", "error_type": "failure"})
        )
        .is_err());
        assert!(inject(&mut reg, json!({"io_type": "read"})).is_err());
        assert!(inject(
            &mut reg,
            json!({"io_type": "read", "error_type": "failure", "x": 1})
        )
        .is_err());
        assert_eq!(
            inject(
                &mut reg,
                json!({"io_type": "read", "error_type": "nvme_failure"})
            )
            .unwrap_err()
            .code,
            -libc::EINVAL
        );
        assert_eq!(
            inject(
                &mut reg,
                json!({"io_type": "read", "error_type": "failure", "queue_depth": 4})
            )
            .unwrap_err()
            .code,
            -libc::EINVAL
        );
        let ee = reg.get("EE_Malloc0").unwrap();
        let ee = ee.as_any().downcast_ref::<ErrorBdev>().unwrap();
        assert_eq!(ee.injector().remaining(IoKind::Read), 0);
        let p =
            parse_params(json!({"name": "Malloc0", "io_type": "read", "error_type": "failure"}))
                .unwrap();
        assert_eq!(
            rpc_bdev_error_inject_error(&mut reg, p).unwrap_err().code,
            -libc::ENODEV
        );

        // Config recreates it; delete releases the base.
        let entry = reg.get("EE_Malloc0").unwrap().config_entry();
        assert_eq!(entry["method"], "bdev_error_create");
        parse_params::<ErrorCreateParams>(entry["params"].clone()).unwrap();
        let p: ErrorDeleteParams = parse_params(json!({"name": "Malloc0"})).unwrap();
        assert_eq!(
            rpc_bdev_error_delete(&mut reg, p).unwrap_err().code,
            -libc::ENODEV
        );
        let p: ErrorDeleteParams = parse_params(json!({"name": "EE_Malloc0"})).unwrap();
        assert_eq!(rpc_bdev_error_delete(&mut reg, p).unwrap(), json!(true));
        assert_eq!(reg.claimed_by("Malloc0"), None);
        let p = parse_params(json!({"name": "Malloc0"})).unwrap();
        super::super::malloc::rpc_bdev_malloc_delete(&mut reg, p).unwrap();
        assert!(reg.is_empty());
    }
}

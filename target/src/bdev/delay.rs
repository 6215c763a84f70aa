//! Delay bdev (SPDK's `vbdev_delay`): stacked on a base bdev, it holds each read and write
//! completion back for a configured latency, to emulate a slow device or trip host timeouts.
//!
//! As in SPDK the latency starts when the base completes the I/O; about one I/O in a hundred gets
//! the p99 latency instead of the average. Flush, Unmap and WriteZeroes are not delayed. Held
//! completions wait in four preallocated FIFOs (average / p99, read / write) that `poll` checks
//! against the monotonic clock; a FIFO stops at its first entry not yet due, so lowering a latency
//! at run time takes effect once the I/O held under the old one has drained (SPDK's behaviour).
//! Latencies live in atomics shared with every channel, so `bdev_delay_update_latency` applies
//! to I/O completing from then on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::json;

use super::util::{self, delete_typed, XorShift, CHANNEL_DEPTH};
use super::{Bdev, BdevChannel, BdevCompletion, BdevError, BdevIo, BdevRef, BdevRegistry, IoKind};

/// Which latency an I/O gets; the index into the latency table and the channel's FIFOs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyType {
    AvgRead = 0,
    P99Read = 1,
    AvgWrite = 2,
    P99Write = 3,
}

/// Latencies in microseconds, indexed by `LatencyType`.
#[derive(Debug, Default)]
struct Latencies([AtomicU64; 4]);

impl Latencies {
    fn get(&self, t: LatencyType) -> u64 {
        self.0[t as usize].load(Ordering::Relaxed)
    }
    fn set(&self, t: LatencyType, us: u64) {
        self.0[t as usize].store(us, Ordering::Relaxed);
    }
}

pub struct DelayBdev {
    name: String,
    uuid: [u8; 16],
    base: BdevRef,
    latencies: Arc<Latencies>,
}

impl DelayBdev {
    /// Latencies in microseconds, as SPDK's RPC takes them.
    pub fn new(
        name: impl Into<String>,
        base: BdevRef,
        uuid: Option<[u8; 16]>,
        avg_read_us: u64,
        p99_read_us: u64,
        avg_write_us: u64,
        p99_write_us: u64,
    ) -> Self {
        let latencies = Latencies::default();
        latencies.set(LatencyType::AvgRead, avg_read_us);
        latencies.set(LatencyType::P99Read, p99_read_us);
        latencies.set(LatencyType::AvgWrite, avg_write_us);
        latencies.set(LatencyType::P99Write, p99_write_us);
        Self {
            name: name.into(),
            uuid: uuid.unwrap_or_else(util::random_uuid),
            base,
            latencies: Arc::new(latencies),
        }
    }

    pub fn latency_us(&self, t: LatencyType) -> u64 {
        self.latencies.get(t)
    }

    /// Changes one latency for every channel; I/O already held keeps its due time.
    pub fn set_latency_us(&self, t: LatencyType, us: u64) {
        self.latencies.set(t, us);
    }
}

impl Bdev for DelayBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn product_name(&self) -> &'static str {
        "delay"
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
        let seed = u64::from_ne_bytes(util::random_uuid()[..8].try_into().expect("8 bytes"));
        Ok(Box::new(DelayChannel {
            base: self.base.open_channel()?,
            latencies: Arc::clone(&self.latencies),
            held: std::array::from_fn(|_| VecDeque::with_capacity(CHANNEL_DEPTH)),
            rng: XorShift::new(seed),
            outstanding: 0,
        }))
    }
    fn config_entry(&self) -> serde_json::Value {
        json!({
            "method": "bdev_delay_create",
            "params": {
                "base_bdev_name": self.base.name(),
                "name": self.name,
                "uuid": util::format_uuid(&self.uuid),
                "avg_read_latency": self.latencies.get(LatencyType::AvgRead),
                "p99_read_latency": self.latencies.get(LatencyType::P99Read),
                "avg_write_latency": self.latencies.get(LatencyType::AvgWrite),
                "p99_write_latency": self.latencies.get(LatencyType::P99Write),
            }
        })
    }
    fn base_bdevs(&self) -> Vec<String> {
        vec![self.base.name().to_string()]
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct DelayChannel {
    base: Box<dyn BdevChannel>,
    latencies: Arc<Latencies>,
    /// Completions not yet due, one FIFO per `LatencyType`.
    held: [VecDeque<(Instant, BdevCompletion)>; 4],
    rng: XorShift,
    /// Submitted and not yet reported; bounds the FIFOs so they never grow.
    outstanding: usize,
}

/// `now + us`, saturating far in the future rather than overflowing the clock.
fn due(now: Instant, us: u64) -> Instant {
    now.checked_add(Duration::from_micros(us))
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now)
}

impl BdevChannel for DelayChannel {
    fn submit(&mut self, io: BdevIo) -> Result<(), BdevIo> {
        if self.outstanding >= CHANNEL_DEPTH {
            return Err(io);
        }
        self.base.submit(io)?;
        self.outstanding += 1;
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        let now = Instant::now();
        let mut n = 0;
        let (held, latencies, rng) = (&mut self.held, &self.latencies, &mut self.rng);
        self.base.poll(&mut |c| {
            let p99 = rng.next_u64() % 100 == 0;
            let t = match (c.kind, p99) {
                (IoKind::Read, false) => LatencyType::AvgRead,
                (IoKind::Read, true) => LatencyType::P99Read,
                (IoKind::Write, false) => LatencyType::AvgWrite,
                (IoKind::Write, true) => LatencyType::P99Write,
                _ => {
                    done(c);
                    n += 1;
                    return;
                }
            };
            match latencies.get(t) {
                0 => {
                    done(c);
                    n += 1;
                }
                us => held[t as usize].push_back((due(now, us), c)),
            }
        });
        for fifo in &mut self.held {
            while fifo.front().is_some_and(|(at, _)| *at <= now) {
                let (_, c) = fifo.pop_front().expect("front checked");
                done(c);
                n += 1;
            }
        }
        self.outstanding -= n;
        n
    }

    fn in_flight(&self) -> usize {
        self.outstanding
    }
}

/// `bdev_delay_create`; latencies in microseconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelayCreateParams {
    pub base_bdev_name: String,
    pub name: String,
    #[serde(default)]
    pub uuid: Option<String>,
    pub avg_read_latency: u64,
    pub p99_read_latency: u64,
    pub avg_write_latency: u64,
    pub p99_write_latency: u64,
}

/// Answers the new bdev's name. Unlike SPDK, a missing base bdev is an error (`-ENODEV`) rather
/// than a creation deferred until such a bdev appears.
pub fn rpc_bdev_delay_create(
    bdevs: &mut BdevRegistry,
    params: DelayCreateParams,
) -> Result<serde_json::Value, RpcError> {
    let uuid = util::uuid_param(params.uuid.as_deref())?;
    let base = bdevs
        .get(&params.base_bdev_name)
        .cloned()
        .ok_or_else(|| BdevError::NotFound(params.base_bdev_name.clone()))?;
    let bdev = DelayBdev::new(
        params.name.clone(),
        base,
        Some(uuid),
        params.avg_read_latency,
        params.p99_read_latency,
        params.avg_write_latency,
        params.p99_write_latency,
    );
    bdevs.register(Arc::new(bdev))?;
    Ok(serde_json::Value::String(params.name))
}

/// `bdev_delay_delete`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelayDeleteParams {
    pub name: String,
}

pub fn rpc_bdev_delay_delete(
    bdevs: &mut BdevRegistry,
    params: DelayDeleteParams,
) -> Result<serde_json::Value, RpcError> {
    delete_typed::<DelayBdev>(bdevs, &params.name)
}

/// `bdev_delay_update_latency`. SPDK names the type field `latency_type`; `delay_type` is
/// accepted as an alias.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelayUpdateLatencyParams {
    pub delay_bdev_name: String,
    #[serde(alias = "delay_type")]
    pub latency_type: LatencyType,
    pub latency_us: u64,
}

/// Errors as SPDK answers them: no such bdev is "Invalid params", a bdev of another type
/// "Invalid request".
pub fn rpc_bdev_delay_update_latency(
    bdevs: &mut BdevRegistry,
    params: DelayUpdateLatencyParams,
) -> Result<serde_json::Value, RpcError> {
    let bdev = bdevs
        .get(&params.delay_bdev_name)
        .ok_or_else(|| RpcError::invalid_params("The requested bdev does not exist."))?;
    let delay = bdev.as_any().downcast_ref::<DelayBdev>().ok_or_else(|| {
        RpcError::new(
            RpcError::INVALID_REQUEST,
            "The requested bdev is not a delay bdev.",
        )
    })?;
    delay.set_latency_us(params.latency_type, params.latency_us);
    Ok(serde_json::Value::Bool(true))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{self, io};
    use super::super::util::parse_params;
    use super::*;

    fn setup(avg_read: u64, avg_write: u64) -> BdevRegistry {
        let mut reg = testutil::registry_with_malloc0();
        let p = parse_params(json!({
            "base_bdev_name": "Malloc0", "name": "Delay0",
            "avg_read_latency": avg_read, "p99_read_latency": avg_read,
            "avg_write_latency": avg_write, "p99_write_latency": avg_write,
        }))
        .unwrap();
        assert_eq!(rpc_bdev_delay_create(&mut reg, p).unwrap(), json!("Delay0"));
        reg
    }

    #[test]
    fn passes_data_through_without_latency() {
        let reg = setup(0, 0);
        let d = reg.get("Delay0").unwrap();
        assert_eq!(d.product_name(), "delay");
        testutil::data_contract(d.as_ref());
    }

    #[test]
    fn reads_and_writes_wait_their_latency() {
        let mut reg = setup(20_000, 30_000);
        let d = Arc::clone(reg.get("Delay0").unwrap());
        let pool = testutil::pool(512, 1);
        let mut ch = d.open_channel().unwrap();
        let ch = ch.as_mut();

        let start = Instant::now();
        let c = testutil::run(
            ch,
            io(1, IoKind::Read, 0, 1, Some(testutil::buf(&pool, 512))),
        );
        assert_eq!(c.result, Ok(()));
        assert!(
            start.elapsed() >= Duration::from_millis(20),
            "read not delayed"
        );

        let start = Instant::now();
        let c = testutil::run(
            ch,
            io(2, IoKind::Write, 0, 1, Some(testutil::buf(&pool, 512))),
        );
        assert_eq!(c.result, Ok(()));
        assert!(
            start.elapsed() >= Duration::from_millis(30),
            "write not delayed"
        );

        // Updated latencies apply to the next I/O, whichever field name the caller uses.
        for (field, us) in [("latency_type", 40_000u64), ("delay_type", 40_000)] {
            for t in ["avg_read", "p99_read"] {
                let p =
                    parse_params(json!({"delay_bdev_name": "Delay0", field: t, "latency_us": us}))
                        .unwrap();
                assert_eq!(
                    rpc_bdev_delay_update_latency(&mut reg, p).unwrap(),
                    json!(true)
                );
            }
        }
        let start = Instant::now();
        let c = testutil::run(
            ch,
            io(3, IoKind::Read, 0, 1, Some(testutil::buf(&pool, 512))),
        );
        assert_eq!(c.result, Ok(()));
        assert!(
            start.elapsed() >= Duration::from_millis(40),
            "update not applied"
        );
        assert_eq!(
            reg.get("Delay0").unwrap().config_entry()["params"]["avg_read_latency"],
            40_000
        );
    }

    #[test]
    fn held_io_counts_as_in_flight_and_huge_latency_does_not_panic() {
        let reg = setup(u64::MAX, u64::MAX);
        let d = Arc::clone(reg.get("Delay0").unwrap());
        let pool = testutil::pool(512, 1);
        let mut ch = d.open_channel().unwrap();
        ch.submit(io(1, IoKind::Read, 0, 1, Some(testutil::buf(&pool, 512))))
            .unwrap();
        for _ in 0..10 {
            assert_eq!(ch.poll(&mut |c| panic!("completed early: {c:?}")), 0);
        }
        assert_eq!(ch.in_flight(), 1);
        // Errors of the base are delayed too, and flush is not delayed at all.
        let c = testutil::run(ch.as_mut(), io(2, IoKind::Flush, 0, 1, None));
        assert_eq!(c.result, Ok(()));
        assert_eq!(ch.in_flight(), 1);
    }

    #[test]
    fn rpc_errors_leave_state_unchanged() {
        let mut reg = setup(0, 0);
        assert_eq!(reg.claimed_by("Malloc0"), Some("Delay0"));
        let make = |base: &str, name: &str| -> DelayCreateParams {
            parse_params(json!({
                "base_bdev_name": base, "name": name,
                "avg_read_latency": 1, "p99_read_latency": 2,
                "avg_write_latency": 3, "p99_write_latency": 4,
            }))
            .unwrap()
        };
        assert_eq!(
            rpc_bdev_delay_create(&mut reg, make("Malloc0", "Delay0"))
                .unwrap_err()
                .code,
            -libc::EEXIST
        );
        assert_eq!(
            rpc_bdev_delay_create(&mut reg, make("Malloc0", "Delay1"))
                .unwrap_err()
                .code,
            -libc::EBUSY
        );
        assert_eq!(
            rpc_bdev_delay_create(&mut reg, make("nope", "Delay2"))
                .unwrap_err()
                .code,
            -libc::ENODEV
        );
        assert_eq!(reg.len(), 2);
        assert!(parse_params::<DelayCreateParams>(
            json!({"base_bdev_name": "Malloc0", "name": "x"})
        )
        .is_err());
        assert!(parse_params::<DelayCreateParams>(json!({
            "base_bdev_name": "Malloc0", "name": "x", "avg_read_latency": 1, "p99_read_latency": 2,
            "avg_write_latency": 3, "p99_write_latency": 4, "extra": true,
        }))
        .is_err());

        let p = parse_params::<DelayUpdateLatencyParams>(
            json!({"delay_bdev_name": "Delay0", "latency_type": "avg_writes", "latency_us": 1}),
        );
        assert!(p.is_err());
        let p = parse_params(
            json!({"delay_bdev_name": "Malloc0", "latency_type": "avg_write", "latency_us": 1}),
        )
        .unwrap();
        assert_eq!(
            rpc_bdev_delay_update_latency(&mut reg, p).unwrap_err().code,
            RpcError::INVALID_REQUEST
        );
        let p = parse_params(
            json!({"delay_bdev_name": "x", "latency_type": "avg_write", "latency_us": 1}),
        )
        .unwrap();
        assert_eq!(
            rpc_bdev_delay_update_latency(&mut reg, p).unwrap_err().code,
            RpcError::INVALID_PARAMS
        );

        // The base is claimed while Delay0 exists.
        let p = parse_params(json!({"name": "Malloc0"})).unwrap();
        assert_eq!(
            super::super::malloc::rpc_bdev_malloc_delete(&mut reg, p)
                .unwrap_err()
                .code,
            -libc::EBUSY
        );
        assert_eq!(reg.len(), 2);

        let entry = reg.get("Delay0").unwrap().config_entry();
        assert_eq!(entry["method"], "bdev_delay_create");
        parse_params::<DelayCreateParams>(entry["params"].clone()).unwrap();

        let p: DelayDeleteParams = parse_params(json!({"name": "Malloc0"})).unwrap();
        assert_eq!(
            rpc_bdev_delay_delete(&mut reg, p).unwrap_err().code,
            -libc::ENODEV
        );
        let p: DelayDeleteParams = parse_params(json!({"name": "Delay0"})).unwrap();
        assert_eq!(rpc_bdev_delay_delete(&mut reg, p).unwrap(), json!(true));
        assert_eq!(reg.claimed_by("Malloc0"), None);
        assert_eq!(reg.len(), 1);
    }
}

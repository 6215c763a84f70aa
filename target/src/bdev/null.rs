//! Null bdev ("Null disk"): writes are discarded, reads return zeroes. For benchmarking the
//! target without a device in the way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::json;

use super::util::{self, delete_typed, reject_metadata, CompletionQueue, CHANNEL_DEPTH};
use super::{
    check_range, Bdev, BdevChannel, BdevCompletion, BdevError, BdevIo, BdevRegistry, IoKind,
    Submitted,
};

pub struct NullBdev {
    name: String,
    uuid: [u8; 16],
    block_size: u32,
    /// Shared with every channel: `bdev_null_resize` changes it for all.
    num_blocks: Arc<AtomicU64>,
    physical_block_size: u32,
}

impl NullBdev {
    /// `uuid` None draws a random one. Block size: a non-zero multiple of 512, as in SPDK.
    pub fn new(
        name: impl Into<String>,
        num_blocks: u64,
        block_size: u32,
        uuid: Option<[u8; 16]>,
    ) -> Result<Self, BdevError> {
        if block_size == 0 || !block_size.is_multiple_of(512) {
            return Err(BdevError::InvalidParams(format!(
                "Data block size {block_size} is not a multiple of 512"
            )));
        }
        if num_blocks == 0 {
            return Err(BdevError::InvalidParams(
                "Disk num_blocks must be greater than 0".into(),
            ));
        }
        Ok(Self {
            name: name.into(),
            uuid: uuid.unwrap_or_else(util::random_uuid),
            block_size,
            num_blocks: Arc::new(AtomicU64::new(num_blocks)),
            physical_block_size: block_size,
        })
    }
}

impl Bdev for NullBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn product_name(&self) -> &'static str {
        "Null disk"
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Relaxed)
    }
    fn uuid(&self) -> [u8; 16] {
        self.uuid
    }
    fn supports(&self, _kind: IoKind) -> bool {
        true
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        Ok(Box::new(NullChannel {
            block_size: self.block_size,
            num_blocks: Arc::clone(&self.num_blocks),
            done: CompletionQueue::new(CHANNEL_DEPTH),
        }))
    }
    fn config_entry(&self) -> serde_json::Value {
        json!({
            "method": "bdev_null_create",
            "params": {
                "name": self.name,
                "num_blocks": self.num_blocks(),
                "block_size": self.block_size,
                "physical_block_size": self.physical_block_size,
                "uuid": util::format_uuid(&self.uuid),
            }
        })
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct NullChannel {
    block_size: u32,
    num_blocks: Arc<AtomicU64>,
    done: CompletionQueue,
}

impl NullChannel {
    fn execute(&self, io: &mut BdevIo) -> super::IoResult {
        check_range(self.num_blocks.load(Ordering::Relaxed), io, self.block_size)?;
        if io.kind == IoKind::Read {
            if let Some(buf) = io.buf.as_mut() {
                buf.zero_fill();
            }
        }
        Ok(())
    }
}

impl BdevChannel for NullChannel {
    fn submit(&mut self, mut io: BdevIo) -> Result<(), BdevIo> {
        if self.done.is_full() {
            return Err(io);
        }
        let result = self.execute(&mut io);
        self.done.complete(io, result);
        Ok(())
    }

    fn submit_now(&mut self, mut io: BdevIo) -> Submitted {
        let result = self.execute(&mut io);
        Submitted::Done(util::completion(io, result))
    }

    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        self.done.drain(done)
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }
}

/// `bdev_null_create`. Metadata / protection information must be left off.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NullCreateParams {
    pub name: String,
    pub num_blocks: u64,
    pub block_size: u32,
    #[serde(default)]
    pub physical_block_size: u32,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub md_size: u32,
    #[serde(default)]
    pub dif_type: i32,
    #[serde(default)]
    pub dif_is_head_of_md: bool,
    #[serde(default)]
    pub dif_pi_format: u32,
}

pub fn rpc_bdev_null_create(
    bdevs: &mut BdevRegistry,
    params: NullCreateParams,
) -> Result<serde_json::Value, RpcError> {
    reject_metadata(
        params.md_size,
        false,
        params.dif_type,
        params.dif_is_head_of_md,
        params.dif_pi_format,
    )?;
    let pbs = params.physical_block_size;
    if pbs != 0
        && (!pbs.is_power_of_two()
            || pbs < params.block_size
            || !pbs.is_multiple_of(params.block_size))
    {
        return Err(util::invalid(format!(
            "physical_block_size {pbs} must be a power of two multiple of block_size {}",
            params.block_size
        )));
    }
    let uuid = util::uuid_param(params.uuid.as_deref())?;
    if bdevs.contains(&params.name) {
        return Err(BdevError::Exists(params.name).into());
    }
    let mut bdev = NullBdev::new(
        params.name.clone(),
        params.num_blocks,
        params.block_size,
        Some(uuid),
    )?;
    if pbs != 0 {
        bdev.physical_block_size = pbs;
    }
    bdevs.register(Arc::new(bdev))?;
    Ok(serde_json::Value::String(params.name))
}

/// `bdev_null_delete`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NullDeleteParams {
    pub name: String,
}

pub fn rpc_bdev_null_delete(
    bdevs: &mut BdevRegistry,
    params: NullDeleteParams,
) -> Result<serde_json::Value, RpcError> {
    delete_typed::<NullBdev>(bdevs, &params.name)
}

/// `bdev_null_resize`: the new size in MiB.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NullResizeParams {
    pub name: String,
    pub new_size: u64,
}

/// Grows a null bdev, or shrinks one nothing uses (see [`util::resize`]). The caller tells
/// the hosts of its namespaces.
pub fn rpc_bdev_null_resize(
    bdevs: &mut BdevRegistry,
    params: NullResizeParams,
) -> Result<serde_json::Value, RpcError> {
    let bdev = bdevs
        .get(&params.name)
        .ok_or_else(|| BdevError::NotFound(params.name.clone()))?;
    let null = bdev
        .as_any()
        .downcast_ref::<NullBdev>()
        .ok_or_else(|| util::invalid(format!("{} is not a null bdev", params.name)))?;
    let bytes = params
        .new_size
        .checked_mul(1024 * 1024)
        .filter(|b| b % u64::from(null.block_size) == 0)
        .ok_or_else(|| {
            util::invalid(format!(
                "new size {} MiB is not a whole number of {}-byte blocks",
                params.new_size, null.block_size
            ))
        })?;
    let new = bytes / u64::from(null.block_size);
    util::resize(bdevs, &params.name, null.num_blocks(), new, |b| {
        null.num_blocks.store(b, Ordering::Relaxed)
    })?;
    Ok(serde_json::Value::Bool(true))
}

#[cfg(test)]
mod tests {
    use super::super::testutil;
    use super::super::util::parse_params;
    use super::*;

    #[test]
    fn reads_zeroes_discards_writes_and_checks_ranges() {
        let bdev = NullBdev::new("n", 64, 512, None).unwrap();
        let pool = testutil::pool(512, 4);
        let mut ch = bdev.open_channel().unwrap();
        let ch = ch.as_mut();
        testutil::write(ch, &pool, 512, 0, 4, 9);
        // `read` pre-fills the buffer with 0xEE, so zeroes prove the fill.
        testutil::expect_zeroes(ch, &pool, 512, 0, 4);
        for kind in [IoKind::Flush, IoKind::WriteZeroes, IoKind::Unmap] {
            let c = testutil::run(ch, testutil::io(5, kind, 0, 64, None));
            assert_eq!(c.result, Ok(()), "{kind:?}");
        }
        ch.submit(testutil::io(6, IoKind::Flush, 0, 1, None))
            .unwrap();
        assert_eq!(ch.in_flight(), 1, "completion must not be inline");
        testutil::wait(ch, 6);
        testutil::range_contract(&bdev, ch, &pool);
        assert!(testutil::resubmit_after_full(&bdev, CHANNEL_DEPTH + 10));
    }

    /// A resize reaches channels already open; a bdev in use grows but does not shrink.
    #[test]
    fn resize_grows_open_channels_and_shrinks_only_what_nothing_uses() {
        let mut reg = BdevRegistry::new();
        reg.register(Arc::new(NullBdev::new("Null0", 2048, 512, None).unwrap()))
            .unwrap();
        let bdev = Arc::clone(reg.get("Null0").unwrap());
        let mut ch = bdev.open_channel().unwrap();
        let beyond = |ch: &mut dyn BdevChannel| {
            testutil::run(ch, testutil::io(1, IoKind::WriteZeroes, 2048, 8, None)).result
        };
        assert_eq!(beyond(ch.as_mut()), Err(libc::EINVAL));
        let resize = |reg: &mut BdevRegistry, params: serde_json::Value| {
            rpc_bdev_null_resize(reg, parse_params(params).unwrap())
        };
        resize(&mut reg, json!({"name": "Null0", "new_size": 2})).unwrap();
        assert_eq!(bdev.num_blocks(), 4096);
        assert_eq!(beyond(ch.as_mut()), Ok(()));
        assert_eq!(bdev.config_entry()["params"]["num_blocks"], 4096);

        let (_, hold) = reg.claim("Null0", "nqn.a nsid 1").unwrap();
        let e = resize(&mut reg, json!({"name": "Null0", "new_size": 1})).unwrap_err();
        assert_eq!(e.code, -libc::EBUSY, "{e:?}");
        assert_eq!(bdev.num_blocks(), 4096);
        resize(&mut reg, json!({"name": "Null0", "new_size": 3})).unwrap();
        assert_eq!(bdev.num_blocks(), 6144);
        drop(hold);
        resize(&mut reg, json!({"name": "Null0", "new_size": 1})).unwrap();
        assert_eq!(bdev.num_blocks(), 2048);
        assert_eq!(beyond(ch.as_mut()), Err(libc::EINVAL));

        for (params, errno) in [
            (json!({"name": "Null0", "new_size": 0}), libc::EINVAL),
            (json!({"name": "Null0", "new_size": u64::MAX}), libc::EINVAL),
            (json!({"name": "Nope", "new_size": 1}), libc::ENODEV),
        ] {
            let e = resize(&mut reg, params.clone()).unwrap_err();
            assert_eq!(e.code, -errno, "{params}: {e:?}");
        }
        assert_eq!(bdev.num_blocks(), 2048);
    }

    #[test]
    fn rpc_create_delete_and_errors() {
        let mut reg = BdevRegistry::new();
        let good = json!({"name": "Null0", "num_blocks": 1024, "block_size": 4096});
        let p: NullCreateParams = parse_params(good).unwrap();
        assert_eq!(
            rpc_bdev_null_create(&mut reg, p.clone()).unwrap(),
            json!("Null0")
        );
        let n = reg.get("Null0").unwrap();
        assert_eq!(n.product_name(), "Null disk");
        assert_eq!(n.num_blocks(), 1024);
        let entry = n.config_entry();
        assert_eq!(entry["method"], "bdev_null_create");
        let again: NullCreateParams = parse_params(entry["params"].clone()).unwrap();
        assert_eq!(again.name, "Null0");
        assert_eq!(
            again.uuid.as_deref(),
            Some(util::format_uuid(&n.uuid()).as_str())
        );

        assert_eq!(
            rpc_bdev_null_create(&mut reg, p).unwrap_err().code,
            -libc::EEXIST
        );
        assert!(
            parse_params::<NullCreateParams>(json!({"num_blocks": 1, "block_size": 512})).is_err()
        );
        assert!(parse_params::<NullCreateParams>(
            json!({"name": "x", "num_blocks": 1, "block_size": 512, "md_interleave": true})
        )
        .is_err());
        let p: NullCreateParams =
            parse_params(json!({"name": "x", "num_blocks": 1, "block_size": 512, "md_size": 8}))
                .unwrap();
        assert_eq!(
            rpc_bdev_null_create(&mut reg, p).unwrap_err().code,
            -libc::EINVAL
        );
        assert_eq!(reg.len(), 1);

        let claimed = reg.claim("Null0", "EE_Null0").unwrap();
        let del = NullDeleteParams {
            name: "Null0".into(),
        };
        assert_eq!(
            rpc_bdev_null_delete(&mut reg, del.clone())
                .unwrap_err()
                .code,
            -libc::EBUSY
        );
        assert!(reg.contains("Null0"));
        drop(claimed);
        assert_eq!(
            rpc_bdev_null_delete(&mut reg, del.clone()).unwrap(),
            json!(true)
        );
        assert_eq!(
            rpc_bdev_null_delete(&mut reg, del).unwrap_err().code,
            -libc::ENODEV
        );
    }
}

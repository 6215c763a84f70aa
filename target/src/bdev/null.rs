//! Null bdev ("Null disk"): writes are discarded, reads return zeroes. For benchmarking the
//! target without a device in the way.

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
    num_blocks: u64,
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
            num_blocks,
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
        self.num_blocks
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
            num_blocks: self.num_blocks,
            done: CompletionQueue::new(CHANNEL_DEPTH),
        }))
    }
    fn config_entry(&self) -> serde_json::Value {
        json!({
            "method": "bdev_null_create",
            "params": {
                "name": self.name,
                "num_blocks": self.num_blocks,
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
    num_blocks: u64,
    done: CompletionQueue,
}

impl NullChannel {
    fn execute(&self, io: &mut BdevIo) -> super::IoResult {
        check_range(self.num_blocks, io, self.block_size)?;
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

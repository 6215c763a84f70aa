//! Split bdevs (SPDK's `vbdev_split`): one base bdev carved into equal, consecutive parts
//! named `<base>p0`, `<base>p1`, ..., each exported on its own (a large SSD shared by several
//! subsystems or tenants).
//!
//! A part's channel checks every I/O against the part's own size before it moves the I/O by
//! the part's offset, so no LBA, however large, reaches a neighbour's blocks: one tenant's
//! namespace can neither read nor overwrite another's. The parts claim the base together;
//! `bdev_split_delete` removes them all at once, and only when no namespace uses any of them
//! (SPDK hot-removes parts in use; here the delete is refused, as every delete of a bdev in
//! use is). A part's UUID derives from the base's and the part's place, as SPDK derives it,
//! so a saved config brings each namespace back with the same identity; and a split base
//! does not grow (its parts would move at the next start, `split_size_mb` being recomputed
//! from its size). Each part opens its own channel to the base on every reactor (an AIO
//! base: one context per part and reactor, counted against `aio-max-nr`).

use std::sync::Arc;

use nvmf_rpc::RpcError;
use serde::Deserialize;
use serde_json::json;

use super::util::{self, CompletionQueue, CHANNEL_DEPTH};
use super::{
    check_range, Bdev, BdevChannel, BdevCompletion, BdevError, BdevIo, BdevRef, BdevRegistry,
    IoKind, Submitted,
};

const MIB: u64 = 1024 * 1024;

/// What `bdev_split_create` was asked, kept for `save_config` (written once, by part 0).
#[derive(Debug)]
struct SplitRequest {
    split_count: u32,
    split_size_mb: u64,
}

pub struct SplitBdev {
    name: String,
    base: BdevRef,
    index: u64,
    offset_blocks: u64,
    num_blocks: u64,
    uuid: [u8; 16],
    request: Arc<SplitRequest>,
}

impl SplitBdev {
    pub fn base_name(&self) -> &str {
        self.base.name()
    }

    pub fn offset_blocks(&self) -> u64 {
        self.offset_blocks
    }
}

/// SPDK's namespace for the UUIDs of bdev parts (`lib/bdev/part.c`).
const PART_NAMESPACE: [u8; 16] = [
    0x97, 0x6b, 0x89, 0x9e, 0x3e, 0x1e, 0x4d, 0x71, 0xab, 0x69, 0xc2, 0xb0, 0x8e, 0x9d, 0xf8, 0xb8,
];

/// A part's UUID as SPDK derives it: version 5 (SHA-1) in SPDK's part namespace, of the
/// base's UUID, the part's offset and its size (both little-endian, as SPDK hashes its
/// struct on x86). The same split of the same base gives the same UUIDs, here and in SPDK,
/// and any other geometry gives others.
fn part_uuid(base: &[u8; 16], offset_blocks: u64, num_blocks: u64) -> [u8; 16] {
    use sha1::{Digest, Sha1};
    let digest = Sha1::new()
        .chain_update(PART_NAMESPACE)
        .chain_update(base)
        .chain_update(offset_blocks.to_le_bytes())
        .chain_update(num_blocks.to_le_bytes())
        .finalize();
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&digest[..16]);
    uuid[6] = (uuid[6] & 0x0f) | 0x50;
    uuid[8] = (uuid[8] & 0x3f) | 0x80;
    uuid
}

impl Bdev for SplitBdev {
    fn name(&self) -> &str {
        &self.name
    }
    fn product_name(&self) -> &'static str {
        "Split Disk"
    }
    fn block_size(&self) -> u32 {
        self.base.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.num_blocks
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
        Ok(Box::new(SplitChannel {
            base: self.base.open_channel()?,
            offset_blocks: self.offset_blocks,
            num_blocks: self.num_blocks,
            block_size: self.base.block_size(),
            refused: CompletionQueue::new(CHANNEL_DEPTH),
        }))
    }
    /// One entry for all the parts, as SPDK writes it: part 0 carries it.
    fn config_entry(&self) -> serde_json::Value {
        if self.index != 0 {
            return serde_json::Value::Null;
        }
        json!({
            "method": "bdev_split_create",
            "params": {
                "base_bdev": self.base.name(),
                "split_count": self.request.split_count,
                "split_size_mb": self.request.split_size_mb,
            }
        })
    }
    fn driver_specific(&self) -> serde_json::Value {
        json!({"split": {"base_bdev": self.base.name(), "offset_blocks": self.offset_blocks}})
    }
    fn base_bdevs(&self) -> Vec<String> {
        vec![self.base.name().to_string()]
    }
    /// An even split is recomputed from the base's size at the next start.
    fn keeps_base_size(&self) -> bool {
        true
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct SplitChannel {
    base: Box<dyn BdevChannel>,
    offset_blocks: u64,
    num_blocks: u64,
    block_size: u32,
    /// I/O outside the part, completed with EINVAL at the next poll.
    refused: CompletionQueue,
}

impl SplitChannel {
    /// Checks `io` against the part and moves it to the base's blocks; gives it back with
    /// the errno when it does not fit the part.
    fn translate(&self, mut io: BdevIo) -> Result<BdevIo, (BdevIo, i32)> {
        if let Err(errno) = check_range(self.num_blocks, &io, self.block_size) {
            return Err((io, errno));
        }
        // Within the part, so within the base: the part ends inside the base.
        io.offset_blocks += self.offset_blocks;
        Ok(io)
    }
}

impl BdevChannel for SplitChannel {
    fn submit(&mut self, io: BdevIo) -> Result<(), BdevIo> {
        match self.translate(io) {
            Ok(io) => self.base.submit(io).map_err(|mut io| {
                io.offset_blocks -= self.offset_blocks;
                io
            }),
            Err((io, _)) if self.refused.is_full() => Err(io),
            Err((io, errno)) => {
                self.refused.complete(io, Err(errno));
                Ok(())
            }
        }
    }

    fn submit_now(&mut self, io: BdevIo) -> Submitted {
        match self.translate(io) {
            Ok(io) => match self.base.submit_now(io) {
                Submitted::Refused(mut io) => {
                    io.offset_blocks -= self.offset_blocks;
                    Submitted::Refused(io)
                }
                other => other,
            },
            Err((io, errno)) => Submitted::Done(util::completion(io, Err(errno))),
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(BdevCompletion)) -> usize {
        self.refused.drain(done) + self.base.poll(done)
    }

    fn in_flight(&self) -> usize {
        self.refused.len() + self.base.in_flight()
    }
}

/// `bdev_split_create`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitCreateParams {
    pub base_bdev: String,
    pub split_count: u32,
    /// 0 or absent (older clients send `null`): the base divided evenly.
    #[serde(default)]
    pub split_size_mb: Option<u64>,
}

/// Answers the parts' names. As SPDK: without `split_size_mb` the base is divided evenly
/// (the remainder is left over); with it, each part has that size and a count that does not
/// fit is cut to what does. Unlike SPDK, a missing base is an error (`-ENODEV`) rather than a
/// split deferred until such a bdev appears, and a base with fewer blocks than parts is
/// refused.
pub fn rpc_bdev_split_create(
    bdevs: &mut BdevRegistry,
    params: SplitCreateParams,
) -> Result<serde_json::Value, RpcError> {
    if params.split_count == 0 {
        return Err(util::invalid("split_count can't be 0"));
    }
    let split_size_mb = params.split_size_mb.unwrap_or(0);
    let base = bdevs
        .get(&params.base_bdev)
        .cloned()
        .ok_or_else(|| BdevError::NotFound(params.base_bdev.clone()))?;
    if split_of(bdevs, base.name()).is_some() {
        return Err(BdevError::Exists(format!("split of {}", base.name())).into());
    }
    let block_size = u64::from(base.block_size());
    let part_blocks = if split_size_mb == 0 {
        base.num_blocks() / u64::from(params.split_count)
    } else {
        let bytes = split_size_mb
            .checked_mul(MIB)
            .filter(|b| b % block_size == 0)
            .ok_or_else(|| {
                util::invalid(format!(
                    "Split size {split_size_mb} MB is not possible with block size {block_size}"
                ))
            })?;
        bytes / block_size
    };
    let count = base
        .num_blocks()
        .checked_div(part_blocks)
        .map_or(0, |fits| fits.min(u64::from(params.split_count)));
    if count == 0 {
        return Err(util::invalid(format!(
            "{} has {} blocks: not enough for one part of the size asked",
            base.name(),
            base.num_blocks(),
        )));
    }
    if count < u64::from(params.split_count) {
        tracing::warn!(
            base = base.name(),
            requested = params.split_count,
            count,
            "split count is greater than the base holds: clamped"
        );
    }
    let request = Arc::new(SplitRequest {
        split_count: params.split_count,
        split_size_mb,
    });
    let parts: Vec<BdevRef> = (0..count)
        .map(|index| {
            Arc::new(SplitBdev {
                name: format!("{}p{index}", base.name()),
                base: Arc::clone(&base),
                index,
                offset_blocks: index * part_blocks,
                num_blocks: part_blocks,
                uuid: part_uuid(&base.uuid(), index * part_blocks, part_blocks),
                request: Arc::clone(&request),
            }) as BdevRef
        })
        .collect();
    let names: Vec<serde_json::Value> = parts.iter().map(|p| json!(p.name())).collect();
    bdevs.register_stack(parts)?;
    Ok(serde_json::Value::Array(names))
}

/// The parts split from `base`, in order; `None` if it is not split.
fn split_of(bdevs: &BdevRegistry, base: &str) -> Option<Vec<String>> {
    let parts: Vec<String> = bdevs
        .iter()
        .filter(|b| {
            b.as_any()
                .downcast_ref::<SplitBdev>()
                .is_some_and(|s| s.base_name() == base)
        })
        .map(|b| b.name().to_string())
        .collect();
    (!parts.is_empty()).then_some(parts)
}

/// `bdev_split_delete`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitDeleteParams {
    pub base_bdev: String,
}

/// Removes every part of the base, or none: a part a namespace uses keeps them all.
pub fn rpc_bdev_split_delete(
    bdevs: &mut BdevRegistry,
    params: SplitDeleteParams,
) -> Result<serde_json::Value, RpcError> {
    let parts = split_of(bdevs, &params.base_bdev).ok_or_else(|| {
        RpcError::errno(
            libc::ENOENT,
            format!("Split configuration for '{}' not found", params.base_bdev),
        )
    })?;
    for part in &parts {
        if let Some(user) = bdevs.claimed_by(part) {
            return Err(BdevError::Claimed {
                name: part.clone(),
                user: user.to_string(),
            }
            .into());
        }
    }
    for part in &parts {
        bdevs.unregister(part)?;
    }
    Ok(serde_json::Value::Bool(true))
}

#[cfg(test)]
mod tests {
    use super::super::malloc::MallocBdev;
    use super::super::testutil::{self, expect_pattern, expect_zeroes, io, pool, write};
    use super::super::util::parse_params;
    use super::*;

    use testutil::registry_with_malloc0 as registry;

    fn create(reg: &mut BdevRegistry, params: serde_json::Value) -> Result<Vec<String>, RpcError> {
        let v = rpc_bdev_split_create(reg, parse_params(params)?)?;
        Ok(serde_json::from_value(v).unwrap())
    }

    fn part(reg: &BdevRegistry, name: &str) -> (u64, u64) {
        let b = reg.get(name).unwrap();
        let s = b.as_any().downcast_ref::<SplitBdev>().unwrap();
        (s.offset_blocks(), b.num_blocks())
    }

    #[test]
    fn parts_keep_the_bdev_contract() {
        let mut reg = registry();
        create(&mut reg, json!({"base_bdev": "Malloc0", "split_count": 3})).unwrap();
        for name in ["Malloc0p0", "Malloc0p1", "Malloc0p2"] {
            let p = reg.get(name).unwrap();
            assert_eq!(p.product_name(), "Split Disk");
            testutil::data_contract(p.as_ref());
        }
    }

    /// Each part sees its own blocks only: a write through one lands at its offset in the
    /// base and nowhere else, and I/O past a part's end (the first blocks of its neighbour)
    /// completes with EINVAL and leaves the neighbour's data alone.
    #[test]
    fn a_part_never_reaches_its_neighbours_blocks() {
        let mut reg = registry();
        let names = create(&mut reg, json!({"base_bdev": "Malloc0", "split_count": 4})).unwrap();
        assert_eq!(names, ["Malloc0p0", "Malloc0p1", "Malloc0p2", "Malloc0p3"]);
        let pool = pool(512, 16);
        let base = Arc::clone(reg.get("Malloc0").unwrap());
        let mut base_ch = base.open_channel().unwrap();
        let mut ch: Vec<_> = names
            .iter()
            .map(|n| reg.get(n).unwrap().open_channel().unwrap())
            .collect();
        for (i, c) in ch.iter_mut().enumerate() {
            assert_eq!(part(&reg, &names[i]), (16 * i as u64, 16));
            write(c.as_mut(), &pool, 512, 0, 16, 10 + i as u64);
        }
        for (i, c) in ch.iter_mut().enumerate() {
            expect_pattern(c.as_mut(), &pool, 512, 0, 16, 10 + i as u64);
            expect_pattern(
                base_ch.as_mut(),
                &pool,
                512,
                16 * i as u64,
                16,
                10 + i as u64,
            );
        }
        // Past p1's end: a write, a zeroing, an unmap and a read of p2's first block.
        let p1 = ch[1].as_mut();
        for (tag, kind, len) in [
            (1, IoKind::Write, Some(512)),
            (2, IoKind::WriteZeroes, None),
            (3, IoKind::Unmap, None),
            (4, IoKind::Read, Some(512)),
        ] {
            let buf = len.map(|l| testutil::buf(&pool, l));
            let c = testutil::run(p1, io(tag, kind, 16, 1, buf));
            assert_eq!(c.result, Err(libc::EINVAL), "{kind:?} past the part's end");
            let c = testutil::run(p1, io(tag, kind, u64::MAX - 8, 9, None));
            assert_eq!(c.result, Err(libc::EINVAL), "{kind:?} wrapping around");
        }
        expect_pattern(ch[2].as_mut(), &pool, 512, 0, 16, 12);
        // Zeroing a part zeroes its own blocks only.
        let c = testutil::run(ch[1].as_mut(), io(5, IoKind::WriteZeroes, 0, 16, None));
        assert_eq!(c.result, Ok(()));
        expect_zeroes(base_ch.as_mut(), &pool, 512, 16, 16);
        expect_pattern(base_ch.as_mut(), &pool, 512, 0, 16, 10);
        expect_pattern(base_ch.as_mut(), &pool, 512, 32, 16, 12);
    }

    #[test]
    fn sizes_follow_spdks_rules() {
        // Evenly, the remainder left over.
        let mut reg = registry();
        create(&mut reg, json!({"base_bdev": "Malloc0", "split_count": 5})).unwrap();
        assert_eq!(part(&reg, "Malloc0p4"), (48, 12));
        assert!(!reg.contains("Malloc0p5"));

        // A size in MiB, the count cut to what fits: 4 MiB of 4 KiB blocks is 1024 blocks.
        let mut reg = BdevRegistry::new();
        reg.register(Arc::new(MallocBdev::new("M", 2600, 4096, None).unwrap()))
            .unwrap();
        let names = create(
            &mut reg,
            json!({"base_bdev": "M", "split_count": 8, "split_size_mb": 4}),
        )
        .unwrap();
        assert_eq!(names, ["Mp0", "Mp1"]);
        assert_eq!(part(&reg, "Mp1"), (1024, 1024));

        // Refused: no parts, more parts than blocks, a size whose bytes overflow, a part
        // larger than the base, a missing base, a second split of one base.
        let mut reg = BdevRegistry::new();
        reg.register(Arc::new(MallocBdev::new("M", 8, 4096, None).unwrap()))
            .unwrap();
        for (params, errno) in [
            (json!({"base_bdev": "M", "split_count": 0}), libc::EINVAL),
            (json!({"base_bdev": "M", "split_count": 9}), libc::EINVAL),
            (
                json!({"base_bdev": "M", "split_count": 1, "split_size_mb": u64::MAX}),
                libc::EINVAL,
            ),
            (
                json!({"base_bdev": "M", "split_count": 1, "split_size_mb": 1}),
                libc::EINVAL,
            ),
            (json!({"base_bdev": "Nope", "split_count": 2}), libc::ENODEV),
        ] {
            let e = create(&mut reg, params.clone()).unwrap_err();
            assert_eq!(e.code, -errno, "{params}: {e:?}");
            assert_eq!(reg.len(), 1, "{params} left a part behind");
        }
        let mut reg = BdevRegistry::new();
        reg.register(Arc::new(MallocBdev::new("M", 1024, 512, None).unwrap()))
            .unwrap();
        create(&mut reg, json!({"base_bdev": "M", "split_count": 2})).unwrap();
        let e = create(&mut reg, json!({"base_bdev": "M", "split_count": 2})).unwrap_err();
        assert_eq!(e.code, -libc::EEXIST, "{e:?}");
    }

    /// The parts claim the base together; the delete takes them all or none, and gives the
    /// base back.
    #[test]
    fn delete_takes_every_part_or_none() {
        let mut reg = registry();
        create(&mut reg, json!({"base_bdev": "Malloc0", "split_count": 2})).unwrap();
        assert!(reg.claimed_by("Malloc0").is_some());
        assert!(matches!(
            reg.claim("Malloc0", "nqn.a nsid 1"),
            Err(BdevError::Claimed { .. })
        ));
        assert!(reg.unregister("Malloc0").is_err());

        let (_, hold) = reg.claim("Malloc0p1", "nqn.a nsid 1").unwrap();
        let delete = |reg: &mut BdevRegistry, base: &str| {
            rpc_bdev_split_delete(reg, parse_params(json!({"base_bdev": base})).unwrap())
        };
        let e = delete(&mut reg, "Malloc0").unwrap_err();
        assert_eq!(e.code, -libc::EBUSY, "{e:?}");
        assert!(reg.contains("Malloc0p0") && reg.contains("Malloc0p1"));

        drop(hold);
        delete(&mut reg, "Malloc0").unwrap();
        assert!(!reg.contains("Malloc0p0") && !reg.contains("Malloc0p1"));
        assert_eq!(reg.claimed_by("Malloc0"), None);
        let e = delete(&mut reg, "Malloc0").unwrap_err();
        assert_eq!(e.code, -libc::ENOENT, "{e:?}");
        let (_, hold) = reg.claim("Malloc0", "nqn.a nsid 1").unwrap();
        drop(hold);
        reg.unregister("Malloc0").unwrap();
    }

    /// The UUIDs SPDK gives the same parts (known answers from an independent SHA-1: Python's
    /// hashlib over SPDK's namespace, the base UUID and the part's place), distinct for the
    /// parts of a split of a part.
    #[test]
    fn part_uuids_are_spdks() {
        let base = util::parse_uuid("5a5a5a5a-0000-4000-8000-00000000005a").unwrap();
        let mut reg = BdevRegistry::new();
        reg.register(Arc::new(
            MallocBdev::new("M", 4096, 512, Some(base)).unwrap(),
        ))
        .unwrap();
        create(&mut reg, json!({"base_bdev": "M", "split_count": 2})).unwrap();
        let uuid =
            |reg: &BdevRegistry, name: &str| util::format_uuid(&reg.get(name).unwrap().uuid());
        assert_eq!(uuid(&reg, "Mp0"), "03352f5f-e1dc-55fb-bafc-e8f8a3cbdc2b");
        assert_eq!(uuid(&reg, "Mp1"), "72cb0693-0791-5b9f-b1b9-3a93cbf53962");

        create(&mut reg, json!({"base_bdev": "Mp0", "split_count": 2})).unwrap();
        create(&mut reg, json!({"base_bdev": "Mp1", "split_count": 2})).unwrap();
        let all: std::collections::BTreeSet<String> =
            ["Mp0p0", "Mp0p1", "Mp1p0", "Mp1p1", "Mp0", "Mp1"]
                .iter()
                .map(|n| uuid(&reg, n))
                .collect();
        assert_eq!(all.len(), 6, "{all:?}");
    }

    /// A split base keeps its size: grown, its parts would move at the next start.
    #[test]
    fn a_split_base_does_not_grow() {
        let mut reg = BdevRegistry::new();
        reg.register(Arc::new(
            super::super::NullBdev::new("N", 2048, 512, None).unwrap(),
        ))
        .unwrap();
        create(&mut reg, json!({"base_bdev": "N", "split_count": 2})).unwrap();
        let e = super::super::null::rpc_bdev_null_resize(
            &mut reg,
            parse_params(json!({"name": "N", "new_size": 2})).unwrap(),
        )
        .unwrap_err();
        assert_eq!(e.code, -libc::EBUSY, "{e:?}");
        assert_eq!(reg.get("N").unwrap().num_blocks(), 2048);
        assert_eq!(part(&reg, "Np1"), (1024, 1024));

        // Nor does one under a bdev that is split.
        let mut reg = BdevRegistry::new();
        reg.register(Arc::new(
            super::super::NullBdev::new("N", 2048, 512, None).unwrap(),
        ))
        .unwrap();
        let delay = json!({"base_bdev_name": "N", "name": "D", "avg_read_latency": 0,
            "p99_read_latency": 0, "avg_write_latency": 0, "p99_write_latency": 0});
        super::super::delay::rpc_bdev_delay_create(&mut reg, parse_params(delay).unwrap()).unwrap();
        create(&mut reg, json!({"base_bdev": "D", "split_count": 2})).unwrap();
        let e = super::super::null::rpc_bdev_null_resize(
            &mut reg,
            parse_params(json!({"name": "N", "new_size": 2})).unwrap(),
        )
        .unwrap_err();
        assert_eq!(e.code, -libc::EBUSY, "{e:?}");
        assert_eq!(reg.get("D").unwrap().num_blocks(), 2048);
    }

    /// One config entry recreates every part, with the same UUIDs.
    #[test]
    fn one_saved_entry_brings_every_part_back_the_same() {
        let mut reg = registry();
        create(&mut reg, json!({"base_bdev": "Malloc0", "split_count": 3})).unwrap();
        let entries: Vec<_> = reg
            .iter()
            .map(|b| b.config_entry())
            .filter(|e| !e.is_null())
            .collect();
        let split: Vec<_> = entries
            .iter()
            .filter(|e| e["method"] == "bdev_split_create")
            .collect();
        assert_eq!(split.len(), 1, "{entries:?}");
        assert_eq!(
            split[0]["params"],
            json!({"base_bdev": "Malloc0", "split_count": 3, "split_size_mb": 0})
        );
        let uuids: Vec<_> = (0..3)
            .map(|i| reg.get(&format!("Malloc0p{i}")).unwrap().uuid())
            .collect();
        assert!(uuids[0] != uuids[1] && uuids[1] != uuids[2]);
        assert!(uuids
            .iter()
            .all(|u| *u != reg.get("Malloc0").unwrap().uuid()));

        let base = Arc::clone(reg.get("Malloc0").unwrap());
        let mut again = BdevRegistry::new();
        again.register(base).unwrap();
        rpc_bdev_split_create(
            &mut again,
            parse_params(split[0]["params"].clone()).unwrap(),
        )
        .unwrap();
        for (i, uuid) in uuids.iter().enumerate() {
            assert_eq!(again.get(&format!("Malloc0p{i}")).unwrap().uuid(), *uuid);
        }
    }
}

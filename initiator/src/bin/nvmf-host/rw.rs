//! `read` / `write`: a block range to or from a file, in chunks of up to 128 KiB kept in
//! flight `-q` at a time, over one path or a multipath namespace.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nvmf_common::buffer::BufferPool;
use nvmf_common::spec::Command;
use nvmf_initiator::{DataDir, IoCompletion};

use crate::args::{Cli, Rw};
use crate::disconnect;
use crate::paths::{connect_paths, HostQp};

pub(crate) fn cmd_rw(cli: &Cli, a: &Rw, write: bool) -> anyhow::Result<()> {
    if a.count == 0 {
        bail!("-c 0: nothing to transfer");
    }
    let mut paths = connect_paths(cli, a)?;
    let ctrl = &mut paths.ctrls[0];
    let ns = ctrl
        .namespace(a.nsid)?
        .with_context(|| format!("namespace {} is not active", a.nsid))?;
    let end = a.slba.checked_add(a.count).filter(|&e| e <= ns.blocks);
    if end.is_none() {
        bail!(
            "LBAs {}..{} are outside namespace {} ({} blocks)",
            a.slba,
            a.slba.saturating_add(a.count),
            a.nsid,
            ns.blocks
        );
    }
    let bs = u64::from(ns.block_size);
    let total = (a.count * bs) as usize;
    let chunk_blocks = (u64::from(ctrl.max_transfer()).min(128 * 1024) / bs).clamp(1, 0x1_0000);
    let chunk = (chunk_blocks * bs) as usize;
    let mut data = if write {
        let d = std::fs::read(&a.file).with_context(|| format!("reading {}", a.file))?;
        if d.len() < total {
            bail!(
                "{} has {} bytes, {} blocks of {bs} need {total}",
                a.file,
                d.len(),
                a.count
            );
        }
        d
    } else {
        vec![0u8; total]
    };
    let mut qp = paths.qpair(a)?;
    let depth = usize::from(a.depth.clamp(1, qp.depth()));
    let pool = BufferPool::new(chunk.next_multiple_of(4096), depth as u32)?;
    // Every path shares the first one's protection domain.
    paths.ctrls[0].register_pool(&pool)?;
    let chunks = total.div_ceil(chunk);
    let (mut next, mut done) = (0usize, 0usize);
    let mut out: Vec<IoCompletion> = Vec::with_capacity(depth);
    let deadline = Instant::now() + Duration::from_secs(60 + chunks as u64 / 10);
    let mut next_admin = Instant::now();
    while done < chunks {
        // Keep-alive (and failure detection) while the data moves: a long transfer must not
        // outlive the controller's KATO.
        if Instant::now() >= next_admin {
            paths.poll_admin()?;
            next_admin = Instant::now() + Duration::from_millis(50);
        }
        while next < chunks && qp.outstanding() < depth {
            let Some(mut buf) = pool.get() else { break };
            let off = next * chunk;
            let len = chunk.min(total - off);
            buf.set_len(len);
            let lba = a.slba + (off as u64) / bs;
            let nlb = (len as u64 / bs) as u32;
            let r = if write {
                buf.copy_from_slice(&data[off..off + len]);
                let cmd = Command::write(0, a.nsid, lba, nlb);
                qp.submit(cmd, buf, DataDir::ToController, next as u64)
            } else {
                let cmd = Command::read(0, a.nsid, lba, nlb);
                qp.submit(cmd, buf, DataDir::FromController, next as u64)
            };
            r.map_err(|e| {
                anyhow::anyhow!(
                    "submitting at LBA {lba}: {:?}{}",
                    e.kind,
                    qp.failure().map(|f| format!(": {f}")).unwrap_or_default()
                )
            })?;
            next += 1;
        }
        if qp.poll(&mut out) == 0 {
            std::thread::yield_now();
        }
        for c in out.drain(..) {
            let idx = c.tag as usize;
            let lba = a.slba + (idx * chunk) as u64 / bs;
            if !c.status.is_success() {
                bail!(
                    "{} at LBA {lba} failed: {}",
                    if write { "write" } else { "read" },
                    c.status
                );
            }
            if !write {
                let buf = c.buf.expect("reads carry their buffer");
                let off = idx * chunk;
                data[off..off + buf.len()].copy_from_slice(&buf);
            }
            done += 1;
        }
        if Instant::now() > deadline {
            bail!("transfer did not finish in time ({done}/{chunks} commands done)");
        }
    }
    if !write {
        std::fs::write(&a.file, &data).with_context(|| format!("writing {}", a.file))?;
    }
    if let HostQp::Multi(m) = &qp {
        let s = m.stats();
        for (i, c) in paths.ctrls.iter().enumerate() {
            eprintln!(
                "path {}: {} commands",
                c.peer(),
                s.path_ios.get(i).copied().unwrap_or(0)
            );
        }
        eprintln!("failovers {}, ANA statuses {}", s.failovers, s.ana_errors);
    }
    qp.disconnect();
    for c in paths.ctrls {
        disconnect(c);
    }
    eprintln!(
        "{}: {} blocks of {bs} bytes at LBA {} ({} bytes)",
        if write { "write" } else { "read" },
        a.count,
        a.slba,
        total
    );
    Ok(())
}

//! The Fabrics Connect of an I/O queue, on its first connection and on every reconnect.

use std::sync::atomic::Ordering;

use nvmf_common::rdma::{AccessFlags, DmaBuf, Verbs, VerbsMr};
use nvmf_common::spec::{ConnectCommand, ConnectData};
use zerocopy::IntoBytes;

use crate::controller::{connect_error, Shared};
use crate::error::{Error, Result};
use crate::transport::{Data, RdmaQueue};

/// Connects queue `qid` of the controller `shared` describes: RDMA CM, then the Fabrics
/// Connect with the controller's current CNTLID.
pub(super) fn connect_queue<V: Verbs>(
    shared: &Shared<V>,
    qid: u16,
    depth: u16,
) -> Result<RdmaQueue<V>> {
    let opts = &shared.opts;
    let (mut q, _) = RdmaQueue::connect(
        &shared.verbs,
        shared.peer,
        Some(&shared.pd),
        qid,
        depth,
        shared.windows,
        opts.connect_timeout,
    )?;
    let cntlid = shared.cntlid.load(Ordering::Acquire);
    let cd = ConnectData::new(shared.host.id, cntlid, &shared.tid.subnqn, &shared.host.nqn);
    let in_capsule = cd.as_bytes().len() <= shared.in_capsule.load(Ordering::Relaxed) as usize;
    let access = if in_capsule {
        AccessFlags::LOCAL_WRITE
    } else {
        AccessFlags::ALL_DATA
    };
    let mut buf = DmaBuf::<V>::new(&shared.pd, cd.as_bytes().len(), access)
        .map_err(|e| Error::rdma("registering the Connect data", e))?;
    buf.write_at(0, cd.as_bytes());
    let sge = buf.sge(0, buf.len()).expect("whole buffer");
    // As the Linux host: an I/O queue's Connect data travels in the capsule when the
    // controller takes that much (the admin queue has no in-capsule data).
    let data = if in_capsule {
        Data::InCapsule(sge)
    } else {
        Data::Keyed {
            addr: sge.addr,
            len: sge.length,
            rkey: buf.mr().rkey(),
        }
    };
    let mut cmd = ConnectCommand::new(0, qid, depth - 1, 0).to_command();
    let rsp = q.run_sync(&mut cmd, data, opts.connect_timeout, "Connect")?;
    if !rsp.status().is_success() {
        return Err(connect_error(
            shared.peer,
            qid,
            &shared.tid.subnqn,
            &shared.host.nqn,
            &rsp,
        ));
    }
    Ok(q)
}

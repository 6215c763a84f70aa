//! Safe RDMA verbs and RDMA CM layer over `rdma-sys` (libibverbs + librdmacm).
//!
//! # Model
//!
//! Objects form a tree, and every handle keeps its parents alive with an `Arc`:
//!
//! ```text
//! Context ── ProtectionDomain ── MemoryRegion (+ Arc of the memory's owner)
//!    │              ├──────────── MemoryWindow (+ the region it was last bound to)
//!    │              └──────────── SharedReceiveQueue
//!    └── CompletionQueue (+ its completion channel)
//! EventChannel ── CmId ── QueuePair (holds the CmId, PD, both CQs, the SRQ)
//! ```
//!
//! so the destruction order the verbs require (QP before its CQs, SRQ and PD;
//! `rdma_destroy_qp` before `rdma_destroy_id`; MRs before the PD and before their memory;
//! everything before the context) falls out of reference counting. Handles are `Send + Sync`
//! because libibverbs objects are thread-safe; RDMA CM calls are serialized per event
//! channel (see [`cm`]). Each wrapper has `as_raw()` for verbs not wrapped here.
//!
//! Connections use librdmacm's own device contexts: get the [`Context`] from
//! [`CmId::context`] (or all of them from [`Context::cm_devices`]) and build the PD, CQs and
//! SRQ on it.
//!
//! # Data path
//!
//! [`QueuePair::post_send`], [`QueuePair::post_recv`] and
//! [`SharedReceiveQueue::post_recv`] take slices of work requests and post them as chains
//! built on the stack; [`CompletionQueue::poll`] fills the caller's array of
//! [`WorkCompletion`]s. Neither allocates. The device reaches memory only through the keys
//! of live [`MemoryRegion`]s; which buffer is lent to which request is the business of the
//! memory's owner (the registered buffer pool), per the contract of
//! [`MemoryRegion::register_raw`].
//!
//! # Errors
//!
//! [`RdmaError`] has one variant per failing verb, carrying the OS error.

pub mod async_event;
pub mod cm;
pub mod cq;
pub mod device;
pub mod error;
pub mod mr;
pub mod mw;
pub mod pd;
pub mod qp;
#[cfg(feature = "sim")]
pub mod sim;
pub mod srq;
pub mod verbs;
pub mod wr;

/// The raw bindings, for `as_raw()` users.
pub use rdma_sys as sys;

pub use async_event::{AsyncEvent, AsyncEventKind};
pub use cm::{CmEvent, CmEventKind, CmId, CmIdToken, ConnEventParams, ConnParams, EventChannel};
pub use cq::{CompletionQueue, WcOpcode, WcStatus, WorkCompletion};
pub use device::{
    Context, Device, DeviceAttr, DeviceCapFlags, DeviceInfo, Gid, LinkLayer, Mtu, PortAttr,
    PortState, Transport,
};
pub use error::{RdmaError, Result};
pub use mr::{register_pool, AccessFlags, DeviceMemory, DmaBuf, MemoryRegion};
pub use mw::MemoryWindow;
pub use pd::ProtectionDomain;
pub use qp::{QpCaps, QueuePair};
pub use srq::SharedReceiveQueue;
pub use verbs::{
    RealVerbs, Verbs, VerbsChannel, VerbsCmId, VerbsContext, VerbsCq, VerbsMr, VerbsMw, VerbsPd,
    VerbsQp, VerbsSrq,
};
pub use wr::{MwBind, Payload, RecvWr, SendOp, SendWr, Sge, MAX_CHAIN};

// rdma-sys writes the structs with unions in Rust by hand (`types.rs`) instead of generating
// them from the headers; check them against the sizes gcc gives for this system's
// verbs.h and rdma_cma.h, since work requests, completions and CM events pass through them.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<sys::ibv_wc>() == 48);
    assert!(size_of::<sys::ibv_send_wr>() == 128);
    assert!(offset_of!(sys::ibv_send_wr, imm_data_invalidated_rkey_union) == 36);
    assert!(offset_of!(sys::ibv_send_wr, wr) == 40);
    assert!(offset_of!(sys::ibv_send_wr, qp_type) == 72);
    assert!(offset_of!(sys::ibv_send_wr, bind_mw_tso_union) == 80);
    assert!(size_of::<sys::ibv_recv_wr>() == 32);
    assert!(size_of::<sys::ibv_sge>() == 16);
    assert!(size_of::<sys::rdma_cm_event>() == 80);
    assert!(offset_of!(sys::rdma_cm_event, param) == 24);
    assert!(size_of::<sys::rdma_conn_param>() == 24);
    assert!(size_of::<sys::rdma_addr>() == 296);
    assert!(size_of::<sys::rdma_route>() == 312);
    assert!(size_of::<sys::rdma_cm_id>() == 416);
    assert!(offset_of!(sys::rdma_cm_id, route) == 32);
    assert!(offset_of!(sys::rdma_cm_id, ps) == 344);
    assert!(offset_of!(sys::rdma_cm_id, pd) == 400);
    assert!(size_of::<sys::ibv_gid>() == 16);
    assert!(size_of::<sys::ibv_port_attr>() == 52);
    assert!(size_of::<sys::ibv_device_attr>() == 232);
    // Flag values we spell out ourselves.
    assert!(mr::AccessFlags::LOCAL_WRITE.0 == sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    assert!(mr::AccessFlags::REMOTE_WRITE.0 == sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    assert!(mr::AccessFlags::REMOTE_READ.0 == sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    assert!(mr::AccessFlags::MW_BIND.0 == sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0);
    assert!(
        mr::AccessFlags::RELAXED_ORDERING.0 == sys::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0
    );
    assert!(
        device::DeviceCapFlags::MEM_MGT_EXTENSIONS.0
            == sys::ibv_device_cap_flags::IBV_DEVICE_MEM_MGT_EXTENSIONS.0
    );
    assert!(
        device::DeviceCapFlags::MEM_WINDOW_TYPE_2B.0
            == sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0
    );
    assert!(cq::WcStatus::WR_FLUSH_ERR.0 == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR);
    assert!(cq::WcStatus::GENERAL_ERR.0 == sys::ibv_wc_status::IBV_WC_GENERAL_ERR);
    assert!(cq::WcOpcode::RECV.0 == sys::ibv_wc_opcode::IBV_WC_RECV);
    assert!(cq::WcOpcode::BIND_MW.0 == sys::ibv_wc_opcode::IBV_WC_BIND_MW);
    assert!(cq::WcOpcode::LOCAL_INV.0 == sys::ibv_wc_opcode::IBV_WC_LOCAL_INV);
};

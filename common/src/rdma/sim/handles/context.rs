//! The device context: a host's simulated device, opened.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use crate::rdma::async_event::{AsyncEvent, AsyncEventKind};
use crate::rdma::device::DeviceAttr;
use crate::rdma::error::{RdmaError, Result};
use crate::rdma::sim::fabric::HostId;
use crate::rdma::sim::{SimAsyncEvent, SimAsyncEventKind, SimFabric};
use crate::rdma::verbs::VerbsContext;

/// `rxe`'s vendor id.
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

/// A host's device, opened. Every context of a host names the same device.
pub struct SimContext {
    pub(super) fabric: SimFabric,
    pub(super) host: HostId,
    /// The coming of the device this context was opened on (see `Host::incarnation`).
    pub(super) incarnation: u32,
}

impl SimContext {
    pub(crate) fn new(fabric: SimFabric, host: HostId) -> Arc<Self> {
        let incarnation = {
            let mut st = fabric.lock();
            st.hosts[host].open_contexts += 1;
            st.hosts[host].incarnation
        };
        Arc::new(Self {
            fabric,
            host,
            incarnation,
        })
    }

    /// Fails with `ENODEV` once the device this context was opened on is removed: nothing
    /// new is made on it.
    pub(crate) fn check_live(&self, err: fn(std::io::Error) -> RdmaError) -> Result<()> {
        if self.fabric.lock().device_live(self.host, self.incarnation) {
            Ok(())
        } else {
            Err(err(std::io::Error::from_raw_os_error(libc::ENODEV)))
        }
    }

    pub(crate) fn fabric(&self) -> &SimFabric {
        &self.fabric
    }

    pub(crate) fn host(&self) -> HostId {
        self.host
    }

    /// The next asynchronous event the device raised (CQ_ERR, QP_FATAL, QP_ACCESS_ERR,
    /// LAST_WQE_REACHED, or an injected one), oldest first.
    pub fn take_async_event(&self) -> Option<SimAsyncEvent> {
        self.fabric.lock().hosts[self.host].async_events.pop_front()
    }

    /// The IP address of the device's host.
    pub fn ip(&self) -> IpAddr {
        self.fabric.lock().hosts[self.host].ip
    }
}

impl Drop for SimContext {
    fn drop(&mut self) {
        self.fabric.lock().hosts[self.host].open_contexts -= 1;
    }
}

impl fmt::Debug for SimContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimContext")
            .field("host", &self.host)
            .finish()
    }
}

impl VerbsContext for SimContext {
    fn query_device(&self) -> Result<DeviceAttr> {
        Ok(self.fabric.lock().hosts[self.host].attr.clone())
    }

    fn device_name(&self) -> String {
        self.fabric.lock().hosts[self.host].name.clone()
    }

    fn is_soft_roce(&self) -> bool {
        let st = self.fabric.lock();
        let h = &st.hosts[self.host];
        h.name.starts_with("rxe") || h.attr.vendor_id == RXE_VENDOR_ID
    }

    /// The simulated fabric is InfiniBand's RC service (RoCE).
    fn transport(&self) -> crate::rdma::Transport {
        crate::rdma::Transport::InfiniBand
    }

    fn same_device(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.fabric.0, &other.fabric.0)
            && self.host == other.host
            && self.incarnation == other.incarnation
    }

    /// A device that came back is a new one: this handle's is gone for good.
    fn still_present(&self) -> Option<bool> {
        Some(self.fabric.lock().device_live(self.host, self.incarnation))
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        Ok(self.take_async_event().map(|e| AsyncEvent {
            kind: match e.kind {
                SimAsyncEventKind::CqErr => AsyncEventKind::CqErr,
                SimAsyncEventKind::QpFatal => AsyncEventKind::QpFatal,
                SimAsyncEventKind::QpAccessErr => AsyncEventKind::QpAccessErr,
                SimAsyncEventKind::QpLastWqeReached => AsyncEventKind::QpLastWqeReached,
                SimAsyncEventKind::CommEst => AsyncEventKind::CommEst,
                SimAsyncEventKind::PortErr => AsyncEventKind::PortErr,
                SimAsyncEventKind::DeviceFatal => AsyncEventKind::DeviceFatal,
            },
            qp_num: e.qp_num,
            cq_id: e.cq_id,
        }))
    }
}

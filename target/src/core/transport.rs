//! The transport interface, owned by the core: what the core needs of a transport and what a
//! transport gets from it. The core never names a transport type; it sees [`TransportLimits`]
//! (what Identify and CAP report) and the [`TransportPollGroup`] each reactor polls, and the
//! control plane sees a [`Transport`]. The transports (the top-level `transport` module)
//! implement these traits: the core owns the interface, as the kernel's nvmet keeps its
//! `nvmet_fabrics_ops` table in the core's header.
//!
//! A transport poll group owns its queue pairs and their requests, and drives each request
//! with the core's one state machine ([`driver`](crate::core::driver)): it implements
//! [`RequestTransport`](crate::core::driver::RequestTransport) (a data buffer, moving host data
//! in, sending the response) and hands each command capsule to `driver::start`, each finished
//! host transfer to `driver::data_arrived` and each of the core's wakeups (through `resume`)
//! to `driver::resume`. When the core prepares, executes and resumes a request is decided
//! there, once for every transport.

use std::any::Any;
use std::time::Duration;

use nvmf_common::reactor::{Ready, WaitSet};

use nvmf_common::rdma::RdmaError;

use crate::core::request::{ReqTag, Wakeup};
use crate::core::subsystem::ListenAddress;
use crate::core::{CoreCtx, PollGroupHandle};

/// What a transport can do, as the controller reports it to hosts. Values follow SPDK's
/// `nvmf_create_transport` parameters and defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportLimits {
    /// NVMe-oF transport type code (Discovery Log TRTYPE): RDMA 1, TCP 3, intra-host 254.
    pub trtype: u8,
    /// Largest I/O queue depth (CAP.MQES + 1).
    pub max_queue_depth: u16,
    /// Largest admin queue depth.
    pub max_aq_depth: u16,
    /// Admin queue included, as SPDK counts.
    pub max_qpairs_per_ctrl: u16,
    /// Bytes of data a command capsule may carry (IOCCSZ = 4 + this / 16).
    pub in_capsule_data_size: u32,
    /// Largest single transfer (MDTS).
    pub max_io_size: u32,
    /// Data SGL descriptors per command (MSDBD).
    pub msdbd: u8,
    /// Keep Alive Support (Identify KAS): the keep-alive granularity in 100 ms units.
    pub kas: u16,
    /// Smallest non-zero KATO a controller runs with, in milliseconds (a multiple of the KAS
    /// granularity).
    pub min_kato_ms: u32,
}

impl TransportLimits {
    pub const DEFAULT_RDMA: Self = Self {
        trtype: 1,
        max_queue_depth: 128,
        max_aq_depth: 128,
        max_qpairs_per_ctrl: 128,
        in_capsule_data_size: 4096,
        max_io_size: 131_072,
        msdbd: 1,
        kas: DEFAULT_KAS,
        min_kato_ms: DEFAULT_MIN_KATO_MS,
    };

    /// MDTS as Identify Controller encodes it: a power of two in units of the 4 KiB minimum
    /// memory page size.
    pub fn mdts(&self) -> u8 {
        let pages = (self.max_io_size / 4096).max(1);
        pages.ilog2() as u8
    }

    /// The largest transfer MDTS lets a host send: a power of two, never above max_io_size.
    pub fn max_transfer(&self) -> u32 {
        4096u32 << self.mdts()
    }

    /// The KATO a controller runs with when its host asks for `asked` ms in Connect or Set
    /// Features, by SPDK's rule (`lib/nvmf/ctrlr.c`): 0 (no keep-alive) stays 0, anything up
    /// to `min_kato_ms` gets `min_kato_ms`, anything above is rounded up to a multiple of the
    /// KAS granularity (the largest such multiple if that overflows).
    pub fn grant_kato(&self, asked: u32) -> u32 {
        let unit = u32::from(self.kas) * KAS_UNIT_MS;
        match asked {
            0 => 0,
            k if k <= self.min_kato_ms => self.min_kato_ms,
            k if unit == 0 => k,
            k => k
                .checked_next_multiple_of(unit)
                .unwrap_or(u32::MAX / unit * unit),
        }
    }
}

/// Identify KAS counts 100 ms units.
pub const KAS_UNIT_MS: u32 = 100;
/// SPDK's default `kas` (`NVMF_DEFAULT_KAS`, lib/nvmf/nvmf_internal.h): 10 s granularity.
pub const DEFAULT_KAS: u16 = 100;
/// SPDK's default `min_kato` (`NVMF_DEFAULT_MIN_KATO`): 10 s.
pub const DEFAULT_MIN_KATO_MS: u32 = 10_000;

/// Why a transport could not be created, could not listen, or could not serve a reactor. The
/// control plane turns it into the RPC error users see (`nvmf_create_transport`,
/// `nvmf_subsystem_add_listener`); each variant says what failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A creation parameter has a value the transport refuses: `name` is the parameter.
    #[error("{name}: {reason}")]
    InvalidOption { name: String, reason: String },
    /// Parameters the transport does not implement, by name: it runs with their defaults only.
    #[error("the {trtype} transport supports only the default value of: {}", .names.join(", "))]
    Unsupported {
        trtype: &'static str,
        names: Vec<&'static str>,
    },
    /// A transport type this target has no implementation of.
    #[error("transport {0} is not supported by this target yet")]
    UnsupportedType(String),
    /// A listen address the transport cannot use: its `field` ("traddr", "trsvcid") holds
    /// `value`, which is not `expected`.
    #[error("{field} {value:?} is not {expected}")]
    Address {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    /// An RDMA verb or RDMA CM call failed; `what` is the step that needed it.
    #[error("{what}: {source}")]
    Rdma {
        what: String,
        #[source]
        source: RdmaError,
    },
    /// The system refused something the transport needs (a thread, buffer memory).
    #[error("{what}: {source}")]
    Resources {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl TransportError {
    /// A refusal worded "parameter: why" (as `TransportOptions::validate` words them) as an
    /// [`InvalidOption`](Self::InvalidOption); a message naming no parameter is about the
    /// transport type.
    pub fn invalid_option(message: String) -> Self {
        let named = message
            .split_once(": ")
            .filter(|(name, _)| is_parameter_name(name));
        match named {
            Some((name, reason)) => Self::InvalidOption {
                name: name.to_string(),
                reason: reason.to_string(),
            },
            None => Self::InvalidOption {
                name: "trtype".to_string(),
                reason: message,
            },
        }
    }
}

fn is_parameter_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// One reactor's share of a transport.
pub trait TransportPollGroup {
    /// Receives capsules, advances requests, reaps work completions. Never blocks.
    fn poll(&mut self, core: &mut CoreCtx) -> usize;

    /// The core finished waiting for the request `tag` (issued by this group).
    fn resume(&mut self, tag: ReqTag, wakeup: Wakeup, core: &mut CoreCtx);

    /// The end of a reactor turn: after this group's poll, the bdevs' completions and the
    /// wakeups they made. Work queued anywhere in the turn goes out now, together (one
    /// doorbell per connection and turn where the transport batches).
    fn flush(&mut self) {}

    /// Connected (or connecting) queue pairs, for load balancing.
    fn qpair_count(&self) -> usize;

    /// Disconnects every queue pair now (target shutdown).
    fn shutdown(&mut self, core: &mut CoreCtx);

    /// Transport-specific messages (new qpairs from an acceptor, ...).
    fn as_any_mut(&mut self) -> &mut dyn Any;

    /// The reactor wants to sleep: arm every completion source (registering new descriptors
    /// in `wait`) and return how long the group can go without a poll (its next timer), or
    /// `None` if it has work only polling can see. The default: a group that cannot sleep.
    fn prepare_sleep(&mut self, core: &CoreCtx, wait: &WaitSet<'_>) -> Option<Duration> {
        let _ = (core, wait);
        None
    }

    /// After a sleep: take the events of the completion sources that signalled (`ready`),
    /// so they can be armed again.
    fn woken(&mut self, ready: Ready<'_>) {
        let _ = ready;
    }

    /// This group's transport-specific `nvmf_get_stats` fields, written next to its "trtype"
    /// (SPDK's optional `poll_group_dump_stat`): none unless the transport has some.
    fn dump_stats(&self) -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }
}

/// A transport as the control plane sees it: created by `nvmf_create_transport`, listening
/// on the addresses listeners name.
pub trait Transport: Send + Sync {
    /// SPDK's trtype spelling: "RDMA", "TCP", "LOOPBACK".
    fn trtype(&self) -> &'static str;
    fn limits(&self) -> TransportLimits;
    /// Starts accepting connections on `addr`. Idempotent per address.
    fn listen(&self, addr: &ListenAddress) -> Result<(), TransportError>;
    fn stop_listen(&self, addr: &ListenAddress);
    /// The `nvmf_create_transport` parameters that recreate it (for `save_config`) and that
    /// `nvmf_get_transports` reports.
    fn options(&self) -> serde_json::Value;
    /// This transport's share of one reactor. `index` goes into its request tags; `group`
    /// is how the transport's own threads (an acceptor) reach that reactor.
    fn create_poll_group(
        &self,
        index: u8,
        group: &PollGroupHandle,
    ) -> Result<Box<dyn TransportPollGroup>, TransportError>;
}

/// Stands in for a transport poll group that could not be created, so transport indices stay
/// aligned across reactors; it serves nothing.
pub struct IdleTransportGroup;

impl TransportPollGroup for IdleTransportGroup {
    fn poll(&mut self, _core: &mut CoreCtx) -> usize {
        0
    }

    fn resume(&mut self, tag: ReqTag, _wakeup: Wakeup, _core: &mut CoreCtx) {
        tracing::error!(
            ?tag,
            "wakeup for a request of a transport that never started"
        );
    }

    fn qpair_count(&self) -> usize {
        0
    }

    fn shutdown(&mut self, _core: &mut CoreCtx) {}

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn prepare_sleep(&mut self, _core: &CoreCtx, _wait: &WaitSet<'_>) -> Option<Duration> {
        Some(Duration::MAX)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_validation_message_names_its_parameter() {
        let e = TransportError::invalid_option("kas: cannot be 0".to_string());
        assert!(
            matches!(&e, TransportError::InvalidOption { name, reason }
                if name == "kas" && reason == "cannot be 0"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "kas: cannot be 0");
        // A message that names no parameter is about the transport type.
        let e = TransportError::invalid_option("Invalid transport type 'X: Y'".to_string());
        assert!(
            matches!(&e, TransportError::InvalidOption { name, .. } if name == "trtype"),
            "{e:?}"
        );
    }

    #[test]
    fn messages_read_as_before_the_errors_were_typed() {
        let e = TransportError::Address {
            field: "traddr",
            value: "host".into(),
            expected: "an IP address",
        };
        assert_eq!(e.to_string(), r#"traddr "host" is not an IP address"#);
        let e = TransportError::Unsupported {
            trtype: "RDMA",
            names: vec!["no_srq", "num_cqe"],
        };
        assert_eq!(
            e.to_string(),
            "the RDMA transport supports only the default value of: no_srq, num_cqe"
        );
        let os = std::io::Error::from_raw_os_error(libc::EADDRNOTAVAIL);
        let e = TransportError::Rdma {
            what: "rdma_bind_addr(10.0.0.1:4420)".into(),
            source: RdmaError::BindAddr(os),
        };
        assert!(
            e.to_string()
                .starts_with("rdma_bind_addr(10.0.0.1:4420): rdma_bind_addr failed: "),
            "{e}"
        );
        assert!(e.source().is_some_and(|s| s.is::<RdmaError>()));
        assert_eq!(
            TransportError::UnsupportedType("TCP".into()).to_string(),
            "transport TCP is not supported by this target yet"
        );
    }
}

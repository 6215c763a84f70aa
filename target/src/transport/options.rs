//! `nvmf_create_transport` parameters, with SPDK's names and SPDK's RDMA defaults
//! (`lib/nvmf/rdma.c`: `nvmf_rdma_opts_init`, `rdma_transport_opts_decoder`; `lib/nvmf/transport.c`:
//! `spdk_nvmf_transport_opts_init`).
//!
//! Three kinds of parameters:
//! - Those every transport here honours, turned into [`TransportLimits`] (queue depths, qpairs,
//!   in-capsule data, MDTS).
//! - Resource tuning a transport implementation owns (shared buffers, SRQ, CQ size, acceptor
//!   backlog and poll rate, work-request batching, abort timeout, I/O unit size). They are
//!   validated here and handed to the transport factory with the rest, which must honour them
//!   or refuse the transport.
//! - Settings of machinery this target does not have, accepted with any value and logged at
//!   debug: `iobuf_small_cache_size`/`iobuf_large_cache_size` (per-thread caches of SPDK's
//!   shared iobuf pool; transports here own their buffer pools, sized by `num_shared_buffers`
//!   and `buf_cache_size`) and the vfio-user transport's `disable_mappable_bar0`,
//!   `disable_adaptive_irq` and `disable_shadow_doorbells` (no vfio-user transport exists here;
//!   `rpc.py` sends all three on every call).
//! - Features this target does not have (DIF insert/strip, zero-copy bdev I/O, masked ONCS or
//!   fused commands) and parameters of another transport type (`sock_priority`
//!   on RDMA, say). Any value other than "off"/the default is refused with a message naming the
//!   parameter, never accepted and ignored. The defaults are accepted because `rpc.py` always
//!   sends `no_srq: false`, `c2h_success: true`, `zcopy`, `dif_insert_or_strip`,
//!   `no_wr_batching` and `disable_command_passthru` all false (releases 25.05 to 26.09, whatever
//!   the `-t`), and SPDK's saved configs carry every common field.
//!
//! `kas` and `min_kato` (SPDK 25.05+) are honoured as SPDK does: Identify KAS reports `kas`, and
//! a host's KATO is raised to `min_kato` or rounded up to the KAS granularity
//! ([`TransportLimits::grant_kato`]).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::transport::{TransportLimits, DEFAULT_KAS, DEFAULT_MIN_KATO_MS, KAS_UNIT_MS};

/// NVMe-oF: an admin queue holds at least 32 entries.
pub const MIN_ADMIN_QUEUE_DEPTH: u32 = 32;
/// SPDK: `max_io_size / io_unit_size` may not exceed the 16 data SGEs an RDMA request carries.
const MAX_IO_UNITS_PER_IO: u32 = 16;
/// SPDK refuses fewer shared buffers than two requests of 16 SGEs need to make progress.
const MIN_SHARED_BUFFERS: u32 = 32;

const RDMA_DEFAULT_SRQ_DEPTH: u32 = 4096;
const RDMA_DEFAULT_NUM_CQE: i32 = 4096;
const RDMA_DEFAULT_ACCEPTOR_BACKLOG: i32 = 100;
const TCP_DEFAULT_CONTROL_MSG_NUM: u32 = 32;

fn d_max_queue_depth() -> u16 {
    128
}
fn d_max_io_qpairs_per_ctrlr() -> u16 {
    127
}
/// Largest in-capsule data accepted (each receive slot holds this much).
pub const MAX_IN_CAPSULE_DATA_SIZE: u32 = 1 << 20;

fn d_in_capsule_data_size() -> u32 {
    4096
}
fn d_max_io_size() -> u32 {
    131_072
}
fn d_io_unit_size() -> u32 {
    8192
}
fn d_max_aq_depth() -> u32 {
    128
}
fn d_num_shared_buffers() -> u32 {
    4095
}
fn d_buf_cache_size() -> u32 {
    32
}
fn d_abort_timeout_sec() -> u32 {
    1
}
fn d_acceptor_poll_rate() -> u32 {
    10_000
}
fn d_max_srq_depth() -> u32 {
    RDMA_DEFAULT_SRQ_DEPTH
}
fn d_num_cqe() -> i32 {
    RDMA_DEFAULT_NUM_CQE
}
fn d_acceptor_backlog() -> i32 {
    RDMA_DEFAULT_ACCEPTOR_BACKLOG
}
fn d_true() -> bool {
    true
}
fn d_control_msg_num() -> u32 {
    TCP_DEFAULT_CONTROL_MSG_NUM
}
fn d_kas() -> u16 {
    DEFAULT_KAS
}
fn d_min_kato() -> u32 {
    DEFAULT_MIN_KATO_MS
}

/// The transports this target can be asked for, in SPDK's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    Rdma,
    Tcp,
    /// The in-process transport (tests, benchmarks); not an SPDK type.
    Loopback,
}

impl TransportKind {
    /// SPDK matches transport names case-insensitively.
    pub fn parse(trtype: &str) -> Option<Self> {
        match trtype.to_ascii_uppercase().as_str() {
            "RDMA" => Some(Self::Rdma),
            "TCP" => Some(Self::Tcp),
            "LOOPBACK" => Some(Self::Loopback),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Rdma => "RDMA",
            Self::Tcp => "TCP",
            Self::Loopback => "LOOPBACK",
        }
    }

    /// Discovery Log TRTYPE.
    pub fn code(self) -> u8 {
        match self {
            Self::Rdma => 1,
            Self::Tcp => 3,
            Self::Loopback => 254,
        }
    }
}

/// `nvmf_create_transport` params.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportOptions {
    pub trtype: String,
    /// Which NVMe-oF target (SPDK can host several); only the default one exists here.
    #[serde(default)]
    pub tgt_name: Option<String>,
    #[serde(default = "d_max_queue_depth")]
    pub max_queue_depth: u16,
    /// I/O queues only; the admin queue comes on top (SPDK deprecated `max_qpairs_per_ctrlr`
    /// for exactly that confusion).
    #[serde(default = "d_max_io_qpairs_per_ctrlr")]
    pub max_io_qpairs_per_ctrlr: u16,
    #[serde(default = "d_in_capsule_data_size")]
    pub in_capsule_data_size: u32,
    #[serde(default = "d_max_io_size")]
    pub max_io_size: u32,
    #[serde(default = "d_io_unit_size")]
    pub io_unit_size: u32,
    #[serde(default = "d_max_aq_depth")]
    pub max_aq_depth: u32,
    #[serde(default = "d_num_shared_buffers")]
    pub num_shared_buffers: u32,
    #[serde(default = "d_buf_cache_size")]
    pub buf_cache_size: u32,
    #[serde(default)]
    pub dif_insert_or_strip: bool,
    #[serde(default = "d_abort_timeout_sec")]
    pub abort_timeout_sec: u32,
    #[serde(default)]
    pub zcopy: bool,
    /// Microseconds between acceptor polls.
    #[serde(default = "d_acceptor_poll_rate")]
    pub acceptor_poll_rate: u32,
    /// RDMA: the verbs ACK timeout exponent (0: the device default).
    #[serde(default)]
    pub ack_timeout: u32,
    /// RDMA: data work requests pooled per transport (0: derived from the queue depth).
    #[serde(default)]
    pub data_wr_pool_size: u32,
    /// No command is ever passed through to a backing NVMe device here, so either value holds.
    #[serde(default)]
    pub disable_command_passthru: bool,
    /// Identify KAS: keep-alive granularity in 100 ms units.
    #[serde(default = "d_kas")]
    pub kas: u16,
    /// Smallest non-zero KATO granted, in ms; rounded up to the KAS granularity as SPDK does
    /// ([`min_kato_ms`](Self::min_kato_ms)).
    #[serde(default = "d_min_kato")]
    pub min_kato: u32,
    #[serde(default)]
    pub masked_oncs: Option<Vec<String>>,
    #[serde(default)]
    pub masked_fuses: Option<Vec<String>>,
    // RDMA-specific (SPDK's rdma_transport_opts).
    #[serde(default = "d_max_srq_depth")]
    pub max_srq_depth: u32,
    #[serde(default)]
    pub no_srq: bool,
    /// Completion queue entries per poll group; used only with `no_srq`.
    #[serde(default = "d_num_cqe")]
    pub num_cqe: i32,
    #[serde(default = "d_acceptor_backlog")]
    pub acceptor_backlog: i32,
    #[serde(default)]
    pub no_wr_batching: bool,
    // TCP-specific.
    #[serde(default = "d_true")]
    pub c2h_success: bool,
    #[serde(default)]
    pub sock_priority: u32,
    #[serde(default = "d_control_msg_num")]
    pub control_msg_num: u32,
    // Accepted with any value (module doc): SPDK's iobuf caches, then vfio-user.
    #[serde(default)]
    pub iobuf_small_cache_size: Option<u32>,
    #[serde(default)]
    pub iobuf_large_cache_size: Option<u32>,
    #[serde(default)]
    pub disable_mappable_bar0: Option<bool>,
    #[serde(default)]
    pub disable_adaptive_irq: Option<bool>,
    #[serde(default)]
    pub disable_shadow_doorbells: Option<bool>,
}

impl TransportOptions {
    /// SPDK's defaults for `trtype` (RDMA's, whatever the type: the other transports here take
    /// the same values).
    pub fn new(trtype: &str) -> Self {
        serde_json::from_value(json!({ "trtype": trtype })).expect("defaults deserialize")
    }

    pub fn kind(&self) -> Result<TransportKind, String> {
        TransportKind::parse(&self.trtype).ok_or_else(|| {
            format!(
                "Invalid transport type '{}' (RDMA, TCP or LOOPBACK)",
                self.trtype
            )
        })
    }

    /// The parameters given that configure nothing here (module doc), by name.
    pub fn ignored(&self) -> Vec<&'static str> {
        [
            (
                "iobuf_small_cache_size",
                self.iobuf_small_cache_size.is_some(),
            ),
            (
                "iobuf_large_cache_size",
                self.iobuf_large_cache_size.is_some(),
            ),
            (
                "disable_mappable_bar0",
                self.disable_mappable_bar0.is_some(),
            ),
            ("disable_adaptive_irq", self.disable_adaptive_irq.is_some()),
            (
                "disable_shadow_doorbells",
                self.disable_shadow_doorbells.is_some(),
            ),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }

    /// Checks every parameter; `Err` names the first one refused and why.
    pub fn validate(&self) -> Result<(), String> {
        let kind = self.kind()?;
        for name in self.ignored() {
            tracing::debug!(
                parameter = name,
                "nvmf_create_transport: {name} accepted and ignored (it configures nothing here)"
            );
        }
        let refuse = |field: &str, why: &str| Err(format!("{field}: {why}"));
        if self.dif_insert_or_strip {
            return refuse(
                "dif_insert_or_strip",
                "DIF insert/strip is not supported: this target carries no protection information",
            );
        }
        if self.zcopy {
            return refuse(
                "zcopy",
                "zero-copy bdev I/O is not supported by this target",
            );
        }
        if self.kas == 0 {
            return refuse(
                "kas",
                "cannot be 0 (Identify KAS 0 means no keep-alive support)",
            );
        }
        if self.min_kato == 0 {
            return refuse("min_kato", "cannot be 0");
        }
        if self
            .min_kato
            .checked_next_multiple_of(self.kas_ms())
            .is_none()
        {
            return refuse(
                "min_kato",
                &format!(
                    "{} rounded up to the keep-alive granularity ({} ms) exceeds 2^32 - 1",
                    self.min_kato,
                    self.kas_ms()
                ),
            );
        }
        if self.masked_oncs.as_ref().is_some_and(|v| !v.is_empty()) {
            return refuse(
                "masked_oncs",
                "masking optional NVM commands is not supported",
            );
        }
        if self.masked_fuses.as_ref().is_some_and(|v| !v.is_empty()) {
            return refuse("masked_fuses", "masking fused operations is not supported");
        }
        if self.max_queue_depth < 2 {
            return refuse(
                "max_queue_depth",
                "must be at least 2 (CAP.MQES is zero-based)",
            );
        }
        if self.max_io_qpairs_per_ctrlr == 0 || self.max_io_qpairs_per_ctrlr == u16::MAX {
            return refuse("max_io_qpairs_per_ctrlr", "must be between 1 and 65534");
        }
        if !(MIN_ADMIN_QUEUE_DEPTH..=4096).contains(&self.max_aq_depth) {
            return refuse(
                "max_aq_depth",
                &format!(
                    "{} must be between 32 (NVMe-oF minimum) and 4096",
                    self.max_aq_depth
                ),
            );
        }
        if self.in_capsule_data_size & 15 != 0 {
            return refuse(
                "in_capsule_data_size",
                &format!(
                    "{} must be a multiple of 16 (IOCCSZ counts 16-byte units)",
                    self.in_capsule_data_size
                ),
            );
        }
        // Every receive slot carries this much: a huge value must be an error here, not an
        // allocation that aborts the process (the kernel's nvmet-rdma stops at 16 KiB).
        if self.in_capsule_data_size > self.max_io_size.min(MAX_IN_CAPSULE_DATA_SIZE) {
            return refuse(
                "in_capsule_data_size",
                &format!(
                    "{} exceeds max_io_size {} or {MAX_IN_CAPSULE_DATA_SIZE}",
                    self.in_capsule_data_size, self.max_io_size
                ),
            );
        }
        if !self.max_io_size.is_power_of_two() || self.max_io_size < 8192 {
            return refuse(
                "max_io_size",
                &format!(
                    "{} must be a power of two of at least 8192 (as SPDK requires)",
                    self.max_io_size
                ),
            );
        }
        if self.io_unit_size == 0 {
            return refuse("io_unit_size", "cannot be 0");
        }
        if kind == TransportKind::Rdma
            && self.max_io_size.div_ceil(self.io_unit_size) > MAX_IO_UNITS_PER_IO
        {
            return refuse(
                "io_unit_size",
                &format!(
                    "{} splits max_io_size {} into more than {MAX_IO_UNITS_PER_IO} units",
                    self.io_unit_size, self.max_io_size
                ),
            );
        }
        if self.num_shared_buffers < MIN_SHARED_BUFFERS {
            return refuse(
                "num_shared_buffers",
                &format!(
                    "{} is below the {MIN_SHARED_BUFFERS} needed to guarantee progress",
                    self.num_shared_buffers
                ),
            );
        }
        if self.acceptor_backlog < 1 {
            return refuse("acceptor_backlog", "must be at least 1");
        }
        if self.no_srq && self.num_cqe < 1 {
            return refuse("num_cqe", "must be at least 1");
        }
        if kind != TransportKind::Rdma {
            let rdma_only = [
                (
                    "max_srq_depth",
                    self.max_srq_depth != RDMA_DEFAULT_SRQ_DEPTH,
                ),
                ("no_srq", self.no_srq),
                ("num_cqe", self.num_cqe != RDMA_DEFAULT_NUM_CQE),
                (
                    "acceptor_backlog",
                    self.acceptor_backlog != RDMA_DEFAULT_ACCEPTOR_BACKLOG,
                ),
                ("no_wr_batching", self.no_wr_batching),
                ("ack_timeout", self.ack_timeout != 0),
                ("data_wr_pool_size", self.data_wr_pool_size != 0),
            ];
            if let Some((field, _)) = rdma_only.iter().find(|(_, set)| *set) {
                return refuse(
                    field,
                    &format!("applies to the RDMA transport only, not {}", kind.name()),
                );
            }
        }
        if kind != TransportKind::Tcp {
            let tcp_only = [
                ("c2h_success", !self.c2h_success),
                ("sock_priority", self.sock_priority != 0),
                (
                    "control_msg_num",
                    self.control_msg_num != TCP_DEFAULT_CONTROL_MSG_NUM,
                ),
            ];
            if let Some((field, _)) = tcp_only.iter().find(|(_, set)| *set) {
                return refuse(
                    field,
                    &format!("applies to the TCP transport only, not {}", kind.name()),
                );
            }
        }
        Ok(())
    }

    /// The keep-alive granularity in ms.
    fn kas_ms(&self) -> u32 {
        u32::from(self.kas) * KAS_UNIT_MS
    }

    /// `min_kato` rounded up to a multiple of the keep-alive granularity, as SPDK's
    /// `nvmf_transport_create` stores (and dumps) it. Call after [`validate`](Self::validate).
    pub fn min_kato_ms(&self) -> u32 {
        self.min_kato
            .checked_next_multiple_of(self.kas_ms())
            .unwrap_or(self.min_kato)
    }

    /// What the controller reports to hosts. Call after [`validate`](Self::validate).
    pub fn limits(&self) -> TransportLimits {
        TransportLimits {
            trtype: self.kind().map(TransportKind::code).unwrap_or(0),
            max_queue_depth: self.max_queue_depth,
            max_aq_depth: self.max_aq_depth.min(u32::from(u16::MAX)) as u16,
            max_qpairs_per_ctrl: self.max_io_qpairs_per_ctrlr.saturating_add(1),
            in_capsule_data_size: self.in_capsule_data_size,
            max_io_size: self.max_io_size,
            msdbd: 1,
            kas: self.kas,
            min_kato_ms: self.min_kato_ms(),
        }
    }

    /// The parameters as SPDK's `nvmf_get_transports` and `save_config` write them
    /// (`nvmf_transport_dump_opts`, then the transport's own `dump_opts`): what a
    /// [`Transport::options`](crate::transport::Transport::options) implementation returns.
    pub fn to_value(&self) -> Value {
        let kind = self.kind().ok();
        let mut v = json!({
            "trtype": kind.map(TransportKind::name).unwrap_or(self.trtype.as_str()),
            "max_queue_depth": self.max_queue_depth,
            "max_io_qpairs_per_ctrlr": self.max_io_qpairs_per_ctrlr,
            "in_capsule_data_size": self.in_capsule_data_size,
            "max_io_size": self.max_io_size,
            "io_unit_size": self.io_unit_size,
            "max_aq_depth": self.max_aq_depth,
            "num_shared_buffers": self.num_shared_buffers,
            "buf_cache_size": self.buf_cache_size,
            "dif_insert_or_strip": self.dif_insert_or_strip,
            "zcopy": self.zcopy,
        });
        match kind {
            Some(TransportKind::Rdma) => {
                v["max_srq_depth"] = json!(self.max_srq_depth);
                v["no_srq"] = json!(self.no_srq);
                if self.no_srq {
                    v["num_cqe"] = json!(self.num_cqe);
                }
                v["acceptor_backlog"] = json!(self.acceptor_backlog);
                v["no_wr_batching"] = json!(self.no_wr_batching);
            }
            Some(TransportKind::Tcp) => {
                v["c2h_success"] = json!(self.c2h_success);
                v["sock_priority"] = json!(self.sock_priority);
                v["control_msg_num"] = json!(self.control_msg_num);
            }
            _ => {}
        }
        v["abort_timeout_sec"] = json!(self.abort_timeout_sec);
        v["ack_timeout"] = json!(self.ack_timeout);
        v["data_wr_pool_size"] = json!(self.data_wr_pool_size);
        v["kas"] = json!(self.kas);
        v["min_kato"] = json!(self.min_kato_ms());
        v
    }
}

impl Serialize for TransportOptions {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<TransportOptions, String> {
        serde_json::from_value::<TransportOptions>(v).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_spdk_rdma_defaults_and_limits_follow() {
        let o = TransportOptions::new("rdma");
        o.validate().unwrap();
        assert_eq!(o.max_queue_depth, 128);
        assert_eq!(o.max_io_qpairs_per_ctrlr, 127);
        assert_eq!(o.io_unit_size, 8192);
        assert_eq!(o.num_shared_buffers, 4095);
        assert_eq!(o.buf_cache_size, 32);
        assert_eq!(o.max_srq_depth, 4096);
        assert_eq!(o.acceptor_backlog, 100);
        assert_eq!(o.acceptor_poll_rate, 10_000);
        assert_eq!(o.abort_timeout_sec, 1);
        assert_eq!(o.limits(), TransportLimits::DEFAULT_RDMA);
        let tcp = TransportOptions::new("TCP");
        assert_eq!(tcp.limits().trtype, 3);
        assert_eq!(TransportOptions::new("loopback").limits().trtype, 254);
    }

    #[test]
    fn dump_round_trips_and_matches_spdk_field_names() {
        let mut o = TransportOptions::new("RDMA");
        o.max_queue_depth = 64;
        o.no_srq = true;
        o.num_cqe = 1024;
        let v = o.to_value();
        for field in [
            "trtype",
            "max_io_qpairs_per_ctrlr",
            "io_unit_size",
            "max_srq_depth",
            "no_srq",
            "num_cqe",
            "acceptor_backlog",
            "no_wr_batching",
            "abort_timeout_sec",
            "ack_timeout",
            "data_wr_pool_size",
            "zcopy",
            "dif_insert_or_strip",
            "kas",
            "min_kato",
        ] {
            assert!(v.get(field).is_some(), "{field} missing from {v}");
        }
        assert!(v.get("c2h_success").is_none());
        assert_eq!(parse(v).unwrap(), o);
    }

    #[test]
    fn keep_alive_settings_are_spdks_and_reach_the_limits() {
        // SPDK's defaults (NVMF_DEFAULT_KAS, NVMF_DEFAULT_MIN_KATO), as its saved configs carry.
        let d = TransportOptions::new("RDMA");
        assert_eq!((d.kas, d.min_kato), (100, 10_000));
        let saved = parse(json!({"trtype": "RDMA", "kas": 100, "min_kato": 10_000})).unwrap();
        saved.validate().unwrap();
        assert_eq!(saved, d);
        assert_eq!((d.limits().kas, d.limits().min_kato_ms), (100, 10_000));
        let v = d.to_value();
        assert_eq!(
            (v["kas"].clone(), v["min_kato"].clone()),
            (json!(100), json!(10_000))
        );

        // min_kato is rounded up to the KAS granularity (SPDK's nvmf_transport_create), and
        // the rounded value is what the limits hold and the dump shows.
        let o = parse(json!({"trtype": "RDMA", "kas": 20, "min_kato": 4500})).unwrap();
        o.validate().unwrap();
        let l = o.limits();
        assert_eq!((l.kas, l.min_kato_ms), (20, 6000));
        assert_eq!(o.to_value()["min_kato"], 6000);
        let reloaded = parse(o.to_value()).unwrap();
        assert_eq!(reloaded.limits(), l);

        // SPDK's KATO rule with those limits.
        assert_eq!(l.grant_kato(0), 0, "no keep-alive stays none");
        assert_eq!(l.grant_kato(1), 6000);
        assert_eq!(l.grant_kato(6000), 6000);
        assert_eq!(l.grant_kato(6001), 8000, "rounded up to 2 s");
        assert_eq!(l.grant_kato(u32::MAX), u32::MAX / 2000 * 2000);
    }

    #[test]
    fn rpc_py_defaults_are_accepted_for_rdma() {
        // rpc.py always adds no_srq=false and c2h_success=true.
        let o = parse(
            json!({"trtype": "RDMA", "no_srq": false, "c2h_success": true, "io_unit_size": 8192}),
        )
        .unwrap();
        o.validate().unwrap();
    }

    #[test]
    fn spdk_internal_and_vfio_user_settings_are_accepted_with_any_value() {
        let o = parse(json!({
            "trtype": "RDMA",
            "iobuf_small_cache_size": 0,
            "iobuf_large_cache_size": 4096,
            "disable_mappable_bar0": true,
            "disable_adaptive_irq": true,
            "disable_shadow_doorbells": false,
        }))
        .unwrap();
        o.validate().unwrap();
        assert_eq!(
            o.ignored(),
            [
                "iobuf_small_cache_size",
                "iobuf_large_cache_size",
                "disable_mappable_bar0",
                "disable_adaptive_irq",
                "disable_shadow_doorbells"
            ]
        );
        // They configure nothing, so they change neither the limits nor the dump.
        let d = TransportOptions::new("RDMA");
        assert_eq!(o.limits(), d.limits());
        assert_eq!(o.to_value(), d.to_value());
        assert!(d.ignored().is_empty());
    }

    #[test]
    fn unsupported_and_invalid_values_are_refused_by_name() {
        let cases = [
            (
                json!({"trtype": "RDMA", "dif_insert_or_strip": true}),
                "dif_insert_or_strip",
            ),
            (json!({"trtype": "RDMA", "zcopy": true}), "zcopy"),
            (json!({"trtype": "RDMA", "kas": 0}), "kas"),
            (json!({"trtype": "RDMA", "min_kato": 0}), "min_kato"),
            (json!({"trtype": "RDMA", "min_kato": u32::MAX}), "min_kato"),
            (
                json!({"trtype": "RDMA", "masked_oncs": ["nvmcmps"]}),
                "masked_oncs",
            ),
            (
                json!({"trtype": "RDMA", "in_capsule_data_size": 4100}),
                "in_capsule_data_size",
            ),
            (
                json!({"trtype": "RDMA", "max_io_size": 100_000}),
                "max_io_size",
            ),
            (
                json!({"trtype": "RDMA", "max_io_size": 4096}),
                "max_io_size",
            ),
            (
                json!({"trtype": "RDMA", "max_queue_depth": 1}),
                "max_queue_depth",
            ),
            (
                json!({"trtype": "RDMA", "max_aq_depth": 16}),
                "max_aq_depth",
            ),
            (json!({"trtype": "RDMA", "io_unit_size": 0}), "io_unit_size"),
            (
                json!({"trtype": "RDMA", "in_capsule_data_size": 0xFFFF_FFF0u32}),
                "in_capsule_data_size",
            ),
            (
                json!({"trtype": "RDMA", "in_capsule_data_size": 2 << 20, "max_io_size": 4 << 20}),
                "in_capsule_data_size",
            ),
            (
                json!({"trtype": "RDMA", "io_unit_size": 4096, "max_io_size": 131072}),
                "io_unit_size",
            ),
            (
                json!({"trtype": "RDMA", "num_shared_buffers": 8}),
                "num_shared_buffers",
            ),
            (
                json!({"trtype": "RDMA", "acceptor_backlog": 0}),
                "acceptor_backlog",
            ),
            (
                json!({"trtype": "RDMA", "sock_priority": 3}),
                "sock_priority",
            ),
            (
                json!({"trtype": "RDMA", "c2h_success": false}),
                "c2h_success",
            ),
            (json!({"trtype": "TCP", "no_srq": true}), "no_srq"),
            (json!({"trtype": "FC"}), "Invalid transport type"),
        ];
        for (params, field) in cases {
            let err = parse(params.clone()).unwrap().validate().unwrap_err();
            assert!(err.contains(field), "{params}: {err}");
        }
    }

    #[test]
    fn unknown_and_mistyped_fields_are_decode_errors() {
        assert!(parse(json!({"trtype": "RDMA", "max_queue_deep": 5}))
            .unwrap_err()
            .contains("max_queue_deep"));
        assert!(parse(json!({"trtype": "RDMA", "max_queue_depth": "big"})).is_err());
        assert!(parse(json!({"max_queue_depth": 5}))
            .unwrap_err()
            .contains("trtype"));
    }
}

//! Multipath: several controllers of one subsystem (one per address) reaching the same
//! namespace, with Asymmetric Namespace Access (ANA) deciding which of them serves I/O.
//!
//! This module is the pure part, with no queue or clock of its own (callers pass `now`):
//! the ANA log page (LID 0Ch), namespace identity (NGUID / EUI64 / UUID), and
//! [`MultipathCore`], the state machine that picks a path for each I/O and decides what
//! happens to an I/O that completed with a path-related status. [`crate::path`] wires it to
//! [`IoQpair`](crate::IoQpair)s and controllers.
//!
//! # Policy (as SPDK's bdev_nvme multipath and the Linux host)
//!
//! A path is usable when its association is live and its ANA state for the namespace is
//! Optimized or Non-Optimized; Inaccessible, Persistent Loss and Change are never chosen.
//! Active-passive (the default) takes the first Optimized path in the order given, else the
//! first Non-Optimized one, so I/O fails back to the preferred path as soon as it is live
//! and Optimized again. Active-active rotates over the Optimized paths (over the
//! Non-Optimized ones when none is Optimized).
//!
//! # What a completion means
//!
//! - Success, or an NVMe error that is not a path error, or any error with DNR set: the
//!   I/O is done (as Linux's `nvme_decide_disposition`: DNR wins over failover).
//! - ANA Inaccessible / Persistent Loss (SCT 3h, SC 02h / 01h): the path is marked with
//!   that state until its ANA log is read again (asked for through
//!   [`MultipathCore::take_ana_refresh`]), and the I/O is retried at once on another path.
//! - ANA Transition (SC 03h): the path is marked Change, and the I/O is retried after
//!   [`Timers::transition_retry`] on whichever path is usable then; it fails with that status
//!   once it has been seeing transitions for longer than ANATT.
//! - Other path errors (SC 00h, 60h, 70h) and a broken connection (a transport error, a
//!   timeout, a controller reset, [`IoStatus::PathError`]): the I/O is retried on another
//!   path; the path stays down until its controller reconnects.
//!
//! An I/O with no usable path waits; it fails with [`IoStatus::NoPath`] once no path has
//! been usable for [`Timers::fast_io_fail`] (SPDK's `fast_io_fail_timeout_sec`), or at once
//! when every path is lost for good (its controller exceeded `ctrl_loss_tmo`).
//!
//! # Data integrity
//!
//! A retried I/O is the same command (opcode, LBA, block count, flags) with the same
//! buffer: a write sends the same bytes, a read fills the same buffer. Retrying a write
//! whose first attempt may or may not have reached the media is safe because NVMe writes
//! are idempotent: writing the same data to the same LBAs twice leaves the media as one
//! write would, which is why the Linux host fails writes over too. Commands that are not
//! idempotent (Compare and Write fused pairs, reservations) are not sent through this layer.
//! A write retried after a path failure may be ordered after a later write to the same LBAs
//! that went down the other path; as with any multi-queue host, callers that need ordering
//! wait for a write's completion before issuing an overlapping one.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use nvmf_common::spec::{Status, StatusCodeType};

use crate::qpair::IoStatus;

/// ANA state of a namespace through one controller (NVMe 2.0 base, Figure 227, byte 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnaState {
    Optimized,
    NonOptimized,
    Inaccessible,
    PersistentLoss,
    /// ANA state change in progress (0Fh).
    Change,
    /// A reserved value from the wire: treated as not usable.
    Reserved(u8),
}

impl AnaState {
    pub fn from_raw(v: u8) -> Self {
        match v & 0x0F {
            0x01 => Self::Optimized,
            0x02 => Self::NonOptimized,
            0x03 => Self::Inaccessible,
            0x04 => Self::PersistentLoss,
            0x0F => Self::Change,
            v => Self::Reserved(v),
        }
    }

    pub fn to_raw(self) -> u8 {
        match self {
            Self::Optimized => 0x01,
            Self::NonOptimized => 0x02,
            Self::Inaccessible => 0x03,
            Self::PersistentLoss => 0x04,
            Self::Change => 0x0F,
            Self::Reserved(v) => v,
        }
    }

    /// Whether I/O may be sent through a path in this state.
    pub fn is_usable(self) -> bool {
        matches!(self, Self::Optimized | Self::NonOptimized)
    }
}

impl fmt::Display for AnaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Optimized => f.write_str("optimized"),
            Self::NonOptimized => f.write_str("non-optimized"),
            Self::Inaccessible => f.write_str("inaccessible"),
            Self::PersistentLoss => f.write_str("persistent-loss"),
            Self::Change => f.write_str("change"),
            Self::Reserved(v) => write!(f, "reserved ({v:#x})"),
        }
    }
}

/// One ANA Group Descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnaGroup {
    pub grpid: u32,
    pub change_count: u64,
    pub state: AnaState,
    /// The group's namespaces (empty when the log was read with Return Groups Only).
    pub nsids: Vec<u32>,
}

/// The Asymmetric Namespace Access log page (LID 0Ch).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnaLog {
    pub change_count: u64,
    pub groups: Vec<AnaGroup>,
}

/// Bytes of the ANA log header and of a group descriptor without its NSID list.
pub const ANA_LOG_HEADER_LEN: usize = 16;
pub const ANA_GROUP_DESC_LEN: usize = 32;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnaLogError {
    #[error("ANA log page truncated: {need} bytes needed at offset {at}, {len} read")]
    Truncated { at: usize, need: usize, len: usize },
}

impl AnaLog {
    /// Parses the page; `raw` may be longer than the page (zero padding).
    pub fn parse(raw: &[u8]) -> Result<Self, AnaLogError> {
        let need = |at: usize, n: usize| -> Result<&[u8], AnaLogError> {
            raw.get(at..at + n).ok_or(AnaLogError::Truncated {
                at,
                need: n,
                len: raw.len(),
            })
        };
        let h = need(0, ANA_LOG_HEADER_LEN)?;
        let change_count = u64::from_le_bytes(h[0..8].try_into().expect("8 bytes"));
        let ngroups = u16::from_le_bytes([h[8], h[9]]);
        let mut at = ANA_LOG_HEADER_LEN;
        let mut groups = Vec::with_capacity(usize::from(ngroups));
        for _ in 0..ngroups {
            let d = need(at, ANA_GROUP_DESC_LEN)?;
            let grpid = u32::from_le_bytes(d[0..4].try_into().expect("4 bytes"));
            let nnsid = u32::from_le_bytes(d[4..8].try_into().expect("4 bytes")) as usize;
            let change_count = u64::from_le_bytes(d[8..16].try_into().expect("8 bytes"));
            let state = AnaState::from_raw(d[16]);
            at += ANA_GROUP_DESC_LEN;
            let list = need(at, nnsid.saturating_mul(4))?;
            let nsids = list
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            at += nnsid * 4;
            groups.push(AnaGroup {
                grpid,
                change_count,
                state,
                nsids,
            });
        }
        Ok(Self {
            change_count,
            groups,
        })
    }

    /// The state of namespace `nsid`: from the group listing it, else from group
    /// `anagrpid` (the namespace's ANAGRPID from Identify Namespace).
    pub fn state_of(&self, nsid: u32, anagrpid: u32) -> Option<AnaState> {
        self.groups
            .iter()
            .find(|g| g.nsids.contains(&nsid))
            .or_else(|| {
                self.groups
                    .iter()
                    .find(|g| anagrpid != 0 && g.grpid == anagrpid)
            })
            .map(|g| g.state)
    }

    /// Builds the wire form (for tests and tools).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.change_count.to_le_bytes());
        out.extend_from_slice(&(self.groups.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0; 6]);
        for g in &self.groups {
            out.extend_from_slice(&g.grpid.to_le_bytes());
            out.extend_from_slice(&(g.nsids.len() as u32).to_le_bytes());
            out.extend_from_slice(&g.change_count.to_le_bytes());
            out.push(g.state.to_raw());
            out.extend_from_slice(&[0; 15]);
            for n in &g.nsids {
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        out
    }
}

/// What names a namespace across controllers: NGUID, EUI64 and UUID (from Identify
/// Namespace and the Namespace Identification Descriptor list). All-zero means absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamespaceIds {
    pub eui64: Option<[u8; 8]>,
    pub nguid: Option<[u8; 16]>,
    pub uuid: Option<[u8; 16]>,
}

/// Namespace Identifier Types (NVMe 2.0 base, Figure 279).
const NIDT_EUI64: u8 = 1;
const NIDT_NGUID: u8 = 2;
const NIDT_UUID: u8 = 3;

fn nonzero<const N: usize>(v: [u8; N]) -> Option<[u8; N]> {
    (v != [0; N]).then_some(v)
}

impl NamespaceIds {
    /// From Identify Namespace's fields.
    pub fn from_identify(nguid: [u8; 16], eui64: [u8; 8]) -> Self {
        Self {
            eui64: nonzero(eui64),
            nguid: nonzero(nguid),
            uuid: None,
        }
    }

    /// Adds what a Namespace Identification Descriptor list (Identify CNS 03h) carries; an
    /// identifier there takes precedence over Identify Namespace's.
    pub fn merge_descriptors(&mut self, raw: &[u8]) {
        let mut at = 0;
        while at + 4 <= raw.len() {
            let (nidt, nidl) = (raw[at], usize::from(raw[at + 1]));
            if nidt == 0 || nidl == 0 {
                break;
            }
            let Some(v) = raw.get(at + 4..at + 4 + nidl) else {
                break;
            };
            match (nidt, nidl) {
                (NIDT_EUI64, 8) => {
                    self.eui64 = nonzero(v.try_into().expect("8 bytes")).or(self.eui64)
                }
                (NIDT_NGUID, 16) => {
                    self.nguid = nonzero(v.try_into().expect("16 bytes")).or(self.nguid)
                }
                (NIDT_UUID, 16) => {
                    self.uuid = nonzero(v.try_into().expect("16 bytes")).or(self.uuid)
                }
                _ => {}
            }
            at += 4 + nidl;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.eui64.is_none() && self.nguid.is_none() && self.uuid.is_none()
    }
}

impl fmt::Display for NamespaceIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let mut parts = Vec::new();
        if let Some(v) = self.nguid {
            parts.push(format!("nguid {}", hex(&v)));
        }
        if let Some(v) = self.eui64 {
            parts.push(format!("eui64 {}", hex(&v)));
        }
        if let Some(v) = self.uuid {
            parts.push(format!("uuid {}", hex(&v)));
        }
        if parts.is_empty() {
            f.write_str("no identifier")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// Whether two paths reach the same namespace: at least one identifier both report, and
/// every identifier both report equal (as SPDK compares NGUID, EUI64 and UUID before adding
/// a path to a bdev). A namespace with no identifier cannot be proven the same and is
/// refused.
pub fn same_namespace(a: &NamespaceIds, b: &NamespaceIds) -> Result<(), String> {
    let mut shared = 0;
    let mut check = |name: &str, x: Option<&[u8]>, y: Option<&[u8]>| -> Result<(), String> {
        if let (Some(x), Some(y)) = (x, y) {
            shared += 1;
            if x != y {
                return Err(format!("different {name}s ({a} vs {b})"));
            }
        }
        Ok(())
    };
    check(
        "NGUID",
        a.nguid.as_ref().map(|v| &v[..]),
        b.nguid.as_ref().map(|v| &v[..]),
    )?;
    check(
        "EUI64",
        a.eui64.as_ref().map(|v| &v[..]),
        b.eui64.as_ref().map(|v| &v[..]),
    )?;
    check(
        "UUID",
        a.uuid.as_ref().map(|v| &v[..]),
        b.uuid.as_ref().map(|v| &v[..]),
    )?;
    if shared == 0 {
        return Err(format!(
            "no NGUID, EUI64 or UUID reported by both paths ({a} vs {b}): cannot tell \
             whether they are one namespace"
        ));
    }
    Ok(())
}

/// How I/O is spread over usable paths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// The first Optimized path (in the order given), else the first Non-Optimized one.
    #[default]
    ActivePassive,
    /// Round robin over the Optimized paths (else over the Non-Optimized ones).
    ActiveActive,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "active_passive" | "active-passive" | "failover" => Ok(Self::ActivePassive),
            "active_active" | "active-active" | "round_robin" | "round-robin" => {
                Ok(Self::ActiveActive)
            }
            _ => Err(format!("{s:?}: expected active_passive or active_active")),
        }
    }
}

/// A path's connection as the I/O side sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Up,
    /// Broken; its controller is reconnecting.
    Down,
    /// Its controller gave up (ctrl_loss_tmo) or was deleted.
    Lost,
}

/// What selection needs to know of one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathView {
    pub link: Link,
    pub ana: AnaState,
}

impl PathView {
    pub const UP_OPTIMIZED: Self = Self {
        link: Link::Up,
        ana: AnaState::Optimized,
    };

    pub fn is_usable(&self) -> bool {
        self.link == Link::Up && self.ana.is_usable()
    }
}

/// Retry clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    /// Fail I/O once no path has been usable this long; `None` waits until every path is
    /// lost for good (SPDK's `fast_io_fail_timeout_sec` 0).
    pub fast_io_fail: Option<Duration>,
    /// Wait before retrying an I/O that got ANA Transition.
    pub transition_retry: Duration,
    /// ANA Transition Time (Identify Controller ANATT): an I/O that keeps getting ANA
    /// Transition for longer fails with that status.
    pub anatt: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            fast_io_fail: None,
            transition_retry: Duration::from_millis(100),
            anatt: Duration::from_secs(10),
        }
    }
}

/// What became of a completion, for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Hand the completion to the application (success or a final error).
    Done,
    /// Kept for a retry: it comes back from [`MultipathCore::ready`].
    Retry,
    /// Hand it to the application with this status instead.
    Fail(IoStatus),
}

/// Where a new or waiting I/O goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Path(usize),
    /// Kept until a path is usable (it comes back from [`MultipathCore::ready`]).
    Queued,
    Fail(IoStatus),
}

/// An I/O that left its waiting list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ready {
    Submit { id: usize, path: usize },
    Fail { id: usize, status: IoStatus },
}

/// Counters of a multipath namespace on one queue set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MultipathStats {
    /// I/Os completed successfully through each path.
    pub path_ios: Vec<u64>,
    /// I/Os sent again (to another path, or after a transition delay) after a path error,
    /// an ANA status or a broken connection.
    pub failovers: u64,
    /// Completions with an ANA status (SCT 3h, SC 01h-03h).
    pub ana_errors: u64,
    /// I/Os failed because no path was usable within the fast-io-fail timeout (or all were
    /// lost).
    pub no_path_failures: u64,
}

impl MultipathStats {
    pub fn merge(&mut self, o: &Self) {
        if self.path_ios.len() < o.path_ios.len() {
            self.path_ios.resize(o.path_ios.len(), 0);
        }
        for (a, b) in self.path_ios.iter_mut().zip(&o.path_ios) {
            *a += b;
        }
        self.failovers += o.failovers;
        self.ana_errors += o.ana_errors;
        self.no_path_failures += o.no_path_failures;
    }
}

struct Waiter {
    id: usize,
    not_before: Instant,
}

/// How a completion status relates to paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Final,
    Ana(AnaState),
    PathDown,
}

fn classify(status: IoStatus) -> Class {
    match status {
        IoStatus::Nvme(s) => classify_nvme(s),
        IoStatus::Timeout
        | IoStatus::TransportError
        | IoStatus::ControllerLost
        | IoStatus::PathError => Class::PathDown,
        IoStatus::NoPath => Class::Final,
    }
}

fn classify_nvme(s: Status) -> Class {
    if s.is_success() || s.dnr || s.sct != StatusCodeType::PATH {
        return Class::Final;
    }
    if s.same_code(Status::ANA_PERSISTENT_LOSS) {
        Class::Ana(AnaState::PersistentLoss)
    } else if s.same_code(Status::ANA_INACCESSIBLE) {
        Class::Ana(AnaState::Inaccessible)
    } else if s.same_code(Status::ANA_TRANSITION) {
        Class::Ana(AnaState::Change)
    } else {
        // Internal path error, controller / host pathing errors: another path may work.
        Class::PathDown
    }
}

/// The multipath state machine of one namespace on one polling thread: path views,
/// selection, and the I/Os waiting for a path or a delay. I/Os are named by an `id` below
/// the capacity given to [`new`](Self::new).
pub struct MultipathCore {
    policy: Policy,
    timers: Timers,
    paths: Vec<PathView>,
    ana_refresh: Vec<bool>,
    rr: usize,
    no_path_since: Option<Instant>,
    waiting: VecDeque<Waiter>,
    /// Per I/O: when it first got ANA Transition (for the ANATT bound).
    transition_since: Vec<Option<Instant>>,
    stats: MultipathStats,
}

impl MultipathCore {
    /// `paths` views in preference order; I/O ids are `0..capacity`.
    pub fn new(policy: Policy, timers: Timers, paths: Vec<PathView>, capacity: usize) -> Self {
        let n = paths.len();
        Self {
            policy,
            timers,
            paths,
            ana_refresh: vec![false; n],
            rr: 0,
            no_path_since: None,
            waiting: VecDeque::with_capacity(capacity),
            transition_since: vec![None; capacity],
            stats: MultipathStats {
                path_ios: vec![0; n],
                ..MultipathStats::default()
            },
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn paths(&self) -> &[PathView] {
        &self.paths
    }

    pub fn set_link(&mut self, path: usize, link: Link) {
        self.paths[path].link = link;
    }

    /// The path's ANA state as last read from its controller.
    pub fn set_ana(&mut self, path: usize, ana: AnaState) {
        self.paths[path].ana = ana;
    }

    /// Whether the path's ANA log should be read again (an ANA status came back through
    /// it); clears the request.
    pub fn take_ana_refresh(&mut self, path: usize) -> bool {
        std::mem::take(&mut self.ana_refresh[path])
    }

    pub fn stats(&self) -> &MultipathStats {
        &self.stats
    }

    /// I/Os waiting for a path or a retry delay.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The path for the next I/O, if any is usable (see the module docs for the policy).
    pub fn select(&mut self, now: Instant) -> Option<usize> {
        let pick = self.pick();
        match pick {
            Some(_) => self.no_path_since = None,
            None => {
                self.no_path_since.get_or_insert(now);
            }
        }
        pick
    }

    fn pick(&mut self) -> Option<usize> {
        let best = |want: AnaState| {
            self.paths
                .iter()
                .enumerate()
                .filter(move |(_, p)| p.link == Link::Up && p.ana == want)
                .map(|(i, _)| i)
        };
        let tier: Vec<usize> = {
            let opt: Vec<usize> = best(AnaState::Optimized).collect();
            if opt.is_empty() {
                best(AnaState::NonOptimized).collect()
            } else {
                opt
            }
        };
        if tier.is_empty() {
            return None;
        }
        match self.policy {
            Policy::ActivePassive => Some(tier[0]),
            Policy::ActiveActive => {
                // The first path of the tier after the last one used.
                let n = self.paths.len();
                let next = tier
                    .iter()
                    .copied()
                    .find(|&i| i >= self.rr)
                    .unwrap_or(tier[0]);
                self.rr = (next + 1) % n;
                Some(next)
            }
        }
    }

    fn all_lost(&self) -> bool {
        self.paths.iter().all(|p| p.link == Link::Lost)
    }

    /// Whether waiting for a path has lasted past fast-io-fail (or can never end).
    fn give_up(&self, now: Instant) -> bool {
        if self.all_lost() {
            return true;
        }
        match (self.timers.fast_io_fail, self.no_path_since) {
            (Some(limit), Some(since)) => now.saturating_duration_since(since) >= limit,
            _ => false,
        }
    }

    /// Routes a new I/O.
    pub fn submit(&mut self, id: usize, now: Instant) -> Route {
        self.transition_since[id] = None;
        match self.select(now) {
            Some(p) => Route::Path(p),
            None if self.give_up(now) => {
                self.stats.no_path_failures += 1;
                Route::Fail(IoStatus::NoPath)
            }
            None => {
                self.waiting.push_back(Waiter {
                    id,
                    not_before: now,
                });
                Route::Queued
            }
        }
    }

    /// An I/O the caller could not hand to `path` after all (its queue refused it because
    /// the path broke meanwhile): it waits for another path.
    pub fn requeue(&mut self, id: usize, path: usize, now: Instant) {
        self.paths[path].link = Link::Down;
        self.stats.failovers += 1;
        self.waiting.push_back(Waiter {
            id,
            not_before: now,
        });
    }

    /// An I/O the chosen path had no room for: it waits for the next [`ready`](Self::ready).
    pub fn defer(&mut self, id: usize, now: Instant) {
        self.waiting.push_back(Waiter {
            id,
            not_before: now,
        });
    }

    /// The completion of I/O `id` sent through `path`.
    pub fn on_completion(
        &mut self,
        id: usize,
        path: usize,
        status: IoStatus,
        now: Instant,
    ) -> Verdict {
        match classify(status) {
            Class::Final => {
                if status.is_success() {
                    self.stats.path_ios[path] += 1;
                }
                self.transition_since[id] = None;
                Verdict::Done
            }
            Class::Ana(state) => {
                self.stats.ana_errors += 1;
                self.paths[path].ana = state;
                self.ana_refresh[path] = true;
                let mut not_before = now;
                if state == AnaState::Change {
                    let since = *self.transition_since[id].get_or_insert(now);
                    if now.saturating_duration_since(since) > self.timers.anatt {
                        self.transition_since[id] = None;
                        return Verdict::Fail(status);
                    }
                    not_before = now + self.timers.transition_retry;
                }
                self.stats.failovers += 1;
                self.waiting.push_back(Waiter { id, not_before });
                Verdict::Retry
            }
            Class::PathDown => {
                if matches!(status, IoStatus::ControllerLost) {
                    self.paths[path].link = Link::Lost;
                } else if self.paths[path].link == Link::Up && !matches!(status, IoStatus::Nvme(_))
                {
                    self.paths[path].link = Link::Down;
                }
                self.stats.failovers += 1;
                self.waiting.push_back(Waiter {
                    id,
                    not_before: now,
                });
                Verdict::Retry
            }
        }
    }

    /// Waiting I/Os whose time has come: each is given a path, or fails (no path past
    /// fast-io-fail, or every path lost). The others keep waiting.
    pub fn ready(&mut self, now: Instant, out: &mut Vec<Ready>) {
        let mut keep = VecDeque::new();
        while let Some(w) = self.waiting.pop_front() {
            if w.not_before > now {
                keep.push_back(w);
                continue;
            }
            match self.select(now) {
                Some(path) => out.push(Ready::Submit { id: w.id, path }),
                None if self.give_up(now) => {
                    self.stats.no_path_failures += 1;
                    self.transition_since[w.id] = None;
                    out.push(Ready::Fail {
                        id: w.id,
                        status: IoStatus::NoPath,
                    });
                }
                None => keep.push_back(w),
            }
        }
        self.waiting = keep;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPT: PathView = PathView::UP_OPTIMIZED;
    const NONOPT: PathView = PathView {
        link: Link::Up,
        ana: AnaState::NonOptimized,
    };

    fn core(policy: Policy, paths: Vec<PathView>) -> MultipathCore {
        MultipathCore::new(
            policy,
            Timers {
                fast_io_fail: Some(Duration::from_secs(5)),
                transition_retry: Duration::from_millis(100),
                anatt: Duration::from_secs(2),
            },
            paths,
            64,
        )
    }

    #[test]
    fn ana_states_decide_the_path() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![NONOPT, OPT]);
        assert_eq!(
            c.select(t),
            Some(1),
            "optimized beats an earlier non-optimized"
        );
        c.set_ana(1, AnaState::Inaccessible);
        assert_eq!(
            c.select(t),
            Some(0),
            "non-optimized when nothing is optimized"
        );
        for never in [
            AnaState::Inaccessible,
            AnaState::PersistentLoss,
            AnaState::Change,
            AnaState::Reserved(7),
        ] {
            c.set_ana(0, never);
            assert_eq!(c.select(t), None, "{never} is never chosen");
        }
        c.set_ana(0, AnaState::Optimized);
        c.set_ana(1, AnaState::Optimized);
        assert_eq!(c.select(t), Some(0), "active-passive: the first optimized");
        assert_eq!(c.select(t), Some(0));
        c.set_link(0, Link::Down);
        assert_eq!(c.select(t), Some(1), "a down path is skipped");
    }

    #[test]
    fn inaccessible_status_retries_on_the_other_path() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![OPT, OPT]);
        assert_eq!(c.submit(3, t), Route::Path(0));
        let v = c.on_completion(3, 0, IoStatus::Nvme(Status::ANA_INACCESSIBLE), t);
        assert_eq!(v, Verdict::Retry);
        assert_eq!(c.paths()[0].ana, AnaState::Inaccessible);
        assert!(c.take_ana_refresh(0), "the ANA log is read again");
        assert!(!c.take_ana_refresh(0));
        let mut out = Vec::new();
        c.ready(t, &mut out);
        assert_eq!(out, [Ready::Submit { id: 3, path: 1 }]);
        assert_eq!(c.stats().failovers, 1);
        assert_eq!(c.stats().ana_errors, 1);
        // Persistent loss likewise; and with DNR the error is final.
        let v = c.on_completion(3, 1, IoStatus::Nvme(Status::ANA_PERSISTENT_LOSS), t);
        assert_eq!(v, Verdict::Retry);
        assert_eq!(c.paths()[1].ana, AnaState::PersistentLoss);
        let mut c = core(Policy::ActivePassive, vec![OPT, OPT]);
        let dnr = Status::ANA_INACCESSIBLE.with_dnr();
        assert_eq!(c.on_completion(1, 0, IoStatus::Nvme(dnr), t), Verdict::Done);
        assert_eq!(c.paths()[0].ana, AnaState::Optimized);
        // Other NVMe errors are the application's.
        let v = c.on_completion(1, 0, IoStatus::Nvme(Status::LBA_OUT_OF_RANGE), t);
        assert_eq!(v, Verdict::Done);
        assert_eq!(c.waiting(), 0);
    }

    #[test]
    fn transition_retries_after_a_delay_within_anatt() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![OPT]);
        assert_eq!(c.submit(0, t), Route::Path(0));
        let st = IoStatus::Nvme(Status::ANA_TRANSITION);
        assert_eq!(c.on_completion(0, 0, st, t), Verdict::Retry);
        assert_eq!(c.paths()[0].ana, AnaState::Change);
        let mut out = Vec::new();
        c.ready(t + Duration::from_millis(50), &mut out);
        assert!(out.is_empty(), "not before the retry delay");
        // The ANA log says the transition ended: the same path serves the retry.
        c.set_ana(0, AnaState::Optimized);
        c.ready(t + Duration::from_millis(100), &mut out);
        assert_eq!(out, [Ready::Submit { id: 0, path: 0 }]);
        // Transitions for longer than ANATT fail the I/O with the path's status.
        let t1 = t + Duration::from_millis(100);
        assert_eq!(c.on_completion(0, 0, st, t1), Verdict::Retry);
        let late = t + Duration::from_millis(2101);
        assert_eq!(c.on_completion(0, 0, st, late), Verdict::Fail(st));
        // A new I/O in the same slot starts its own ANATT clock.
        c.set_ana(0, AnaState::Optimized);
        assert_eq!(c.submit(0, late), Route::Path(0));
        assert_eq!(c.on_completion(0, 0, st, late), Verdict::Retry);
    }

    #[test]
    fn both_paths_down_queue_then_fail_after_fast_io_fail() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![OPT, OPT]);
        assert_eq!(c.submit(0, t), Route::Path(0));
        assert_eq!(c.submit(1, t), Route::Path(0));
        assert_eq!(
            c.on_completion(0, 0, IoStatus::PathError, t),
            Verdict::Retry
        );
        assert_eq!(c.paths()[0].link, Link::Down);
        c.set_link(1, Link::Down);
        assert_eq!(
            c.on_completion(1, 0, IoStatus::TransportError, t),
            Verdict::Retry
        );
        assert_eq!(c.submit(2, t), Route::Queued);
        let mut out = Vec::new();
        c.ready(t + Duration::from_secs(4), &mut out);
        assert!(out.is_empty(), "queued within fast-io-fail");
        assert_eq!(c.waiting(), 3);
        c.ready(t + Duration::from_secs(5), &mut out);
        assert_eq!(
            out,
            [0, 1, 2].map(|id| Ready::Fail {
                id,
                status: IoStatus::NoPath
            })
        );
        assert_eq!(c.stats().no_path_failures, 3);
        assert_eq!(
            c.submit(4, t + Duration::from_secs(6)),
            Route::Fail(IoStatus::NoPath)
        );
        // A path back before the limit takes the queued I/O.
        let mut c = core(Policy::ActivePassive, vec![OPT, OPT]);
        c.set_link(0, Link::Down);
        c.set_link(1, Link::Down);
        assert_eq!(c.submit(7, t), Route::Queued);
        c.set_link(1, Link::Up);
        out.clear();
        c.ready(t + Duration::from_secs(4), &mut out);
        assert_eq!(out, [Ready::Submit { id: 7, path: 1 }]);
    }

    #[test]
    fn without_fast_io_fail_io_waits_until_every_path_is_lost() {
        let t = Instant::now();
        let mut c = MultipathCore::new(Policy::ActivePassive, Timers::default(), vec![OPT, OPT], 8);
        c.set_link(0, Link::Down);
        c.set_link(1, Link::Down);
        assert_eq!(c.submit(0, t), Route::Queued);
        let mut out = Vec::new();
        c.ready(t + Duration::from_secs(3600), &mut out);
        assert!(out.is_empty());
        c.set_link(0, Link::Lost);
        assert_eq!(
            c.on_completion(1, 1, IoStatus::ControllerLost, t),
            Verdict::Retry
        );
        assert_eq!(c.paths()[1].link, Link::Lost);
        c.ready(t + Duration::from_secs(3600), &mut out);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|r| matches!(
            r,
            Ready::Fail {
                status: IoStatus::NoPath,
                ..
            }
        )));
    }

    #[test]
    fn failback_to_the_optimized_path() {
        let t = Instant::now();
        let mut c = core(Policy::ActivePassive, vec![OPT, NONOPT]);
        assert_eq!(c.submit(0, t), Route::Path(0));
        assert_eq!(
            c.on_completion(0, 0, IoStatus::PathError, t),
            Verdict::Retry
        );
        let mut out = Vec::new();
        c.ready(t, &mut out);
        assert_eq!(out, [Ready::Submit { id: 0, path: 1 }]);
        assert_eq!(
            c.on_completion(0, 1, IoStatus::Nvme(Status::SUCCESS), t),
            Verdict::Done
        );
        assert_eq!(c.submit(1, t), Route::Path(1));
        // Path 0 reconnects, but its ANA state is read again first: still inaccessible.
        c.set_link(0, Link::Up);
        c.set_ana(0, AnaState::Inaccessible);
        assert_eq!(c.submit(2, t), Route::Path(1));
        c.set_ana(0, AnaState::Optimized);
        assert_eq!(c.submit(3, t), Route::Path(0), "fails back once optimized");
        assert_eq!(
            c.on_completion(3, 0, IoStatus::Nvme(Status::SUCCESS), t),
            Verdict::Done
        );
        assert_eq!(c.stats().path_ios, [1, 1]);
    }

    #[test]
    fn round_robin_spreads_over_optimized_paths() {
        let t = Instant::now();
        let mut c = core(Policy::ActiveActive, vec![OPT, OPT, NONOPT]);
        let picks: Vec<_> = (0..6).map(|_| c.select(t).unwrap()).collect();
        assert_eq!(
            picks,
            [0, 1, 0, 1, 0, 1],
            "non-optimized unused while any is"
        );
        c.set_link(0, Link::Down);
        let picks: Vec<_> = (0..3).map(|_| c.select(t).unwrap()).collect();
        assert_eq!(picks, [1, 1, 1]);
        c.set_ana(1, AnaState::Inaccessible);
        let mut c2 = core(Policy::ActiveActive, vec![NONOPT, NONOPT]);
        let picks: Vec<_> = (0..4).map(|_| c2.select(t).unwrap()).collect();
        assert_eq!(
            picks,
            [0, 1, 0, 1],
            "over non-optimized when none is optimized"
        );
        assert_eq!(c.select(t), Some(2));
    }

    #[test]
    fn namespace_identity() {
        let a = NamespaceIds::from_identify([1; 16], [0; 8]);
        let b = NamespaceIds::from_identify([1; 16], [0; 8]);
        assert!(same_namespace(&a, &b).is_ok());
        let other = NamespaceIds::from_identify([2; 16], [0; 8]);
        let e = same_namespace(&a, &other).unwrap_err();
        assert!(e.contains("different NGUIDs"), "{e}");
        let none = NamespaceIds::default();
        assert!(same_namespace(&none, &none)
            .unwrap_err()
            .contains("cannot tell"));
        // A descriptor list's UUID counts; a mismatch in any shared identifier refuses.
        let mut c = NamespaceIds::from_identify([0; 16], [9; 8]);
        let mut d = NamespaceIds::from_identify([0; 16], [9; 8]);
        let desc = |uuid: u8| {
            let mut raw = vec![NIDT_UUID, 16, 0, 0];
            raw.extend_from_slice(&[uuid; 16]);
            raw.extend_from_slice(&[0; 8]);
            raw
        };
        c.merge_descriptors(&desc(5));
        d.merge_descriptors(&desc(6));
        assert_eq!(c.uuid, Some([5; 16]));
        assert!(same_namespace(&c, &d).unwrap_err().contains("UUID"));
        d.merge_descriptors(&desc(5));
        assert!(same_namespace(&c, &d).is_ok());
    }

    #[test]
    fn ana_log_round_trip_and_lookup() {
        let log = AnaLog {
            change_count: 7,
            groups: vec![
                AnaGroup {
                    grpid: 1,
                    change_count: 3,
                    state: AnaState::Inaccessible,
                    nsids: vec![1, 2],
                },
                AnaGroup {
                    grpid: 2,
                    change_count: 4,
                    state: AnaState::Optimized,
                    nsids: vec![],
                },
            ],
        };
        let mut raw = log.to_bytes();
        assert_eq!(raw.len(), 16 + 32 + 8 + 32);
        assert_eq!(raw[16 + 16], 0x03);
        raw.extend_from_slice(&[0; 100]);
        let back = AnaLog::parse(&raw).unwrap();
        assert_eq!(back, log);
        assert_eq!(back.state_of(2, 0), Some(AnaState::Inaccessible));
        assert_eq!(
            back.state_of(5, 2),
            Some(AnaState::Optimized),
            "by ANAGRPID"
        );
        assert_eq!(back.state_of(5, 0), None);
        assert!(matches!(
            AnaLog::parse(&log.to_bytes()[..60]),
            Err(AnaLogError::Truncated { .. })
        ));
        assert_eq!(AnaState::from_raw(0x0F), AnaState::Change);
        assert_eq!("active_active".parse::<Policy>(), Ok(Policy::ActiveActive));
        assert!("both".parse::<Policy>().is_err());
    }
}

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
//!
//! [`IoStatus::PathError`]: crate::qpair::IoStatus::PathError
//! [`IoStatus::NoPath`]: crate::qpair::IoStatus::NoPath

mod ana;
mod classify;
mod namespace_ids;
mod policy;
mod state_machine;
mod stats;

pub use ana::{AnaGroup, AnaLog, AnaLogError, AnaState, ANA_GROUP_DESC_LEN, ANA_LOG_HEADER_LEN};
pub use namespace_ids::{same_namespace, NamespaceIds};
pub use policy::{Link, PathView, Policy, Timers};
pub use state_machine::{MultipathCore, Ready, Route, Verdict, MAX_PATH_RETRIES};
pub use stats::MultipathStats;

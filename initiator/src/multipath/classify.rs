//! How a completion status relates to paths (see "What a completion means" in the
//! [`multipath`](super) docs).

use nvmf_common::spec::{Status, StatusCodeType};

use crate::qpair::IoStatus;

use super::ana::AnaState;

/// How a completion status relates to paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    Final,
    Ana(AnaState),
    PathDown,
}

pub(super) fn classify(status: IoStatus) -> Class {
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

//! [`ControllerInfo`]: what the bring-up learned, and the I/O limits that follow from it.

use nvmf_common::spec::identify::SGLS_OFFSET;
use nvmf_common::spec::sgl::KEYED_MAX_LENGTH;
use nvmf_common::spec::{Cap, IdentifyController, Version};

/// What the bring-up learned about the controller.
#[derive(Clone)]
pub struct ControllerInfo {
    pub cntlid: u16,
    pub cap: Cap,
    pub vs: Version,
    pub identify: Box<IdentifyController>,
}

impl ControllerInfo {
    /// In-capsule data bytes on I/O queues: (IOCCSZ * 16) - 64 when SGLS advertises offset
    /// data blocks (and ICDOFF is 0, the only offset we send).
    pub fn in_capsule_size(&self) -> u32 {
        let id = &self.identify;
        if id.sgls.get() & SGLS_OFFSET == 0 || id.icdoff.get() != 0 {
            return 0;
        }
        (id.ioccsz.get().saturating_mul(16)).saturating_sub(64)
    }

    /// MDTS in bytes (units of the minimum memory page size), capped by what one keyed SGL
    /// can describe.
    pub fn max_transfer(&self) -> u32 {
        let mdts = self.identify.mdts;
        if mdts == 0 {
            return KEYED_MAX_LENGTH;
        }
        let page = 1u64 << (12 + u32::from(self.cap.mpsmin()));
        (page << mdts).min(u64::from(KEYED_MAX_LENGTH)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    fn info(mdts: u8, sgls: u32, ioccsz: u32) -> ControllerInfo {
        let mut id = IdentifyController::new_zeroed();
        id.mdts = mdts;
        id.sgls.set(sgls);
        id.ioccsz.set(ioccsz);
        ControllerInfo {
            cntlid: 1,
            cap: Cap(0),
            vs: Version::V1_3,
            identify: Box::new(id),
        }
    }

    #[test]
    fn in_capsule_size_needs_offset_sgls() {
        assert_eq!(info(0, SGLS_OFFSET | 0b101, 260).in_capsule_size(), 4096);
        assert_eq!(info(0, 0b101, 260).in_capsule_size(), 0);
        assert_eq!(info(0, SGLS_OFFSET, 4).in_capsule_size(), 0);
    }

    #[test]
    fn max_transfer_from_mdts() {
        assert_eq!(info(0, 0, 0).max_transfer(), KEYED_MAX_LENGTH);
        assert_eq!(info(5, 0, 0).max_transfer(), 128 * 1024);
        assert_eq!(info(20, 0, 0).max_transfer(), KEYED_MAX_LENGTH);
    }
}

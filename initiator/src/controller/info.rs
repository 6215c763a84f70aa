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
        // Both exponents are the target's: a sum past what a keyed SGL can describe (2^24
        // bytes) is that cap, not a shift that overflows or wraps to nothing.
        let exponent = 12 + u32::from(self.cap.mpsmin()) + u32::from(mdts);
        1u64.checked_shl(exponent)
            .map_or(KEYED_MAX_LENGTH, |bytes| {
                bytes.min(u64::from(KEYED_MAX_LENGTH)) as u32
            })
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
        // A target's absurd MDTS: capped, never zero (every log read would loop) nor a
        // shift overflow.
        for mdts in [52, 60, 63, 64, 200, 255] {
            assert_eq!(
                info(mdts, 0, 0).max_transfer(),
                KEYED_MAX_LENGTH,
                "MDTS {mdts}"
            );
        }
    }
}

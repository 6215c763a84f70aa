//! Namespace identity across controllers: NGUID, EUI64 and UUID, and whether two paths
//! reach the same namespace.

use std::fmt;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}

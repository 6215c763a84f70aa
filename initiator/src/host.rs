//! Who we are to the target: the host NQN and the 128-bit host identifier of the Connect data.
//!
//! Like nvme-cli, the defaults come from `/etc/nvme/hostnqn` and `/etc/nvme/hostid`; without
//! them a UUID-based NQN is generated, with the same UUID as host ID.

use std::fmt::Write;

use nvmf_common::spec::nqn::UUID_NQN_PREFIX;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostIdentity {
    pub nqn: String,
    pub id: [u8; 16],
}

const HOSTNQN_FILE: &str = "/etc/nvme/hostnqn";
const HOSTID_FILE: &str = "/etc/nvme/hostid";

/// Parses `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.trim().chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 || s.trim().len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub fn format_uuid(id: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in id.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A random (version 4) UUID from the kernel's generator.
fn random_uuid() -> [u8; 16] {
    let mut id = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut id))
        .is_err()
    {
        // No /dev/urandom: mix the clock and pid; uniqueness is all that matters here.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        id.copy_from_slice(&(t ^ (u128::from(std::process::id()) << 64)).to_le_bytes());
    }
    id[6] = (id[6] & 0x0F) | 0x40;
    id[8] = (id[8] & 0x3F) | 0x80;
    id
}

fn read_trimmed(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

impl HostIdentity {
    /// The identity to connect with: `nqn` / `id` when given, else the system's files, else
    /// generated. A UUID NQN without an explicit ID uses its UUID as the ID.
    pub fn resolve(nqn: Option<&str>, id: Option<[u8; 16]>) -> Self {
        let nqn = nqn
            .map(str::to_string)
            .or_else(|| read_trimmed(HOSTNQN_FILE))
            .unwrap_or_else(|| format!("{UUID_NQN_PREFIX}{}", format_uuid(&random_uuid())));
        let id = id
            .or_else(|| nqn.strip_prefix(UUID_NQN_PREFIX).and_then(parse_uuid))
            .or_else(|| read_trimmed(HOSTID_FILE).and_then(|s| parse_uuid(&s)))
            .unwrap_or_else(random_uuid);
        Self { nqn, id }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_round_trip() {
        let s = "0f8fad5b-d9cb-469f-a165-70867728950e";
        let id = parse_uuid(s).unwrap();
        assert_eq!(id[0], 0x0f);
        assert_eq!(format_uuid(&id), s);
        assert_eq!(parse_uuid("0f8fad5bd9cb469fa16570867728950e"), None);
        assert_eq!(parse_uuid("zz8fad5b-d9cb-469f-a165-70867728950e"), None);
    }

    #[test]
    fn uuid_nqn_gives_its_id() {
        let h = HostIdentity::resolve(
            Some("nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e"),
            None,
        );
        assert_eq!(format_uuid(&h.id), "0f8fad5b-d9cb-469f-a165-70867728950e");
        let r = random_uuid();
        assert_eq!(r[6] >> 4, 4);
        let explicit = HostIdentity::resolve(Some("nqn.x"), Some([7; 16]));
        assert_eq!(explicit.id, [7; 16]);
    }
}

//! NVMe Qualified Names (NVMe 2.0 base, 4.5 "NVMe Qualified Names").

use thiserror::Error;

/// The well-known NQN of discovery subsystems.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Prefix of the UUID form, followed by a canonical UUID.
pub const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";
/// Longest NQN in bytes, excluding the terminating NUL of the 256-byte fields.
pub const NQN_MAX_LEN: usize = 223;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NqnError {
    #[error("NQN is {0} bytes long, the limit is 223")]
    TooLong(usize),
    #[error("NQN must start with \"nqn.\"")]
    MissingPrefix,
    #[error("NQN date must be \"yyyy-mm.\" with a month between 01 and 12")]
    BadDate,
    #[error("NQN needs a reverse domain name after the date")]
    MissingDomain,
    #[error("NQN domain label {0:?} must be 1-63 letters, digits or '-', not starting or ending with '-'")]
    BadDomainLabel(String),
    #[error("NQN user string after ':' must be non-empty printable text")]
    BadUserString,
    #[error("UUID NQN must end in a canonical 8-4-4-4-12 hex UUID")]
    BadUuid,
}

/// Checks an NQN against the two forms of NVMe 2.0 base 4.5: the UUID form, or
/// `nqn.yyyy-mm.<reverse domain>[:<user string>]`.
pub fn validate_nqn(nqn: &str) -> Result<(), NqnError> {
    if nqn.len() > NQN_MAX_LEN {
        return Err(NqnError::TooLong(nqn.len()));
    }
    if nqn == DISCOVERY_NQN {
        return Ok(());
    }
    if let Some(uuid) = nqn.strip_prefix(UUID_NQN_PREFIX) {
        return if is_canonical_uuid(uuid) {
            Ok(())
        } else {
            Err(NqnError::BadUuid)
        };
    }
    let rest = nqn.strip_prefix("nqn.").ok_or(NqnError::MissingPrefix)?;
    let rest = check_date(rest)?;
    let (domain, user) = match rest.split_once(':') {
        Some((d, u)) => (d, Some(u)),
        None => (rest, None),
    };
    if domain.is_empty() {
        return Err(NqnError::MissingDomain);
    }
    for label in domain.split('.') {
        if !is_domain_label(label) {
            return Err(NqnError::BadDomainLabel(label.to_owned()));
        }
    }
    if let Some(user) = user {
        if user.is_empty() || user.chars().any(char::is_control) {
            return Err(NqnError::BadUserString);
        }
    }
    Ok(())
}

/// Consumes "yyyy-mm." and returns what follows.
fn check_date(s: &str) -> Result<&str, NqnError> {
    let b = s.as_bytes();
    if b.len() < 7 || b[4] != b'-' {
        return Err(NqnError::BadDate);
    }
    let digits = |r: &[u8]| r.iter().all(u8::is_ascii_digit);
    if !digits(&b[0..4]) || !digits(&b[5..7]) {
        return Err(NqnError::BadDate);
    }
    let month = (b[5] - b'0') * 10 + (b[6] - b'0');
    if !(1..=12).contains(&month) {
        return Err(NqnError::BadDate);
    }
    match b.get(7) {
        None => Err(NqnError::MissingDomain),
        Some(b'.') => Ok(&s[8..]),
        Some(_) => Err(NqnError::BadDate),
    }
}

fn is_domain_label(label: &str) -> bool {
    let b = label.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn is_canonical_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good() {
        for nqn in [
            DISCOVERY_NQN,
            "nqn.2016-06.io.spdk:cnode1",
            "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
            "nqn.2014-08.com.example:nvme:nvm-subsystem-sn-d78432",
            "nqn.2023-12.io",
            "nqn.2001-04.com.example:user string with spaces",
        ] {
            assert_eq!(validate_nqn(nqn), Ok(()), "{nqn}");
        }
        let longest = format!("nqn.2016-06.io.spdk:{}", "x".repeat(NQN_MAX_LEN - 20));
        assert_eq!(longest.len(), NQN_MAX_LEN);
        assert_eq!(validate_nqn(&longest), Ok(()));
    }

    #[test]
    fn bad() {
        let too_long = format!("nqn.2016-06.io.spdk:{}", "x".repeat(NQN_MAX_LEN - 19));
        assert_eq!(validate_nqn(&too_long), Err(NqnError::TooLong(224)));
        assert_eq!(
            validate_nqn("iqn.2016-06.io.spdk:a"),
            Err(NqnError::MissingPrefix)
        );
        assert_eq!(
            validate_nqn("nqn.2016-13.io.spdk:a"),
            Err(NqnError::BadDate)
        );
        assert_eq!(
            validate_nqn("nqn.2016-00.io.spdk:a"),
            Err(NqnError::BadDate)
        );
        assert_eq!(validate_nqn("nqn.16-06.io.spdk:a"), Err(NqnError::BadDate));
        assert_eq!(validate_nqn("nqn.2016-6.io"), Err(NqnError::BadDate));
        assert_eq!(validate_nqn("nqn.2016-06"), Err(NqnError::MissingDomain));
        assert_eq!(validate_nqn("nqn.2016-06.:a"), Err(NqnError::MissingDomain));
        assert_eq!(
            validate_nqn("nqn.2016-06.io..spdk:a"),
            Err(NqnError::BadDomainLabel(String::new()))
        );
        assert_eq!(
            validate_nqn("nqn.2016-06.io.sp_dk:a"),
            Err(NqnError::BadDomainLabel("sp_dk".into()))
        );
        assert_eq!(
            validate_nqn("nqn.2016-06.io.spdk:"),
            Err(NqnError::BadUserString)
        );
        assert_eq!(
            validate_nqn("nqn.2016-06.io.spdk:a\nb"),
            Err(NqnError::BadUserString)
        );
        assert_eq!(
            validate_nqn("nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf"),
            Err(NqnError::BadUuid)
        );
        assert_eq!(
            validate_nqn("nqn.2014-08.org.nvmexpress:uuid:f81d4fae7dec-11d0-a765-00a0c91e6bf6x"),
            Err(NqnError::BadUuid)
        );
        assert!(!validate_nqn("nqn.2016-13.io")
            .unwrap_err()
            .to_string()
            .is_empty());
    }
}

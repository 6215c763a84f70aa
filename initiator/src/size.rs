//! Sizes on command lines, as SPDK's tools read them (`spdk_parse_capacity`): a decimal
//! number, optionally followed by a binary prefix `k`/`K` (KiB), `m`/`M` (MiB) or `g`/`G`
//! (GiB), itself optionally followed by `B`/`b`. `4096`, `4k`, `128K`, `1m`, `2GB` all
//! parse. SPDK ignores anything after the prefix; here only the `B` is allowed, so a typo
//! (`4kk`, `4 KiB`) is an error instead of a silently wrong size.

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("{0:?} is not a size (a number, optionally with k, m or g: 4096, 4k, 1M)")]
    Syntax(String),
    #[error("{0:?} is too large")]
    Overflow(String),
}

/// Parses a size in bytes (see the module documentation).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let syntax = || SizeError::Syntax(s.to_string());
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(syntax());
    }
    let (num, rest) = s.split_at(digits);
    let value: u64 = num
        .parse()
        .map_err(|_| SizeError::Overflow(s.to_string()))?;
    let mut rest = rest.chars();
    let shift = match rest.next() {
        None => return Ok(value),
        Some('k' | 'K') => 10,
        Some('m' | 'M') => 20,
        Some('g' | 'G') => 30,
        Some(_) => return Err(syntax()),
    };
    match (rest.next(), rest.next()) {
        (None, _) | (Some('b' | 'B'), None) => {}
        _ => return Err(syntax()),
    }
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| SizeError::Overflow(s.to_string()))
}

/// A size that must fit in 32 bits (I/O sizes, queue depths).
pub fn parse_size_u32(s: &str) -> Result<u32, SizeError> {
    u32::try_from(parse_size(s)?).map_err(|_| SizeError::Overflow(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_numbers_and_binary_prefixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("128K"), Ok(128 * 1024));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("3M"), Ok(3 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4kB"), Ok(4096));
        assert_eq!(parse_size("4KB"), Ok(4096));
        assert_eq!(parse_size("1Mb"), Ok(1 << 20));
    }

    #[test]
    fn rejects_what_is_not_a_size() {
        for bad in [
            "", "k", "-4k", "4x", "4096B", "4kk", "4 k", " 4k", "4KiB", "0x1000", "1.5m", "4kBB",
        ] {
            assert_eq!(
                parse_size(bad),
                Err(SizeError::Syntax(bad.into())),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(
            parse_size("17179869184G"),
            Err(SizeError::Overflow(_))
        ));
        assert_eq!(parse_size_u32("4g"), Err(SizeError::Overflow("4g".into())));
        assert_eq!(parse_size_u32("128k"), Ok(131072));
    }
}

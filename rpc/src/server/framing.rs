//! Framing of SPDK's unframed stream: where the first complete JSON value in the bytes read so
//! far ends.

use serde_json::Value;

pub(crate) enum Next {
    /// The buffer holds only whitespace.
    Empty,
    /// The first value is not complete yet.
    NeedMore,
    /// The first value and the bytes it took (including leading whitespace).
    Value(Value, usize),
    Invalid(String),
}

/// Finds where the first top-level JSON value in a growing buffer ends, resuming where the
/// previous call stopped, so each byte is scanned once however the request is fragmented.
#[derive(Default)]
pub(crate) struct Scanner {
    pos: usize,
    start: Option<usize>,
    depth: usize,
    in_string: bool,
    escape: bool,
}

impl Scanner {
    pub(crate) fn next_value(&mut self, buf: &[u8]) -> Next {
        if self.start.is_none() {
            while self.pos < buf.len() && buf[self.pos].is_ascii_whitespace() {
                self.pos += 1;
            }
            if self.pos == buf.len() {
                return Next::Empty;
            }
            if !matches!(buf[self.pos], b'{' | b'[') {
                // A scalar at top level: small or garbage; let serde judge it.
                return self.parse_scalar(buf);
            }
            self.start = Some(self.pos);
        }
        while self.pos < buf.len() {
            let b = buf[self.pos];
            self.pos += 1;
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if b == b'\\' {
                    self.escape = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        let start = self.start.expect("set above");
                        return match serde_json::from_slice::<Value>(&buf[start..self.pos]) {
                            Ok(v) => Next::Value(v, self.pos),
                            Err(e) => Next::Invalid(e.to_string()),
                        };
                    }
                }
                _ => {}
            }
        }
        Next::NeedMore
    }

    fn parse_scalar(&mut self, buf: &[u8]) -> Next {
        let mut stream =
            serde_json::Deserializer::from_slice(&buf[self.pos..]).into_iter::<Value>();
        match stream.next() {
            None => Next::Empty,
            Some(Ok(v)) => {
                let end = self.pos + stream.byte_offset();
                // A number at the very end of the buffer may still be growing.
                if end == buf.len() && v.is_number() {
                    return Next::NeedMore;
                }
                Next::Value(v, end)
            }
            Some(Err(e)) if e.is_eof() => Next::NeedMore,
            Some(Err(e)) => Next::Invalid(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn scan_all(chunks: &[&str]) -> Vec<Value> {
        let mut buf = Vec::new();
        let mut scan = Scanner::default();
        let mut out = Vec::new();
        for c in chunks {
            buf.extend_from_slice(c.as_bytes());
            loop {
                match scan.next_value(&buf) {
                    Next::Value(v, n) => {
                        buf.drain(..n);
                        scan = Scanner::default();
                        out.push(v);
                    }
                    Next::Empty => {
                        buf.clear();
                        scan = Scanner::default();
                        break;
                    }
                    Next::NeedMore => break,
                    Next::Invalid(e) => panic!("invalid: {e}"),
                }
            }
        }
        out
    }

    #[test]
    fn scanner_handles_fragments_strings_and_concatenation() {
        let v = scan_all(&[
            "{\"a\": \"}{\\\"",
            "]\", \"b\"",
            ": [1, {\"c\": 2}]}",
            "  {}\n[]",
        ]);
        assert_eq!(
            v,
            vec![
                json!({"a": "}{\"]", "b": [1, {"c": 2}]}),
                json!({}),
                json!([])
            ]
        );
        let v = scan_all(&["1", "2 ", "\"x\""]);
        assert_eq!(v, vec![json!(12), json!("x")]);
    }

    #[test]
    fn scanner_rejects_garbage() {
        let mut s = Scanner::default();
        assert!(matches!(s.next_value(b"hello"), Next::Invalid(_)));
        let mut s = Scanner::default();
        assert!(matches!(s.next_value(b"{\"a\": ]"), Next::Invalid(_)));
        let mut s = Scanner::default();
        assert!(matches!(s.next_value(b"}"), Next::Invalid(_)));
    }
}

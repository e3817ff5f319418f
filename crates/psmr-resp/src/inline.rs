//! Redis's inline command syntax, as its `sdssplitargs` reads it: words split
//! on blanks, double quotes with C escapes and `\xHH`, single quotes with `\'`.

use crate::ProtocolError;

/// Splits one inline command line (without its terminator) into arguments.
pub(crate) fn split_args(line: &[u8]) -> Result<Vec<Vec<u8>>, ProtocolError> {
    // Redis reads the line as a C string: nothing after a NUL counts.
    let mut rest = line.split(|&b| b == 0).next().unwrap_or_default();
    let mut args = Vec::new();
    loop {
        while let [b, tail @ ..] = rest {
            if !is_space(*b) {
                break;
            }
            rest = tail;
        }
        if rest.is_empty() {
            return Ok(args);
        }
        let (arg, tail) = word(rest)?;
        args.push(arg);
        rest = tail;
    }
}

/// C's `isspace`, which Redis uses between words and after a closing quote.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn word(mut s: &[u8]) -> Result<(Vec<u8>, &[u8]), ProtocolError> {
    let mut arg = Vec::new();
    loop {
        match s {
            [] | [b' ' | b'\n' | b'\r' | b'\t', ..] => return Ok((arg, s)),
            [b'"', tail @ ..] => {
                let rest = double_quoted(tail, &mut arg)?;
                return Ok((arg, rest));
            }
            [b'\'', tail @ ..] => {
                let rest = single_quoted(tail, &mut arg)?;
                return Ok((arg, rest));
            }
            [b, tail @ ..] => {
                arg.push(*b);
                s = tail;
            }
        }
    }
}

fn double_quoted<'a>(mut s: &'a [u8], arg: &mut Vec<u8>) -> Result<&'a [u8], ProtocolError> {
    loop {
        match s {
            [b'\\', b'x', h, l, tail @ ..] if hex_pair(*h, *l).is_some() => {
                arg.extend(hex_pair(*h, *l));
                s = tail;
            }
            [b'\\', c, tail @ ..] => {
                arg.push(unescape(*c));
                s = tail;
            }
            [b'"', tail @ ..] => return closed(tail),
            [] => return Err(ProtocolError::UnbalancedQuotes),
            [b, tail @ ..] => {
                arg.push(*b);
                s = tail;
            }
        }
    }
}

fn single_quoted<'a>(mut s: &'a [u8], arg: &mut Vec<u8>) -> Result<&'a [u8], ProtocolError> {
    loop {
        match s {
            [b'\\', b'\'', tail @ ..] => {
                arg.push(b'\'');
                s = tail;
            }
            [b'\'', tail @ ..] => return closed(tail),
            [] => return Err(ProtocolError::UnbalancedQuotes),
            [b, tail @ ..] => {
                arg.push(*b);
                s = tail;
            }
        }
    }
}

/// Redis rejects `"a"b`: a closing quote must end the word.
fn closed(tail: &[u8]) -> Result<&[u8], ProtocolError> {
    match tail.first() {
        Some(&b) if !is_space(b) => Err(ProtocolError::UnbalancedQuotes),
        _ => Ok(tail),
    }
}

fn hex_pair(h: u8, l: u8) -> Option<u8> {
    let digit = |b: u8| char::from(b).to_digit(16);
    Some((digit(h)? * 16 + digit(l)?) as u8)
}

fn unescape(c: u8) -> u8 {
    match c {
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'b' => 0x08,
        b'a' => 0x07,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(line: &str) -> Result<Vec<Vec<u8>>, ProtocolError> {
        split_args(line.as_bytes())
    }

    #[test]
    fn words_split_on_blanks() {
        assert_eq!(split("  SET\tk  v ").unwrap(), [b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()]);
        assert!(split(" \t\x0b ").unwrap().is_empty());
    }

    #[test]
    fn quotes_unescape_like_redis() {
        let args = split(r#"SET "a b\n\x41\x4" 'it\'s "x"' """#).unwrap();
        assert_eq!(args, [b"SET".to_vec(), b"a b\nAx4".to_vec(), b"it's \"x\"".to_vec(), Vec::new()]);
    }

    #[test]
    fn quote_may_start_inside_a_word() {
        assert_eq!(split(r#"ab"c d""#).unwrap(), [b"abc d".to_vec()]);
    }

    #[test]
    fn unbalanced_quotes_are_rejected() {
        for line in [r#"GET "k"#, "GET 'k", r#"GET "k"x"#, "GET 'k'x", r#"GET "k\"#] {
            assert_eq!(split(line), Err(ProtocolError::UnbalancedQuotes), "{line}");
        }
    }

    #[test]
    fn nul_ends_the_line() {
        assert_eq!(split_args(b"PING\0 ignored \"").unwrap(), [b"PING".to_vec()]);
    }
}

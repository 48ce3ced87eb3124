//! Content digests (`sha256:<hex>`) and a writer that hashes what passes
//! through it.

use std::fmt;
use std::io::{self, Write};
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A validated `sha256:<64 lowercase hex>` content digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest {
    hex: String,
}

/// Why a string is not a digest we accept.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid digest {0:?}: expected sha256:<64 lowercase hex digits>")]
pub struct InvalidDigest(pub String);

impl Digest {
    /// Digest of a byte slice.
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            hex: hex::encode(Sha256::digest(bytes)),
        }
    }

    /// Parses 64 lowercase hex digits (no algorithm prefix).
    pub fn from_hex(hex_digits: &str) -> Result<Self, InvalidDigest> {
        let valid = hex_digits.len() == 64
            && hex_digits
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if valid {
            Ok(Self {
                hex: hex_digits.to_string(),
            })
        } else {
            Err(InvalidDigest(hex_digits.to_string()))
        }
    }

    /// The 64 hex digits, without the `sha256:` prefix.
    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl FromStr for Digest {
    type Err = InvalidDigest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_prefix("sha256:") {
            Some(hex_digits) => Self::from_hex(hex_digits).map_err(|_| InvalidDigest(s.into())),
            None => Err(InvalidDigest(s.to_string())),
        }
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A writer that forwards to `inner` and hashes every byte written.
#[derive(Debug)]
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// The digest and byte count of everything written, and the inner writer.
    pub fn finish(self) -> (Digest, u64, W) {
        let digest = Digest {
            hex: hex::encode(self.hasher.finalize()),
        };
        (digest, self.written, self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes every byte read through it.
#[derive(Debug)]
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: io::Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
        }
    }

    /// Reads what is left (a tar stream may end before its padding), then
    /// returns the digest of everything.
    pub fn finish(mut self) -> io::Result<Digest> {
        io::copy(&mut self, &mut io::sink())?;
        Ok(Digest {
            hex: hex::encode(self.hasher.finalize()),
        })
    }
}

impl<R: io::Read> io::Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_round_trip() {
        let d = Digest::of(b"hello");
        let text = d.to_string();
        assert_eq!(
            text,
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(text.parse::<Digest>(), Ok(d));
    }

    #[test]
    fn rejects_bad_digests() {
        for bad in [
            "",
            "sha256:",
            "md5:abcd",
            "sha256:ABCDEF",
            "sha256:../../etc",
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad}");
        }
    }

    #[test]
    fn hashing_writer_matches_direct_hash() {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"hel").expect("write");
        w.write_all(b"lo").expect("write");
        let (d, n, inner) = w.finish();
        assert_eq!(d, Digest::of(b"hello"));
        assert_eq!(n, 5);
        assert_eq!(inner, b"hello");
    }
}

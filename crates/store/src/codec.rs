//! Delta compression of one object's revision specs.
//!
//! Specs are canonical JSON bytes. Revision 1 and every
//! [`KEYFRAME_INTERVAL`]th revision after it is a *keyframe*: the whole spec,
//! zstd-compressed or raw, whichever is smaller. Every other revision is a
//! *delta* against the previous revision's bytes: either a prefix/suffix patch
//! (common prefix length, common suffix length, the bytes in between) or a
//! zstd frame compressed with the previous revision as a raw dictionary,
//! whichever is smaller. Decoding revision N decodes the nearest keyframe at or
//! before N, then applies deltas forward (see [`decode_chain`]).
//!
//! This module is pure: bytes in, bytes out, no I/O and no knowledge of
//! objects or of where payloads are kept.

use std::io;

/// A keyframe every this many revisions, so decoding never applies more than
/// `KEYFRAME_INTERVAL - 1` deltas.
pub const KEYFRAME_INTERVAL: u64 = 64;

/// zstd level for keyframes and dictionary deltas: specs are small, so a
/// high level costs little.
const ZSTD_LEVEL: i32 = 12;

/// Refuse to decode to more than this many bytes (a corrupt length must not
/// make us allocate gigabytes).
const MAX_DECODED_LEN: u64 = 64 * 1024 * 1024;

/// The first byte of every payload.
mod tag {
    pub const KEYFRAME_RAW: u8 = 0;
    pub const KEYFRAME_ZSTD: u8 = 1;
    pub const DELTA_PATCH: u8 = 2;
    pub const DELTA_ZSTD: u8 = 3;
}

/// Why a payload could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("payload is empty")]
    Empty,
    #[error("unknown payload tag {0}")]
    UnknownTag(u8),
    #[error("payload ends inside a length")]
    TruncatedVarint,
    #[error("payload declares {0} bytes, more than the {MAX_DECODED_LEN} allowed")]
    TooLarge(u64),
    #[error("patch keeps {prefix}+{suffix} bytes of a {base_len}-byte base")]
    PatchOutOfRange {
        prefix: u64,
        suffix: u64,
        base_len: usize,
    },
    #[error("a delta needs the previous revision, and there is none")]
    MissingBase,
    #[error("a chain must start with a keyframe")]
    ChainStartsWithDelta,
    #[error("decoded {actual} bytes where the payload declares {declared}")]
    LengthMismatch { declared: u64, actual: usize },
    #[error("zstd")]
    Zstd(#[source] io::Error),
}

/// Whether revision `revision` (1-based) is encoded as a keyframe when its
/// predecessor is available.
pub fn is_keyframe_revision(revision: u64) -> bool {
    revision <= 1 || (revision - 1).is_multiple_of(KEYFRAME_INTERVAL)
}

/// Encodes `spec` as revision `revision`, relative to `previous` (the
/// previous revision's bytes) unless this is a keyframe position or there is
/// no previous revision.
pub fn encode(revision: u64, previous: Option<&[u8]>, spec: &[u8]) -> Result<Vec<u8>, CodecError> {
    match previous {
        Some(previous) if !is_keyframe_revision(revision) => encode_delta(previous, spec),
        _ => encode_keyframe(spec),
    }
}

/// The whole spec, compressed or raw, whichever is smaller.
pub fn encode_keyframe(spec: &[u8]) -> Result<Vec<u8>, CodecError> {
    let mut raw = Vec::with_capacity(spec.len() + 1);
    raw.push(tag::KEYFRAME_RAW);
    raw.extend_from_slice(spec);

    let compressed = compress(None, spec)?;
    let mut packed = Vec::with_capacity(compressed.len() + 6);
    packed.push(tag::KEYFRAME_ZSTD);
    write_varint(&mut packed, spec.len() as u64);
    packed.extend_from_slice(&compressed);

    Ok(smaller(raw, packed))
}

/// `spec` relative to `previous`: a prefix/suffix patch or a zstd frame using
/// `previous` as dictionary, whichever is smaller.
pub fn encode_delta(previous: &[u8], spec: &[u8]) -> Result<Vec<u8>, CodecError> {
    let prefix = common_prefix(previous, spec);
    let suffix = common_suffix(&previous[prefix..], &spec[prefix..]);
    let middle = &spec[prefix..spec.len() - suffix];
    let mut patch = Vec::with_capacity(middle.len() + 11);
    patch.push(tag::DELTA_PATCH);
    write_varint(&mut patch, prefix as u64);
    write_varint(&mut patch, suffix as u64);
    patch.extend_from_slice(middle);
    // A patch of a few bytes cannot be beaten by a zstd frame (its header
    // alone is larger), so skip compressing.
    if patch.len() <= 16 {
        return Ok(patch);
    }

    let compressed = compress(Some(previous), spec)?;
    let mut packed = Vec::with_capacity(compressed.len() + 6);
    packed.push(tag::DELTA_ZSTD);
    write_varint(&mut packed, spec.len() as u64);
    packed.extend_from_slice(&compressed);

    Ok(smaller(patch, packed))
}

/// Whether `payload` decodes without a previous revision.
pub fn is_keyframe(payload: &[u8]) -> Result<bool, CodecError> {
    match payload.first() {
        None => Err(CodecError::Empty),
        Some(&tag::KEYFRAME_RAW | &tag::KEYFRAME_ZSTD) => Ok(true),
        Some(&tag::DELTA_PATCH | &tag::DELTA_ZSTD) => Ok(false),
        Some(&other) => Err(CodecError::UnknownTag(other)),
    }
}

/// Decodes one payload; `previous` is the previous revision's bytes, needed
/// only by deltas.
pub fn decode(payload: &[u8], previous: Option<&[u8]>) -> Result<Vec<u8>, CodecError> {
    let (&tag, mut body) = payload.split_first().ok_or(CodecError::Empty)?;
    match tag {
        tag::KEYFRAME_RAW => Ok(body.to_vec()),
        tag::KEYFRAME_ZSTD => {
            let len = read_len(&mut body)?;
            decompress(None, body, len)
        }
        tag::DELTA_PATCH => {
            let base = previous.ok_or(CodecError::MissingBase)?;
            let prefix = read_varint(&mut body)?;
            let suffix = read_varint(&mut body)?;
            let fits = prefix
                .checked_add(suffix)
                .is_some_and(|kept| kept <= base.len() as u64);
            if !fits {
                return Err(CodecError::PatchOutOfRange {
                    prefix,
                    suffix,
                    base_len: base.len(),
                });
            }
            // Both fit in usize: their sum is at most base.len().
            let (prefix, suffix) = (prefix as usize, suffix as usize);
            let mut out = Vec::with_capacity(prefix + body.len() + suffix);
            out.extend_from_slice(&base[..prefix]);
            out.extend_from_slice(body);
            out.extend_from_slice(&base[base.len() - suffix..]);
            Ok(out)
        }
        tag::DELTA_ZSTD => {
            let base = previous.ok_or(CodecError::MissingBase)?;
            let len = read_len(&mut body)?;
            decompress(Some(base), body, len)
        }
        other => Err(CodecError::UnknownTag(other)),
    }
}

/// Decodes the last revision of a chain: a keyframe followed by the deltas of
/// the following revisions, in order.
pub fn decode_chain<'a>(
    payloads: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<u8>, CodecError> {
    let mut current: Option<Vec<u8>> = None;
    for payload in payloads {
        if current.is_none() && !is_keyframe(payload)? {
            return Err(CodecError::ChainStartsWithDelta);
        }
        current = Some(decode(payload, current.as_deref())?);
    }
    current.ok_or(CodecError::Empty)
}

fn smaller(a: Vec<u8>, b: Vec<u8>) -> Vec<u8> {
    if b.len() < a.len() { b } else { a }
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    a.iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

fn compress(dictionary: Option<&[u8]>, data: &[u8]) -> Result<Vec<u8>, CodecError> {
    use zstd::zstd_safe::CParameter;
    let mut compressor = match dictionary {
        Some(dictionary) => zstd::bulk::Compressor::with_dictionary(ZSTD_LEVEL, dictionary),
        None => zstd::bulk::Compressor::new(ZSTD_LEVEL),
    }
    .map_err(CodecError::Zstd)?;
    // The length travels in our own header; drop what zstd would repeat.
    for parameter in [
        CParameter::ContentSizeFlag(false),
        CParameter::ChecksumFlag(false),
        CParameter::DictIdFlag(false),
    ] {
        compressor
            .set_parameter(parameter)
            .map_err(CodecError::Zstd)?;
    }
    compressor.compress(data).map_err(CodecError::Zstd)
}

fn decompress(dictionary: Option<&[u8]>, data: &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
    let mut decompressor = match dictionary {
        Some(dictionary) => zstd::bulk::Decompressor::with_dictionary(dictionary),
        None => zstd::bulk::Decompressor::new(),
    }
    .map_err(CodecError::Zstd)?;
    let out = decompressor
        .decompress(data, len)
        .map_err(CodecError::Zstd)?;
    if out.len() != len {
        return Err(CodecError::LengthMismatch {
            declared: len as u64,
            actual: out.len(),
        });
    }
    Ok(out)
}

fn read_len(input: &mut &[u8]) -> Result<usize, CodecError> {
    let len = read_varint(input)?;
    if len > MAX_DECODED_LEN {
        return Err(CodecError::TooLarge(len));
    }
    // At most MAX_DECODED_LEN, which fits in usize.
    Ok(len as usize)
}

/// LEB128: seven bits a byte, low bits first, high bit set on all but the last.
fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn read_varint(input: &mut &[u8]) -> Result<u64, CodecError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = input.split_first().ok_or(CodecError::TruncatedVarint)?;
        *input = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(CodecError::TruncatedVarint)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Encodes a whole history the way the store does: each revision against
    /// the previous one, keyframes at the fixed positions.
    fn encode_all(specs: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut previous: Option<&[u8]> = None;
        let mut payloads = Vec::new();
        for (index, spec) in specs.iter().enumerate() {
            payloads.push(encode(index as u64 + 1, previous, spec).expect("encode"));
            previous = Some(spec);
        }
        payloads
    }

    /// Decodes revision `n` (1-based) from the nearest keyframe.
    fn decode_revision(payloads: &[Vec<u8>], n: usize) -> Vec<u8> {
        let start = (0..n)
            .rev()
            .find(|&i| is_keyframe(&payloads[i]).expect("tag"))
            .expect("a keyframe before every revision");
        decode_chain(payloads[start..n].iter().map(Vec::as_slice)).expect("decode chain")
    }

    fn assert_roundtrip(specs: &[Vec<u8>]) {
        let payloads = encode_all(specs);
        for n in 1..=specs.len() {
            assert_eq!(decode_revision(&payloads, n), specs[n - 1], "revision {n}");
        }
    }

    fn pod_spec(edit: usize) -> Vec<u8> {
        let spec = json!({
            "availability": "best-effort",
            "restartPolicy": "Always",
            "runtime": "runc",
            "containers": [{
                "name": "web",
                "image": format!("registry.local/team-a/web:1.{}", edit / 2),
                "command": ["httpd", "-f", "-p", "8080", "-h", "/srv/www"],
                "env": {
                    "GREETING": "hello",
                    "LOG_LEVEL": "info",
                    "BUILD": format!("build-{}", edit - edit / 2),
                    "DATABASE_URL": "postgres://db.team-a.svc:5432/web",
                },
                "ports": [8080, 8443],
                "resources": {"cpu": "250m", "memory": "128Mi"},
                "readiness": {"http": {"port": 8080, "path": "/healthz"}},
                "mounts": [{"volume": "data", "path": "/data"}],
            }],
            "volumes": [{"name": "data", "local": {"name": "web-data"}}],
        });
        serde_json::to_vec(&spec).expect("serialize")
    }

    #[test]
    fn thousand_one_field_edits_store_under_five_percent() {
        // Edit 0 is the original; each next edit changes one field (the image
        // tag and a BUILD env value take turns).
        let specs: Vec<Vec<u8>> = (0..=1000).map(pod_spec).collect();
        for pair in specs.windows(2) {
            assert_ne!(pair[0], pair[1], "every edit changes the spec");
        }
        let payloads = encode_all(&specs);
        for n in 1..=specs.len() {
            assert_eq!(decode_revision(&payloads, n), specs[n - 1], "revision {n}");
        }
        let raw: usize = specs.iter().map(Vec::len).sum();
        let stored: usize = payloads.iter().map(Vec::len).sum();
        let ratio = stored as f64 / raw as f64;
        println!(
            "codec: {} revisions of a {}-byte pod spec: {stored} bytes stored for {raw} raw ({:.2}%)",
            specs.len(),
            specs[0].len(),
            ratio * 100.0
        );
        assert!(specs[0].len() >= 300, "the pod spec is realistic");
        assert!(ratio <= 0.05, "ratio {ratio} is above 5%");
    }

    #[test]
    fn edits_at_every_position_roundtrip() {
        let base = br#"{"a":1,"b":"middle","c":[1,2,3]}"#.to_vec();
        let mut specs = vec![base.clone()];
        let mut push = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut next = specs.last().expect("not empty").clone();
            edit(&mut next);
            specs.push(next);
        };
        push(&|s| s.insert(0, b' ')); // insert at start
        push(&|s| s.push(b' ')); // insert at end
        push(&|s| {
            let mid = s.len() / 2;
            s.splice(mid..mid, b"inserted".iter().copied());
        });
        push(&|s| {
            let mid = s.len() / 2;
            s.drain(mid..mid + 4);
        });
        push(&|s| s[0] = b'X'); // change at start
        push(&|s| {
            let last = s.len() - 1;
            s[last] = b'Y';
        });
        push(&|_| {}); // identical consecutive specs
        push(&|_| {});
        push(&|s| s.clear()); // empty
        push(&|_| {});
        push(&|s| s.extend_from_slice(&base)); // back from empty
        push(&|s| s.truncate(3));
        push(&|s| *s = s.repeat(50)); // repetitive growth
        assert_roundtrip(&specs);
    }

    #[test]
    fn pseudo_random_edits_roundtrip_across_keyframes() {
        // A small deterministic generator keeps the test reproducible.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |bound: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % bound.max(1) as u64) as usize
        };
        let mut spec: Vec<u8> = (0..400).map(|i| b'a' + (i % 26) as u8).collect();
        let mut specs = vec![spec.clone()];
        for _ in 0..200 {
            match next(4) {
                0 => {
                    let at = next(spec.len() + 1);
                    let len = next(20);
                    let bytes: Vec<u8> = (0..len).map(|_| next(256) as u8).collect();
                    spec.splice(at..at, bytes);
                }
                1 if !spec.is_empty() => {
                    let at = next(spec.len());
                    let end = (at + next(30)).min(spec.len());
                    spec.drain(at..end);
                }
                2 if !spec.is_empty() => {
                    let at = next(spec.len());
                    spec[at] = next(256) as u8;
                }
                _ => {}
            }
            specs.push(spec.clone());
        }
        assert_roundtrip(&specs);
    }

    #[test]
    fn keyframes_sit_at_fixed_positions() {
        assert!(is_keyframe_revision(1));
        assert!(!is_keyframe_revision(2));
        assert!(!is_keyframe_revision(KEYFRAME_INTERVAL));
        assert!(is_keyframe_revision(KEYFRAME_INTERVAL + 1));
        assert!(is_keyframe_revision(2 * KEYFRAME_INTERVAL + 1));
        let payload = encode(5, None, b"{}").expect("encode");
        assert!(
            is_keyframe(&payload).expect("tag"),
            "no base means keyframe"
        );
    }

    #[test]
    fn both_delta_forms_are_chosen_when_smaller() {
        // One small change: the patch wins.
        let a = pod_spec(10);
        let b = pod_spec(11);
        assert_eq!(encode_delta(&a, &b).expect("encode")[0], tag::DELTA_PATCH);
        // Scattered changes at both ends: the dictionary frame wins.
        let long: Vec<u8> = (0..2000u32)
            .flat_map(|i| format!("{i},").into_bytes())
            .collect();
        let mut scattered = long.clone();
        scattered[1] = b'#';
        let last = scattered.len() - 2;
        scattered[last] = b'#';
        let delta = encode_delta(&long, &scattered).expect("encode");
        assert_eq!(delta[0], tag::DELTA_ZSTD);
        assert_eq!(decode(&delta, Some(&long)).expect("decode"), scattered);
        // Incompressible keyframes stay raw.
        let noise: Vec<u8> = (0..64u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        assert_eq!(
            encode_keyframe(&noise).expect("encode")[0],
            tag::KEYFRAME_RAW
        );
        assert_eq!(
            encode_keyframe(&long).expect("encode")[0],
            tag::KEYFRAME_ZSTD
        );
    }

    #[test]
    fn varints_roundtrip() {
        for value in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            write_varint(&mut buf, value);
            let mut input = buf.as_slice();
            assert_eq!(read_varint(&mut input).expect("read"), value);
            assert!(input.is_empty());
        }
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        let base = pod_spec(1);
        let keyframe = encode_keyframe(&base).expect("encode");
        let delta = encode_delta(&base, &pod_spec(2)).expect("encode");
        let dict_delta =
            encode_delta(b"0123456789", b"abcdefghij0123456789abcdefghij").expect("encode");
        assert!(matches!(decode(&[], None), Err(CodecError::Empty)));
        assert!(matches!(
            decode(&[9, 1, 2], None),
            Err(CodecError::UnknownTag(9))
        ));
        assert!(matches!(decode(&delta, None), Err(CodecError::MissingBase)));
        assert!(matches!(
            decode(&[tag::DELTA_PATCH, 0x80], Some(b"x")),
            Err(CodecError::TruncatedVarint)
        ));
        assert!(matches!(
            decode(&[tag::DELTA_PATCH, 5, 5], Some(b"short")),
            Err(CodecError::PatchOutOfRange { .. })
        ));
        let huge = [
            tag::DELTA_PATCH,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0x01,
            1,
        ];
        assert!(decode(&huge, Some(b"x")).is_err());
        assert!(matches!(
            decode(&[tag::KEYFRAME_ZSTD, 0xff, 0xff, 0xff, 0xff, 0x7f], None),
            Err(CodecError::TooLarge(_))
        ));
        assert!(matches!(
            decode_chain([delta.as_slice()]),
            Err(CodecError::ChainStartsWithDelta)
        ));
        assert!(matches!(
            decode_chain(std::iter::empty()),
            Err(CodecError::Empty)
        ));
        // Truncating or flipping bytes anywhere must never panic.
        for payload in [&keyframe, &delta, &dict_delta] {
            for cut in 0..payload.len() {
                let _ = decode(&payload[..cut], Some(&base));
            }
            for at in 0..payload.len() {
                let mut flipped = payload.clone();
                flipped[at] ^= 0x5a;
                let _ = decode(&flipped, Some(&base));
            }
        }
        // A wrong declared length on a compressed keyframe is caught.
        if keyframe[0] == tag::KEYFRAME_ZSTD {
            let mut wrong = keyframe.clone();
            wrong[1] = wrong[1].wrapping_add(1);
            assert!(decode(&wrong, None).is_err());
        }
    }
}

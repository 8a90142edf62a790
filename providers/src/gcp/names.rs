//! Names GCE accepts, derived deterministically from Switchyard's keys: the instance name, label
//! values, and the `requestId` UUID of an insert, so that a retried or repeated launch of one
//! instance key names the same instance.

/// FNV-1a, 64 bits, from `seed`: a stable hash (not for security) for names and request ids.
fn fnv1a(seed: u64, parts: &[&str]) -> u64 {
    let mut h = seed;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

const SEED_A: u64 = 0xcbf2_9ce4_8422_2325;
const SEED_B: u64 = 0x8422_2325_cbf2_9ce4;

/// Lowercase letters, digits and `-`: everything else becomes `-`.
fn slug(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(max)
        .collect();
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// The instance's name: `sy-{readable part of the key}-{hash of cluster and key}`, matching
/// GCE's `[a-z]([-a-z0-9]{0,61}[a-z0-9])?`.
pub fn instance_name(cluster: &str, key: &str) -> String {
    let readable = slug(key, 40);
    let hash = fnv1a(SEED_A, &[cluster, key]);
    if readable.is_empty() {
        format!("sy-{hash:016x}")
    } else {
        format!("sy-{readable}-{hash:016x}")
    }
}

/// A label value for `value`: itself when GCE allows it (lowercase letters, digits, `_`, `-`, at
/// most 63 characters), else a readable prefix and a hash, so distinct values stay distinct.
pub fn label_value(value: &str) -> String {
    let allowed = value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if allowed {
        return value.to_owned();
    }
    let hash = fnv1a(SEED_A, &[value]);
    let readable = slug(value, 46);
    format!("{readable}-{hash:016x}")
}

/// A UUID (version 8, "custom") derived from `parts`: the `requestId` of an insert, the same
/// for every retry of one launch.
pub fn request_id(parts: &[&str]) -> uuid::Uuid {
    let a = fnv1a(SEED_A, parts).to_be_bytes();
    let b = fnv1a(SEED_B, parts).to_be_bytes();
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a);
    bytes[8..].copy_from_slice(&b);
    bytes[6] = (bytes[6] & 0x0f) | 0x80; // version 8
    bytes[8] = (bytes[8] & 0x3f) | 0x80; // RFC 4122 variant
    uuid::Uuid::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid_name(n: &str) -> bool {
        let b = n.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_lowercase()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && !n.ends_with('-')
    }

    #[test]
    fn names_are_valid_stable_and_distinct() {
        for key in ["contract-a", "Job_42/Node 1", "", &"x".repeat(200), "ÜBER"] {
            let n = instance_name("prod", key);
            assert!(valid_name(&n), "{key:?} → {n}");
            assert_eq!(n, instance_name("prod", key));
            assert_ne!(n, instance_name("staging", key));
        }
        assert_ne!(instance_name("c", "a-b"), instance_name("c", "a_b"));
    }

    #[test]
    fn label_values_follow_the_rules_and_keep_keys_apart() {
        assert_eq!(label_value("contract-a"), "contract-a");
        for v in ["Upper", "a/b", &"k".repeat(80)] {
            let l = label_value(v);
            assert!(l.len() <= 63, "{l}");
            assert!(
                l.bytes().all(|b| b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b == b'-'
                    || b == b'_')
            );
        }
        assert_ne!(label_value("A"), label_value("a"));
    }

    #[test]
    fn request_ids_are_uuids_stable_per_launch() {
        let a = request_id(&["insert", "c", "k", "us-central1-a"]);
        assert_eq!(a, request_id(&["insert", "c", "k", "us-central1-a"]));
        assert_ne!(a, request_id(&["insert", "c", "k", "us-central1-b"]));
        assert!(!a.is_nil());
        assert_eq!(a.get_version_num(), 8);
    }
}

//! Azure resource names derived from the cluster and the instance key, so a relaunch of one
//! key finds (or re-`PUT`s) the same VM, NIC and disk.
//!
//! `sy-{slug}-{hash}`: `slug` is the key in lowercase letters, digits and single hyphens (at
//! most 40 characters), `hash` 12 hex digits of FNV-1a over the cluster and the full key, so
//! keys that slug alike, and two clusters in one resource group, never share a name. The name
//! is at most 56 characters: valid as a Linux VM name and host name (1–64, letters, digits and
//! hyphens, not ending with a hyphen), and with `-nic` / `-osdisk` as NIC and disk names (≤ 80).

/// The names of one instance's resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    pub vm: String,
    pub nic: String,
    pub disk: String,
}

const SLUG_MAX: usize = 40;

impl Names {
    pub fn of(cluster: &str, instance_key: &str) -> Names {
        let mut slug = String::new();
        for c in instance_key.chars() {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                slug.push(c);
            } else if !slug.is_empty() && !slug.ends_with('-') {
                slug.push('-');
            }
            if slug.len() >= SLUG_MAX {
                break;
            }
        }
        let slug = slug.trim_end_matches('-');
        let hash = fnv1a(&[cluster.as_bytes(), b"\0", instance_key.as_bytes()]) & 0xffff_ffff_ffff;
        let vm = if slug.is_empty() {
            format!("sy-{hash:012x}")
        } else {
            format!("sy-{slug}-{hash:012x}")
        };
        Names {
            nic: format!("{vm}-nic"),
            disk: format!("{vm}-osdisk"),
            vm,
        }
    }
}

/// Whether `name` can be a VM name in a resource path (what `terminate` accepts).
pub fn is_vm_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// 64-bit FNV-1a: stable across builds and platforms (unlike `std`'s hasher).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_deterministic_valid_and_distinct() {
        let a = Names::of("prod", "job-42/node-0");
        assert_eq!(a, Names::of("prod", "job-42/node-0"));
        assert!(a.vm.starts_with("sy-job-42-node-0-"), "{a:?}");
        assert_eq!(a.nic, format!("{}-nic", a.vm));
        assert_eq!(a.disk, format!("{}-osdisk", a.vm));
        assert_ne!(a.vm, Names::of("staging", "job-42/node-0").vm);
        assert_ne!(a.vm, Names::of("prod", "job-42.node-0").vm);
        let long = Names::of("prod", &"X".repeat(500));
        let odd = Names::of("prod", "///");
        for n in [&a, &long, &odd] {
            assert!(n.vm.len() <= 64 && is_vm_name(&n.vm), "{n:?}");
            assert!(!n.vm.ends_with('-') && n.nic.len() <= 80 && n.disk.len() <= 80);
            assert!(
                n.vm.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            );
        }
        assert!(!is_vm_name("a/b") && !is_vm_name("") && !is_vm_name("a?b"));
    }

    #[test]
    fn the_hash_is_fnv1a() {
        // Reference values of 64-bit FNV-1a.
        assert_eq!(fnv1a(&[b""]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
    }
}

//! GPU model names. Switchyard uses SkyPilot's catalogue names (`H100`, `A100`, `A100-80GB`,
//! `L4`, `T4`, `RTXPRO6000`…): a name is a model a job can ask for, and memory variants that
//! behave differently get their own name. Everything that reports a GPU (NVML on an agent,
//! `--fake-gpus`, a cloud catalogue) goes through [`normalize`] so that the same card always has
//! the same name.

/// Models whose memory variants are distinct catalogue names: (base, memory GB, name).
const MEMORY_VARIANTS: &[(&str, u32, &str)] =
    &[("A100", 80, "A100-80GB"), ("V100", 32, "V100-32GB")];

/// Normalises a raw GPU name (`NVIDIA A100-SXM4-80GB`, `Tesla T4`, `H100-80GB`, `h100`) to the
/// catalogue name. `memory_gb`, when known, picks the memory variant.
pub fn normalize(raw: &str, memory_gb: Option<u32>) -> String {
    let mut s = raw.trim().to_ascii_uppercase();
    for prefix in ["NVIDIA ", "TESLA ", "GEFORCE ", "QUADRO "] {
        if let Some(rest) = s.strip_prefix(prefix) {
            s = rest.to_string();
        }
    }
    // Memory written in the name: "A100-SXM4-80GB", "H100 80GB HBM3", "A100-80GB".
    let mut named_memory = None;
    let mut kept = Vec::new();
    for token in s.split([' ', '-', '_']).filter(|t| !t.is_empty()) {
        if let Some(gb) = token.strip_suffix("GB").and_then(|n| n.parse::<u32>().ok()) {
            named_memory = Some(gb);
            continue;
        }
        // Form factors and memory technologies are not part of the model.
        if matches!(
            token,
            "SXM" | "SXM2" | "SXM4" | "SXM5" | "PCIE" | "NVL" | "HBM2" | "HBM2E" | "HBM3" | "HBM3E"
        ) {
            continue;
        }
        kept.push(token);
    }
    // "RTX PRO 6000" → "RTXPRO6000"; "H100" stays.
    let base: String = kept.concat();
    let memory = memory_gb.or(named_memory);
    for (variant_base, gb, name) in MEMORY_VARIANTS {
        if base == *variant_base && memory.is_some_and(|m| m >= *gb) {
            return (*name).to_string();
        }
    }
    base
}

/// Parses `--fake-gpus` style declarations: `4xH100-80GB`, `2xL4`, `8xA100-80GB`.
/// Returns (count, model, memory GB). Memory defaults from [`typical_memory_gb`].
pub fn parse_declaration(decl: &str) -> Option<(u32, String, u32)> {
    let (count, name) = decl.trim().split_once(['x', 'X'])?;
    let count: u32 = count.parse().ok().filter(|c| *c > 0 && *c <= 64)?;
    if name.is_empty() {
        return None;
    }
    let named_memory = name.rsplit(['-', '_']).next().and_then(|t| {
        t.to_ascii_uppercase()
            .strip_suffix("GB")
            .and_then(|n| n.parse::<u32>().ok())
    });
    let model = normalize(name, named_memory);
    let memory = named_memory.or_else(|| typical_memory_gb(&model))?;
    Some((count, model, memory))
}

/// Memory of the common configuration of a model, for declarations that do not say.
pub fn typical_memory_gb(model: &str) -> Option<u32> {
    Some(match model {
        "B200" => 180,
        "B300" => 270,
        "H200" => 141,
        "H100" => 80,
        "A100-80GB" => 80,
        "A100" => 40,
        "L40S" | "L40" | "A40" | "A6000" => 48,
        "L4" | "A10G" | "A10" => 24,
        "T4" | "V100" => 16,
        "V100-32GB" => 32,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_what_nvml_and_catalogues_say() {
        let cases: &[(&str, Option<u32>, &str)] = &[
            ("NVIDIA H100 80GB HBM3", None, "H100"),
            ("NVIDIA H200", Some(141), "H200"),
            ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
            ("NVIDIA A100-SXM4-40GB", None, "A100"),
            ("A100-80GB", None, "A100-80GB"),
            ("A100", Some(80), "A100-80GB"),
            ("Tesla T4", Some(15), "T4"),
            ("NVIDIA L4", None, "L4"),
            ("h100", None, "H100"),
            ("NVIDIA RTX PRO 6000", None, "RTXPRO6000"),
            ("H100-80GB", None, "H100"),
        ];
        for (raw, mem, want) in cases {
            assert_eq!(normalize(raw, *mem), *want, "{raw}");
        }
    }

    #[test]
    fn parses_fake_gpu_declarations() {
        assert_eq!(
            parse_declaration("4xH100-80GB"),
            Some((4, "H100".into(), 80))
        );
        assert_eq!(
            parse_declaration("8xA100-80GB"),
            Some((8, "A100-80GB".into(), 80))
        );
        assert_eq!(parse_declaration("2xL4"), Some((2, "L4".into(), 24)));
        assert_eq!(parse_declaration("0xH100"), None);
        assert_eq!(parse_declaration("4x"), None);
        assert_eq!(parse_declaration("H100"), None);
        assert_eq!(parse_declaration("3xMYSTERY"), None);
        assert_eq!(
            parse_declaration("3xMYSTERY-12GB"),
            Some((3, "MYSTERY".into(), 12))
        );
    }
}

//! GPU and accelerator model names, and who makes them. Switchyard uses SkyPilot's catalogue
//! names (`H100`, `A100`, `A100-80GB`, `L4`, `T4`, `RTXPRO6000`, `MI300X`…): a name is a model a
//! job can ask for, and memory variants that behave differently get their own name. Everything
//! that reports an accelerator (NVML or `amd-smi` on an agent, `--fake-gpus`, a cloud catalogue)
//! goes through [`normalize`] so that the same card always has the same name.
//!
//! Accelerators that are not GPUs have names of their own: `TPU-v2` … `TPU-v6e` (a TPU
//! generation; `v5litepod` is `TPU-v5e`), `Trainium`, `Trainium2`, `Inferentia`, `Inferentia2`,
//! `Gaudi`, `Gaudi2`, `Gaudi3` (Habana's `HL-205` is a Gaudi, `HL-225` a Gaudi2).
//!
//! [`vendor`] says who makes a model (`nvidia`, `amd`, `intel`, `google`, `aws`) and [`is_gpu`]
//! whether it is a GPU. A job's `resources.accelerator` ([`Accelerator`]) is judged against them
//! by [`accepts`]: a job that names no accelerator runs on any GPU (NVIDIA, AMD or Intel), never
//! on a TPU, Trainium, Inferentia or Gaudi, whose software stacks differ, unless its
//! `gpu_models` name one.

use serde::{Deserialize, Serialize};

/// Models whose memory variants are distinct catalogue names: (base, memory GB, name).
const MEMORY_VARIANTS: &[(&str, u32, &str)] =
    &[("A100", 80, "A100-80GB"), ("V100", 32, "V100-32GB")];

/// Normalises a raw GPU name (`NVIDIA A100-SXM4-80GB`, `Tesla T4`, `H100-80GB`, `h100`) to the
/// catalogue name. `memory_gb`, when known, picks the memory variant.
pub fn normalize(raw: &str, memory_gb: Option<u32>) -> String {
    let mut s = raw.trim().to_ascii_uppercase();
    for prefix in [
        "NVIDIA ",
        "TESLA ",
        "GEFORCE ",
        "QUADRO ",
        "AMD ",
        "INSTINCT ",
        "INTEL ",
        "HABANA ",
        "AWS ",
        "GOOGLE ",
    ] {
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
            "SXM"
                | "SXM2"
                | "SXM4"
                | "SXM5"
                | "PCIE"
                | "NVL"
                | "OAM"
                | "HBM2"
                | "HBM2E"
                | "HBM3"
                | "HBM3E"
        ) {
            continue;
        }
        kept.push(token);
    }
    // "RTX PRO 6000" → "RTXPRO6000"; "H100" stays.
    let base: String = kept.concat();
    if let Some(name) = accelerator_name(&base) {
        return name;
    }
    let memory = memory_gb.or(named_memory);
    for (variant_base, gb, name) in MEMORY_VARIANTS {
        if base == *variant_base && memory.is_some_and(|m| m >= *gb) {
            return (*name).to_string();
        }
    }
    base
}

/// The name of an accelerator that is not an NVIDIA or AMD card, from the upper-case,
/// concatenated tokens [`normalize`] works on: `TPUV5LITEPOD` → `TPU-v5e`, `TRAINIUM2` →
/// `Trainium2`, `HL205` → `Gaudi`. `None` for everything else.
fn accelerator_name(base: &str) -> Option<String> {
    if let Some(generation) = base.strip_prefix("TPUV") {
        let generation = generation.to_ascii_lowercase();
        let generation = match generation.as_str() {
            "5lite" | "5litepod" => "5e",
            g => g,
        };
        return (!generation.is_empty()).then(|| format!("TPU-v{generation}"));
    }
    let fixed = match base {
        "TRAINIUM" | "TRAINIUM1" => "Trainium",
        "TRAINIUM2" => "Trainium2",
        "INFERENTIA" | "INFERENTIA1" => "Inferentia",
        "INFERENTIA2" => "Inferentia2",
        "GAUDI" | "GAUDI1" | "HL205" => "Gaudi",
        "GAUDI2" | "HL225" => "Gaudi2",
        "GAUDI3" | "HL325" => "Gaudi3",
        _ => return None,
    };
    Some(fixed.to_string())
}

/// Who makes an accelerator. Lower case on the wire (`nvidia`, `amd`, `intel`, `google`,
/// `aws`), as the agent's inventory reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Nvidia,
    Amd,
    Intel,
    Google,
    Aws,
}

impl Vendor {
    pub const ALL: [Vendor; 5] = [
        Vendor::Nvidia,
        Vendor::Amd,
        Vendor::Intel,
        Vendor::Google,
        Vendor::Aws,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Intel => "intel",
            Vendor::Google => "google",
            Vendor::Aws => "aws",
        }
    }

    /// `nvidia`, `amd`… in any case; `None` for anything else.
    pub fn parse(text: &str) -> Option<Vendor> {
        Vendor::ALL
            .into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(text.trim()))
    }
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who makes `model` (a name as [`normalize`] writes it, in any case). A name no rule knows is
/// taken for NVIDIA's, as every GPU was before vendors were told apart; [`known_vendor`] says
/// whether a rule matched.
pub fn vendor(model: &str) -> Vendor {
    known_vendor(model).unwrap_or(Vendor::Nvidia)
}

/// [`vendor`], or `None` for a name no rule knows.
pub fn known_vendor(model: &str) -> Option<Vendor> {
    let m = model.trim();
    let digit_at = |i: usize| m.as_bytes().get(i).is_some_and(u8::is_ascii_digit);
    let starts_with = |prefix: &str| {
        m.as_bytes()
            .get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
    };
    if starts_with("TPU") {
        return Some(Vendor::Google);
    }
    if starts_with("TRAINIUM") || starts_with("INFERENTIA") {
        return Some(Vendor::Aws);
    }
    // Gaudi; Data Center GPU Max (`MAX1550`), Flex and Arc.
    if starts_with("GAUDI")
        || (starts_with("HL") && digit_at(2))
        || (starts_with("MAX") && digit_at(3))
        || starts_with("FLEX")
        || starts_with("ARC")
    {
        return Some(Vendor::Intel);
    }
    // Instinct (`MI25`, `MI300X`), Radeon and Radeon Pro (`V520`, `V710`).
    if (starts_with("MI") && digit_at(2))
        || starts_with("RADEON")
        || m.eq_ignore_ascii_case("V520")
        || m.eq_ignore_ascii_case("V710")
    {
        return Some(Vendor::Amd);
    }
    // A letter and a number (`H100`, `A10G`, `T4G`, `L40S`, `B200`, `V100-32GB`, `M60`, `K80`,
    // `P100`), Grace superchips (`GH200`, `GB200`), RTX, Titan.
    let letter_number = matches!(
        m.as_bytes().first().map(u8::to_ascii_uppercase),
        Some(b'A' | b'B' | b'H' | b'K' | b'L' | b'M' | b'P' | b'T' | b'V')
    ) && digit_at(1);
    if letter_number
        || ((starts_with("GH") || starts_with("GB")) && digit_at(2))
        || starts_with("RTX")
        || starts_with("TITAN")
    {
        return Some(Vendor::Nvidia);
    }
    None
}

/// Whether `model` is a GPU (NVIDIA, AMD, or an Intel GPU), as against a TPU, Trainium,
/// Inferentia or Gaudi.
pub fn is_gpu(model: &str) -> bool {
    match vendor(model) {
        Vendor::Nvidia | Vendor::Amd => true,
        Vendor::Google | Vendor::Aws => false,
        Vendor::Intel => {
            let m = model.trim().as_bytes();
            let starts_with = |prefix: &[u8]| {
                m.get(..prefix.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
            };
            !(starts_with(b"GAUDI") || starts_with(b"HL"))
        }
    }
}

/// The accelerators a job accepts (`resources.accelerator`). Absent from a spec (`None` where
/// it is held) means any GPU: see [`accepts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accelerator {
    Nvidia,
    Amd,
    Intel,
    Google,
    Aws,
    /// Every accelerator, GPU or not.
    Any,
}

impl Accelerator {
    pub const NAMES: &'static str = "nvidia, amd, intel, google, aws or any";

    pub fn as_str(self) -> &'static str {
        match self.vendor() {
            Some(v) => v.as_str(),
            None => "any",
        }
    }

    /// `nvidia`, `amd`, `intel`, `google`, `aws` or `any`, in any case.
    pub fn parse(text: &str) -> Option<Accelerator> {
        if text.trim().eq_ignore_ascii_case("any") {
            return Some(Accelerator::Any);
        }
        Vendor::parse(text).map(Accelerator::from)
    }

    /// The one vendor it asks for; `None` for `any`.
    pub fn vendor(self) -> Option<Vendor> {
        Some(match self {
            Accelerator::Nvidia => Vendor::Nvidia,
            Accelerator::Amd => Vendor::Amd,
            Accelerator::Intel => Vendor::Intel,
            Accelerator::Google => Vendor::Google,
            Accelerator::Aws => Vendor::Aws,
            Accelerator::Any => return None,
        })
    }
}

impl From<Vendor> for Accelerator {
    fn from(v: Vendor) -> Accelerator {
        match v {
            Vendor::Nvidia => Accelerator::Nvidia,
            Vendor::Amd => Accelerator::Amd,
            Vendor::Intel => Accelerator::Intel,
            Vendor::Google => Accelerator::Google,
            Vendor::Aws => Accelerator::Aws,
        }
    }
}

/// Whether a job with `accelerator` and `gpu_models` may run on `model`:
/// - `gpu_models` not empty: `model` is one of them and, when `accelerator` names a vendor, of
///   that vendor (a list may name a TPU or a Trainium without `accelerator`);
/// - otherwise, `accelerator` absent: `model` is a GPU; `any`: every model; a vendor: that
///   vendor's models.
pub fn accepts(accelerator: Option<Accelerator>, gpu_models: &[String], model: &str) -> bool {
    let vendor_ok = || match accelerator.and_then(Accelerator::vendor) {
        Some(v) => vendor(model) == v,
        None => true,
    };
    if !gpu_models.is_empty() {
        return gpu_models.iter().any(|m| m.eq_ignore_ascii_case(model)) && vendor_ok();
    }
    match accelerator {
        None => is_gpu(model),
        Some(Accelerator::Any) => true,
        Some(_) => vendor_ok(),
    }
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
        "MI300X" => 192,
        // Per chip: TPU v2 has 8 GiB per TensorCore and two cores a chip.
        "TPU-v2" | "TPU-v5e" => 16,
        "TPU-v3" | "TPU-v4" | "TPU-v6e" => 32,
        "TPU-v5p" => 95,
        "Trainium" | "Inferentia2" | "Gaudi" => 32,
        "Trainium2" | "Gaudi2" => 96,
        "Gaudi3" => 128,
        "Inferentia" => 8,
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
            ("AMD Instinct MI300X", None, "MI300X"),
            ("AMD Instinct MI300X OAM", Some(192), "MI300X"),
            ("tpu-v5litepod", None, "TPU-v5e"),
            ("TPU-v5e", None, "TPU-v5e"),
            ("tpu-v4", None, "TPU-v4"),
            ("tpu-v6e", None, "TPU-v6e"),
            ("Trainium2", Some(96), "Trainium2"),
            ("AWS Trainium", None, "Trainium"),
            ("Inferentia2", None, "Inferentia2"),
            ("HL-205", Some(32), "Gaudi"),
            ("Intel Gaudi 3", None, "Gaudi3"),
        ];
        for (raw, mem, want) in cases {
            assert_eq!(normalize(raw, *mem), *want, "{raw}");
        }
    }

    #[test]
    fn accelerator_names_are_fixed_points_of_normalize() {
        for name in [
            "TPU-v2",
            "TPU-v3",
            "TPU-v4",
            "TPU-v5e",
            "TPU-v5p",
            "TPU-v6e",
            "Trainium",
            "Trainium2",
            "Inferentia",
            "Inferentia2",
            "Gaudi",
            "Gaudi2",
            "Gaudi3",
            "MI300X",
        ] {
            assert_eq!(normalize(name, None), name);
        }
    }

    #[test]
    fn vendors_and_kinds() {
        let cases: &[(&str, Vendor, bool)] = &[
            ("H100", Vendor::Nvidia, true),
            ("A100-80GB", Vendor::Nvidia, true),
            ("T4G", Vendor::Nvidia, true),
            ("GH200", Vendor::Nvidia, true),
            ("RTXPRO6000WS", Vendor::Nvidia, true),
            ("M60", Vendor::Nvidia, true),
            ("MI25", Vendor::Amd, true),
            ("mi300x", Vendor::Amd, true),
            ("h100", Vendor::Nvidia, true),
            ("gaudi2", Vendor::Intel, false),
            ("v520", Vendor::Amd, true),
            ("MAX1550", Vendor::Intel, true),
            ("Gaudi", Vendor::Intel, false),
            ("Gaudi3", Vendor::Intel, false),
            ("TPU-v5e", Vendor::Google, false),
            ("Trainium2", Vendor::Aws, false),
            ("Inferentia2", Vendor::Aws, false),
        ];
        for (model, want, gpu) in cases {
            assert_eq!(known_vendor(model), Some(*want), "{model}");
            assert_eq!(is_gpu(model), *gpu, "{model}");
        }
        // Unknown names stay NVIDIA GPUs, as before vendors were told apart.
        assert_eq!(known_vendor("MYSTERY"), None);
        assert_eq!(vendor("MYSTERY"), Vendor::Nvidia);
        assert!(is_gpu("MYSTERY"));
        for v in Vendor::ALL {
            assert_eq!(Vendor::parse(v.as_str()), Some(v));
            assert_eq!(
                Accelerator::parse(&v.as_str().to_uppercase()),
                Some(v.into())
            );
        }
        assert_eq!(Accelerator::parse("any"), Some(Accelerator::Any));
        assert_eq!(Accelerator::parse("gpu"), None);
    }

    #[test]
    fn what_a_job_accepts() {
        let none: &[String] = &[];
        // Absent: GPUs of every GPU vendor, no TPU, Trainium or Gaudi.
        for (model, ok) in [
            ("H100", true),
            ("MI300X", true),
            ("MAX1550", true),
            ("TPU-v5e", false),
            ("Trainium", false),
            ("Gaudi", false),
        ] {
            assert_eq!(accepts(None, none, model), ok, "{model}");
            assert!(accepts(Some(Accelerator::Any), none, model), "{model}");
        }
        assert!(accepts(Some(Accelerator::Google), none, "TPU-v5e"));
        assert!(!accepts(Some(Accelerator::Google), none, "H100"));
        assert!(accepts(Some(Accelerator::Amd), none, "MI300X"));
        assert!(!accepts(Some(Accelerator::Amd), none, "H100"));
        assert!(!accepts(Some(Accelerator::Nvidia), none, "MI300X"));
        // A list decides by itself, across vendors, and may name a TPU without `accelerator`.
        let list = vec!["h100".to_string(), "MI300X".into(), "TPU-v5e".into()];
        assert!(accepts(None, &list, "H100"));
        assert!(accepts(None, &list, "TPU-v5e"));
        assert!(!accepts(None, &list, "A100"));
        assert!(accepts(Some(Accelerator::Amd), &list, "MI300X"));
        assert!(!accepts(Some(Accelerator::Amd), &list, "H100"));
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
        assert_eq!(
            parse_declaration("8xTPU-v5e"),
            Some((8, "TPU-v5e".into(), 16))
        );
        assert_eq!(
            parse_declaration("8xMI300X"),
            Some((8, "MI300X".into(), 192))
        );
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

#!/usr/bin/env python3
"""Builds Switchyard's bundled GPU price catalogue.

Reads the SkyPilot-format price files in the shared data folder and writes

    providers/catalogue/gpu-catalogue.csv   one row per (provider, region, instance type)
    providers/catalogue/README.md           sources, method, row counts, caveats

Usage (from anywhere; paths are relative to the repository root):

    python3 scripts/build-catalogue.py [DATA_DIR]     # default: ../shared/data/catalog

Python 3 standard library only. The output is sorted and byte-for-byte deterministic: run it
twice, get the same files. Prices are handled as decimals, never floats.

Accelerators that are not GPUs are kept too, with a model name of their own (the same names
switchyard_core::gpu_model::normalize writes): GCP's single-host TPU slices (`TPU-v2` …
`TPU-v6e`, one row per slice type, its count the slice's chips) and AWS's Trainium, Trainium2,
Inferentia and Inferentia2. A job places on them only when it asks for their vendor or model
(`resources.accelerator`), so GPU jobs see the same catalogue as before.
"""

import ast
import csv
import io
import re
import sys
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "providers" / "catalogue"
COLUMNS = [
    "provider", "region", "instance_type", "gpu_model", "gpu_count", "gpu_memory_gb",
    "vcpus", "memory_gb", "on_demand_per_hour_usd", "spot_per_hour_usd",
]

# Accelerators that are neither GPUs nor kept: FPGAs (AWS f2). TPUs ("tpu-…") are read by
# Builder.tpu; AWS Trainium and Inferentia go through like GPUs.
NOT_KEPT = re.compile(r"^virtex", re.IGNORECASE)

# A GCP TPU slice: "tpu-v5litepod-8" -> generation "v5litepod", size 8.
TPU_SLICE = re.compile(r"^tpu-(v[0-9]+[a-z]*)-([0-9]+)$")
# TPU generations whose slice size counts TensorCores (two a chip) rather than chips, and the
# most chips one TPU VM host has (a bigger slice spans hosts: a gang, not one node).
TPU_CORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5litepod": 1, "v6e": 1}
TPU_CHIPS_PER_HOST = {"v2": 4, "v3": 4, "v4": 4, "v5p": 4, "v5litepod": 8, "v6e": 8}
# The source prices some TPU slices at exactly 700.0 whatever their size (1 chip and 8 chips
# alike, on-demand or spot, e.g. tpu-v6e in southamerica-*): a placeholder, not a price.
TPU_PLACEHOLDER_PRICE = Decimal("700")

# SkyPilot names that encode the machine rather than the card. The card of an a3-megagpu-8g is
# an H100 80GB (NVML on it says "NVIDIA H100 80GB HBM3"); the instance type keeps the difference.
NAME_ALIASES = {"H100-MEGA": "H100"}

# Per-GPU memory of a model's common configuration, for sources that do not give it (Azure).
# Keep in step with switchyard_core::gpu_model::typical_memory_gb; extra models added here.
TYPICAL_MEMORY_GB = {
    "B200": 180, "B300": 270, "H200": 141, "H100": 80, "A100-80GB": 80, "A100": 40,
    "L40S": 48, "L40": 48, "A40": 48, "A6000": 48, "L4": 24, "A10G": 24, "A10": 24,
    "T4": 16, "V100": 16, "V100-32GB": 32,
    "M60": 8, "MI25": 16, "MI300X": 192,
    # Per chip (Google's and AWS's published HBM figures). TPU v2: 8 GiB per TensorCore, two a
    # chip. Trainium2: 96 GiB a chip (trn2.48xlarge: 16 chips, 1.5 TiB); the source's 512 GiB
    # is not a chip's memory (see the data README) and is overridden.
    "TPU-v2": 16, "TPU-v3": 32, "TPU-v4": 32, "TPU-v5e": 16, "TPU-v5p": 95, "TPU-v6e": 32,
    "Trainium": 32, "Trainium2": 96, "Inferentia": 8, "Inferentia2": 32, "Gaudi": 32,
}
# Source memory figures that are not one device's.
MEMORY_OVERRIDES = {"Trainium2": 96}

# Azure's NC H100 v5 sizes carry the H100 NVL (94 GB), not the 80 GB SXM card of ND H100 v5.
AZURE_MEMORY_OVERRIDES = [(re.compile(r"^Standard_NCC?\d+ad(i)?s_H100_v5$"), 94)]

# GCP host families whose GPUs are fixed by the machine type: family -> GCP GPU row name.
# a2/a3/a4 name the GPU count in the type ("-8g"); g2 does not (see G2_GPU_COUNT).
GCP_FAMILIES = {
    "a2-highgpu": "A100",
    "a2-megagpu": "A100",
    "a2-ultragpu": "A100-80GB",
    "a3-highgpu": "H100",
    "a3-edgegpu": "H100",
    "a3-megagpu": "H100-MEGA",
    "a3-ultragpu": "H200",
    "a4-highgpu": "B200",
    "g2-standard": "L4",
}
# g2-standard-{vCPUs} -> L4 count (GCP's G2 machine table).
G2_GPU_COUNT = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}

# "Florida, US, NA": place (may be empty), ISO country code, continent code.
VAST_LOCATION = re.compile(r"^\s*([^,]*?)\s*,\s*([A-Z]{2})\s*,\s*([A-Z]{2})\s*$")


def normalize(raw, memory_gb):
    """Python port of switchyard_core::gpu_model::normalize; keep the two in step."""
    s = raw.strip().upper()
    for prefix in ["NVIDIA ", "TESLA ", "GEFORCE ", "QUADRO ", "AMD ", "INSTINCT ", "INTEL ",
                   "HABANA ", "AWS ", "GOOGLE "]:
        if s.startswith(prefix):
            s = s[len(prefix):]
    named_memory = None
    kept = []
    for token in re.split(r"[ \-_]", s):
        if not token:
            continue
        if token.endswith("GB") and token[:-2].isdigit():
            named_memory = int(token[:-2])
            continue
        if token in ("SXM", "SXM2", "SXM4", "SXM5", "PCIE", "NVL", "OAM",
                     "HBM2", "HBM2E", "HBM3", "HBM3E"):
            continue
        kept.append(token)
    base = "".join(kept)
    accelerator = accelerator_name(base)
    if accelerator is not None:
        return accelerator
    memory = memory_gb if memory_gb is not None else named_memory
    for variant_base, gb, name in [("A100", 80, "A100-80GB"), ("V100", 32, "V100-32GB")]:
        if base == variant_base and memory is not None and memory >= gb:
            return name
    return base


ACCELERATOR_NAMES = {
    "TRAINIUM": "Trainium", "TRAINIUM1": "Trainium", "TRAINIUM2": "Trainium2",
    "INFERENTIA": "Inferentia", "INFERENTIA1": "Inferentia", "INFERENTIA2": "Inferentia2",
    "GAUDI": "Gaudi", "GAUDI1": "Gaudi", "HL205": "Gaudi", "GAUDI2": "Gaudi2", "HL225": "Gaudi2",
    "GAUDI3": "Gaudi3", "HL325": "Gaudi3",
}


def accelerator_name(base):
    """Port of gpu_model::accelerator_name: "TPUV5LITEPOD" -> "TPU-v5e", "TRAINIUM2" ->
    "Trainium2"; None for GPUs."""
    if base.startswith("TPUV"):
        generation = base[len("TPUV"):].lower()
        generation = {"5lite": "5e", "5litepod": "5e"}.get(generation, generation)
        return f"TPU-v{generation}" if generation else None
    return ACCELERATOR_NAMES.get(base)


def round_half_up(x):
    return int(Decimal(str(x)) + Decimal("0.5")) if x is not None else None


def mib_to_gb(mib):
    return int(Decimal(mib) / 1024 + Decimal("0.5"))


def money(text):
    """A positive price as a Decimal, or None for empty, zero or malformed cells."""
    try:
        d = Decimal(text.strip())
    except Exception:
        return None
    return d if d.is_finite() and d > 0 else None


def price_part(text):
    """A price part that may be zero (GCP A4 host rows are 0.0: the B200 row carries the
    machine price), or None for empty and malformed cells."""
    try:
        d = Decimal(text.strip())
    except Exception:
        return None
    return d if d.is_finite() and d >= 0 else None


def fmt_money(d):
    return "" if d is None else format(d.normalize(), "f")


def gpu_count(text):
    """Whole GPU count >= 1, or None (fractional GPUs and malformed cells)."""
    try:
        d = Decimal(text.strip())
    except Exception:
        return None
    if not d.is_finite() or d < 1 or d != d.to_integral_value():
        return None
    return int(d)


def gpu_info(text):
    try:
        info = ast.literal_eval(text) if text.strip().startswith("{") else None
    except (ValueError, SyntaxError):
        return None
    return info if isinstance(info, dict) else None


def read(data, name):
    with open(data / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


class Builder:
    def __init__(self):
        self.rows = {}
        self.skipped = defaultdict(Counter)  # provider -> reason -> count
        self.source_rows = Counter()

    def skip(self, provider, reason, n=1):
        self.skipped[provider][reason] += n

    def add(self, provider, region, instance_type, raw_model, count, memory_gb, vcpus, memory,
            on_demand, spot):
        model = normalize(NAME_ALIASES.get(raw_model, raw_model), memory_gb)
        memory_gb = MEMORY_OVERRIDES.get(model, memory_gb)
        if memory_gb is None:
            memory_gb = TYPICAL_MEMORY_GB.get(model)
        if memory_gb is None:
            self.skip(provider, f"no GPU memory known for {raw_model}")
            return
        key = (provider, region, instance_type)
        row = {
            "provider": provider, "region": region, "instance_type": instance_type,
            "gpu_model": model, "gpu_count": count, "gpu_memory_gb": memory_gb,
            "vcpus": vcpus, "memory_gb": memory,
            "on_demand": on_demand, "spot": spot,
        }
        old = self.rows.get(key)
        if old is not None:
            # Only Vast can collide (two free-text locations, one slug): keep the cheaper.
            self.skip(provider, "duplicate (region, instance type) after normalising; kept the cheaper")
            if (old["on_demand"], old["gpu_model"]) <= (on_demand, model):
                return
        self.rows[key] = row

    # --- providers -------------------------------------------------------------------------

    def aws(self, data):
        rows = read(data, "aws-gpu-prices-by-region.csv")
        self.source_rows["aws"] = len(rows)
        for r in rows:
            name = r["AcceleratorName"]
            if NOT_KEPT.match(name):
                self.skip("aws", "FPGA (f2)")
                continue
            count = gpu_count(r["AcceleratorCount"])
            if count is None:
                self.skip("aws", "fractional GPU (g6f, gr6f)")
                continue
            on_demand = money(r["Price"])
            if on_demand is None:
                self.skip("aws", "no on-demand price")
                continue
            mem = r["GpuMemoryGiB"].strip()
            self.add("aws", r["Region"], r["InstanceType"], name, count,
                     round_half_up(Decimal(mem)) if mem else None,
                     round_half_up(Decimal(r["vCPUs"])), round_half_up(Decimal(r["MemoryGiB"])),
                     on_demand, money(r["SpotPriceMin"]))

    def gcp(self, data):
        rows = read(data, "gcp-vms.csv")
        self.source_rows["gcp"] = len(rows)
        gpus = {}  # (name, count, zone) -> row
        hosts = []
        tpus = []
        for r in rows:
            if r["InstanceType"]:
                hosts.append(r)
            elif r["AcceleratorName"].lower().startswith("tpu-"):
                tpus.append(r)
            else:
                gpus[(r["AcceleratorName"], r["AcceleratorCount"], r["AvailabilityZone"])] = r
        # Per (region, type): the summed offer of every zone that has both parts.
        zones = defaultdict(list)
        used_gpu_rows = set()
        for h in hosts:
            itype = h["InstanceType"]
            m = re.match(r"^([a-z0-9]+-[a-z]+)-(\d+)(g)?(-nolssd)?$", itype)
            family = m.group(1) if m else None
            if family not in GCP_FAMILIES:
                self.skip("gcp", "host row of an unknown machine family")
                continue
            count = int(m.group(2)) if m.group(3) else G2_GPU_COUNT.get(int(m.group(2)))
            if count is None:
                self.skip("gcp", "host row with unknown GPU count")
                continue
            key = (GCP_FAMILIES[family], str(count), h["AvailabilityZone"])
            g = gpus.get(key)
            if g is None:
                self.skip("gcp", "host row with no GPU row in its zone")
                continue
            used_gpu_rows.add(key)
            host_od, gpu_od = price_part(h["Price"]), price_part(g["Price"])
            if host_od is None or gpu_od is None or host_od + gpu_od <= 0:
                self.skip("gcp", "no on-demand price")
                continue
            host_spot, gpu_spot = price_part(h["SpotPrice"]), price_part(g["SpotPrice"])
            spot = None
            if host_spot is not None and gpu_spot is not None and host_spot + gpu_spot > 0:
                spot = host_spot + gpu_spot
            info = gpu_info(g["GpuInfo"]) or {}
            mib = ((info.get("Gpus") or [{}])[0].get("MemoryInfo") or {}).get("SizeInMiB")
            zones[(h["Region"], itype)].append({
                "model": g["AcceleratorName"], "count": count,
                "memory_gb": mib_to_gb(mib) if mib else None,
                "vcpus": round_half_up(Decimal(h["vCPUs"])),
                "memory": round_half_up(Decimal(h["MemoryGiB"])),
                "on_demand": host_od + gpu_od, "spot": spot,
            })
        for (name, count, zone), g in gpus.items():
            if (name, count, zone) in used_gpu_rows:
                continue
            if name in ("T4", "V100", "P4", "P100"):
                self.skip("gcp", "N1-attached GPU (T4, V100, P4, P100): no n1 host rows in the data")
            else:
                self.skip("gcp", "GPU row with no host row of its machine type in its zone")
        for (region, itype), offers in zones.items():
            on_demands = {o["on_demand"] for o in offers}
            if len(on_demands) > 1:
                print(f"warning: gcp {region} {itype}: on-demand differs between zones "
                      f"{sorted(on_demands)}; taking the lowest", file=sys.stderr)
            spots = [o["spot"] for o in offers if o["spot"] is not None]
            o = offers[0]
            self.add("gcp", region, itype, o["model"], o["count"], o["memory_gb"], o["vcpus"],
                     o["memory"], min(on_demands), min(spots) if spots else None)
        self.tpu(tpus)

    def tpu(self, rows):
        """GCP TPU rows: one per (slice type, zone), priced per slice. A single-host slice
        becomes a row per (region, slice type) whose count is its chips: `tpu-v5litepod-8` is
        8 × TPU-v5e, `tpu-v4-8` (8 TensorCores) 4 × TPU-v4. Slices bigger than one TPU VM host
        are skipped (several hosts: a gang of nodes, not one). The source gives no host vCPUs or
        RAM: 0 (unknown, not checked by placement)."""
        zones = defaultdict(list)
        for r in rows:
            name = r["AcceleratorName"]
            m = TPU_SLICE.match(name.lower())
            generation = m.group(1) if m else None
            if generation not in TPU_CORES_PER_CHIP:
                self.skip("gcp", "TPU of an unknown generation or name")
                continue
            size = int(m.group(2))
            chips = size // TPU_CORES_PER_CHIP[generation]
            if chips < 1 or chips > TPU_CHIPS_PER_HOST[generation]:
                self.skip("gcp", "multi-host TPU slice (spans several TPU VM hosts)")
                continue
            on_demand = money(r["Price"])
            if on_demand is None or on_demand == TPU_PLACEHOLDER_PRICE:
                self.skip("gcp", "TPU slice with no on-demand price or the 700.0 placeholder")
                continue
            spot = money(r["SpotPrice"])
            if spot == TPU_PLACEHOLDER_PRICE:
                self.skip("gcp", "TPU spot price the 700.0 placeholder (row kept without it)")
                spot = None
            zones[(r["Region"], name)].append(
                {"generation": generation, "chips": chips, "on_demand": on_demand,
                 "spot": spot})
        for (region, name), offers in zones.items():
            on_demands = {o["on_demand"] for o in offers}
            if len(on_demands) > 1:
                print(f"warning: gcp {region} {name}: on-demand differs between zones "
                      f"{sorted(on_demands)}; taking the lowest", file=sys.stderr)
            spots = [o["spot"] for o in offers if o["spot"] is not None]
            o = offers[0]
            self.add("gcp", region, name, f"tpu-{o['generation']}", o["chips"], None, 0, 0,
                     min(on_demands), min(spots) if spots else None)

    def azure(self, data):
        rows = read(data, "azure-vms.csv")
        self.source_rows["azure"] = len(rows)
        for r in rows:
            count = gpu_count(r["AcceleratorCount"])
            if count is None:
                self.skip("azure", "fractional GPU (NV A10 v5 partitions)")
                continue
            on_demand = money(r["Price"])
            if on_demand is None:
                self.skip("azure", "no on-demand price")
                continue
            memory_gb = next((gb for pat, gb in AZURE_MEMORY_OVERRIDES
                              if pat.match(r["InstanceType"])), None)
            self.add("azure", r["Region"], r["InstanceType"], r["AcceleratorName"], count,
                     memory_gb, round_half_up(Decimal(r["vCPUs"])),
                     round_half_up(Decimal(r["MemoryGiB"])), on_demand, money(r["SpotPrice"]))

    def lambda_(self, data):
        rows = read(data, "lambda-vms.csv")
        self.source_rows["lambda"] = len(rows)
        for r in rows:
            count = gpu_count(r["AcceleratorCount"])
            on_demand = money(r["Price"])
            if count is None or on_demand is None:
                self.skip("lambda", "fractional GPU or no price")
                continue
            info = gpu_info(r["GpuInfo"]) or {}
            # Lambda's MemoryInfo.SizeInMiB is per GPU (TotalGpuMemoryInMiB repeats it).
            mib = ((info.get("Gpus") or [{}])[0].get("MemoryInfo") or {}).get("SizeInMiB")
            self.add("lambda", r["Region"], r["InstanceType"], r["AcceleratorName"], count,
                     mib_to_gb(mib) if mib else None, round_half_up(Decimal(r["vCPUs"])),
                     round_half_up(Decimal(r["MemoryGiB"])), on_demand, money(r["SpotPrice"]))

    def vast(self, data):
        rows = read(data, "vast-vms.csv")
        self.source_rows["vast"] = len(rows)
        for r in rows:
            region = vast_region(r["Region"])
            if region is None:
                self.skip("vast", "empty or unreadable location")
                continue
            count = gpu_count(r["AcceleratorCount"])
            on_demand = money(r["Price"])
            if count is None or on_demand is None:
                self.skip("vast", "fractional GPU or no price")
                continue
            info = gpu_info(r["GpuInfo"]) or {}
            # Vast's SizeInMiB is the whole offer's memory (all GPUs): divide by the count.
            total = info.get("TotalGpuMemoryInMiB")
            memory_gb = mib_to_gb(Decimal(total) / count) if total else None
            # SpotPrice is 0.00 throughout (Vast bids are not in the file): money() drops it.
            self.add("vast", region, r["InstanceType"], r["AcceleratorName"], count, memory_gb,
                     round_half_up(Decimal(r["vCPUs"])), round_half_up(Decimal(r["MemoryGiB"])),
                     on_demand, money(r["SpotPrice"]))


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def vast_region(text):
    """ "Florida, US, NA" -> "us-florida"; ", US, NA" -> "us"; anything else -> None."""
    m = VAST_LOCATION.match(text or "")
    if not m:
        return None
    place, country = slug(m.group(1)), m.group(2).lower()
    return f"{country}-{place}" if place else country


def render_csv(rows):
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    for key in sorted(rows):
        r = rows[key]
        w.writerow([r["provider"], r["region"], r["instance_type"], r["gpu_model"],
                    r["gpu_count"], r["gpu_memory_gb"], r["vcpus"], r["memory_gb"],
                    fmt_money(r["on_demand"]), fmt_money(r["spot"])])
    return out.getvalue()


def render_readme(b, data_arg):
    per = Counter(r["provider"] for r in b.rows.values())
    regions = defaultdict(set)
    spot = Counter()
    models = defaultdict(set)
    for r in b.rows.values():
        regions[r["provider"]].add(r["region"])
        models[r["provider"]].add(r["gpu_model"])
        if r["spot"] is not None:
            spot[r["provider"]] += 1
    providers = ["aws", "gcp", "azure", "lambda", "vast"]
    lines = [
        "| provider | source file | source rows | catalogue rows | regions | rows with spot | GPU models |",
        "|---|---|---|---|---|---|---|",
    ]
    files = {"aws": "aws-gpu-prices-by-region.csv", "gcp": "gcp-vms.csv",
             "azure": "azure-vms.csv", "lambda": "lambda-vms.csv", "vast": "vast-vms.csv"}
    for p in providers:
        lines.append(f"| {p} | {files[p]} | {b.source_rows[p]} | {per[p]} | {len(regions[p])} | "
                     f"{spot[p]} | {', '.join(sorted(models[p]))} |")
    lines.append(f"| **total** | | {sum(b.source_rows.values())} | {len(b.rows)} | "
                 f"{sum(len(v) for v in regions.values())} | {sum(spot.values())} | |")
    skipped = []
    for p in providers:
        for reason, n in sorted(b.skipped[p].items()):
            skipped.append(f"| {p} | {reason} | {n} |")
    above = ", ".join(
        f"{r['provider']} {r['region']} {r['instance_type']} {fmt_money(r['spot'])} > "
        f"{fmt_money(r['on_demand'])}"
        for _, r in sorted(b.rows.items())
        if r["spot"] is not None and r["spot"] > r["on_demand"]
    ) or "none"
    return README.format(
        data_arg=data_arg, counts="\n".join(lines), skipped="\n".join(skipped), above=above,
        total=len(b.rows),
    )


README = """# The bundled GPU price catalogue

`gpu-catalogue.csv` is Switchyard's built-in list of cloud GPU offers: one row per (provider,
region, instance type), with the whole node's on-demand and spot price per hour. The broker embeds
it (`include_str!` in `providers/src/catalogue.rs`) and turns rows into pools with
`pool_from_entry`; `switchyard up` and the simulator price simulated cloud regions with it.

**Generated — do not edit by hand.** Rebuild with

    python3 scripts/build-catalogue.py [DATA_DIR]    # default ../shared/data/catalog

(Python 3 standard library only; the output is sorted and deterministic). This README is written by
the same script.

Besides GPUs it has accelerators that are not: GCP TPU slices (`TPU-v2` … `TPU-v6e`) and AWS
Trainium and Inferentia. Jobs place on them only when they ask for their vendor or model
(`resources.accelerator: "google"` / `"aws"` / `"any"`, or `gpu_models: ["TPU-v5e"]`): a job
that names neither runs on GPUs only, as before these rows existed. Trainium and Inferentia
are EC2 instance types, launched like any other. A TPU slice is a TPU VM (the Cloud TPU API),
which the GCE provider does not create yet: TPU rows price and place TPU jobs (the simulator,
what-if, a pool's explanation), but a launch there fails like any refused launch and the pool
backs off. Leave them out of a `[gcp]` section's `instance_types` until then.

## Columns

| column | meaning |
|---|---|
| provider | `aws`, `gcp`, `azure`, `lambda`, `vast` |
| region | the provider's region code (`us-east-1`, `europe-west4`, `eastus`); for Vast a slug of the free-text location (below) |
| instance_type | the provider's instance type; Vast: its offer name (`8x-H100_SXM-32-65536`) |
| gpu_model | Switchyard's model name: SkyPilot's accelerator name put through `switchyard_core::gpu_model::normalize` with the memory below, so `A100` with 80 GB is `A100-80GB`, `T4g` is `T4G`, `tpu-v5litepod` is `TPU-v5e`; its vendor is `gpu_model::vendor` |
| gpu_count | GPUs (or accelerator chips) per node, a whole number >= 1; a TPU slice's chips |
| gpu_memory_gb | memory per GPU or chip, GiB rounded to the nearest integer |
| vcpus, memory_gb | host vCPUs and RAM (GiB), rounded; 0 (unknown, not checked) for TPU slices |
| on_demand_per_hour_usd | whole node, USD per hour |
| spot_per_hour_usd | whole node, USD per hour, lowest over the region's zones; empty when there is none |

## Row counts

{counts}

{total} rows in all.

## Sources and method

All inputs are the SkyPilot-format snapshot in `{data_arg}` (see its README for commits and dates).

- **aws** — `aws-gpu-prices-by-region.csv`, already one row per (type, region): `Price` is the
  on-demand price, `SpotPriceMin` the lowest spot price over the region's zones.
  `GpuMemoryGiB` (per device `SizeInMiB / 1024`) is rounded.
- **gcp** — a GPU row has an empty `InstanceType` and prices only the GPUs; the host VM is a
  separate row. For each host row of the GPU-bound families the GPU row with the same zone is
  added to it: `a2-highgpu-Ng`/`a2-megagpu-16g` ↔ N × `A100`, `a2-ultragpu-Ng` ↔ N × `A100-80GB`,
  `a3-highgpu-Ng`/`a3-edgegpu-8g` ↔ N × `H100`, `a3-megagpu-8g` ↔ 8 × `H100-MEGA` (priced as its
  own SKU; the card is an H100, so `gpu_model` is `H100`), `a3-ultragpu-8g` ↔ 8 × `H200`,
  `a4-highgpu-8g` ↔ 8 × `B200`, `g2-standard-{{4,8,12,16,32}}` ↔ 1 × `L4`, `-24` ↔ 2, `-48` ↔ 4,
  `-96` ↔ 8 (`-nolssd` variants as their base type). The `a4-highgpu-8g` host rows are priced
  0.0 in the source: the B200 row carries the whole machine's price, and the sum is used as is. The mapping was checked against the data: every
  host zone of a family has GPU rows of that name and count. On-demand is the same in every zone of
  a region (the script warns otherwise); spot is the lowest (host + GPU) spot over the zones where
  both parts have one.
- **gcp TPUs** — one row per (slice type, zone), priced per slice (the whole slice, all its
  chips). A slice that fits one TPU VM host is one node: its row's count is its chips, which
  for v2, v3, v4 and v5p is half the slice's number (it counts TensorCores, two a chip:
  `tpu-v4-8` is 4 × `TPU-v4`) and for v5e (`v5litepod`) and v6e the number itself
  (`tpu-v5litepod-8` is 8 × `TPU-v5e`). The instance type is the slice name. Slices bigger than
  a host (over 4 chips for v2–v5p, over 8 for v5e and v6e) span several hosts and are left
  out. Memory per chip is Google's HBM figure (v2 16, v3 32, v4 32, v5e 16, v5p 95, v6e 32 GiB);
  host vCPUs and RAM are not in the source (0). On-demand and spot as for GPUs (lowest over the
  region's zones); the source's 700.0 placeholder (any slice size) is no price.
- **aws Trainium and Inferentia** — as the GPU rows (`Trainium`, `Trainium2`, `Inferentia`,
  `Inferentia2`). Trainium2's memory is 96 GiB a chip (AWS: trn2.48xlarge has 16 chips and
  1.5 TiB), not the source's 512; every Trainium2 row lacks an on-demand price, so none is kept.
  Gaudi (`dl1`) is not in this snapshot of the AWS data.
- **azure** — one row per (size, region) already. The source has no per-GPU memory, so it comes
  from a table of each model's usual memory, except the NC H100 v5 sizes (H100 NVL, 94 GB).
- **lambda** — one row per (type, region); no spot market (empty spot column).
- **vast** — `Region` is free text, "Place, CC, Continent". It becomes `cc-place` in lower case
  with non-alphanumerics as hyphens ("Florida, US, NA" → `us-florida`, "The Netherlands, NL, EU" →
  `nl-the-netherlands`), or just `cc` when the place is empty (", US, NA" → `us`). Rows whose
  location does not have that shape are skipped. `GpuInfo` gives the memory of all GPUs of the
  offer together, so it is divided by the count. `SpotPrice` is 0.00 in every row (interruptible
  bids are not in the file), so Vast rows have no spot price.

## What was skipped, and why

| provider | reason | source rows |
|---|---|---|
{skipped}

- FPGAs (AWS f2); TPU slices that span several hosts.
- Fractional GPUs (AWS g6f/gr6f, Azure NV A10 v5 partitions with 1/6, 1/3, 1/2 of a GPU): a
  placement unit in Switchyard is a whole GPU.
- GCP N1 machines with attached T4, V100, P4 or P100: the snapshot keeps no `n1-*` host rows, so
  their full price cannot be built. They are left out rather than priced at the GPU alone.
- GCP GPU rows and host rows whose zone has no counterpart (e.g. `H100-MEGA` in zones without an
  `a3-megagpu-8g` host row) price no complete machine.
- Rows without an on-demand price (AWS `p5e.48xlarge`, some Trainium regions).

## Caveats

- **Hand-copied AWS prices.** The AWS file was copied page by page from the source by hand (see the
  data README); check any single AWS price against AWS before relying on it.
- **Different days.** AWS comes from a different commit of the source than GCP and Azure
  (2026-05-20); Lambda and Vast were last changed 2026-05-07 and 2026-04-29.
- **Spot at or above on-demand.** Spot can be as dear as on-demand (AWS caps it there; a few
  zones sit at the cap), and a handful of rows show spot a hair above on-demand because the source
  rounds spot to 4 decimals: {above}. Placement should compare the two markets, never assume
  spot is cheaper.
- **Memory as reported.** `gpu_memory_gb` is what the source reports, so the same card can differ
  by cloud: AWS reports the L4 and A10G as 22 GiB (22,888 MiB usable) where GCP says 24 for the L4.
  A job asking for at least 24 GB excludes AWS L4/A10G.
- **Vast** offers are single listings by hosts, not a standing region; vCPUs and RAM (32 / 64) are
  the offer template's, and a listing may be gone tomorrow.
- **Licence.** The source repositories (`anycloud-sh/catalog`, `skypilot-org/skypilot-catalog`)
  have no LICENSE file. The rows are public list prices (facts), but the data README asks that the
  files be treated as test and reference data and **not redistributed as a product asset until
  someone has checked the licence**. Embedding this catalogue in a released binary needs that check.
"""


def main():
    data_arg = sys.argv[1] if len(sys.argv) > 1 else "../shared/data/catalog"
    data = Path(data_arg)
    if not data.is_absolute():
        data = (REPO / data).resolve()
    b = Builder()
    b.aws(data)
    b.gcp(data)
    b.azure(data)
    b.lambda_(data)
    b.vast(data)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "gpu-catalogue.csv").write_text(render_csv(b.rows), encoding="utf-8")
    (OUT_DIR / "README.md").write_text(render_readme(b, data_arg), encoding="utf-8")
    per = Counter(r["provider"] for r in b.rows.values())
    print(f"wrote {len(b.rows)} rows: " + ", ".join(f"{p} {n}" for p, n in sorted(per.items())))


if __name__ == "__main__":
    main()

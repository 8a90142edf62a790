//! A tiny SVG writer for the simulator's three plots: line charts (cost over time, queue-delay
//! CDF) and grouped horizontal bars (spend by region). Hand-written rather than plotters: text
//! in plotters' SVG backend needs a font feature and font files, and these plots need only
//! lines, rectangles and `<text>`, which every browser renders with its own fonts.

use std::fmt::Write;

const W: f64 = 900.0;
const H: f64 = 500.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 180.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// One named series of points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn header(out: &mut String, title: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>
"#,
        (LEFT + W - RIGHT) / 2.0,
        esc(title)
    );
}

fn legend(out: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let y = TOP + 20.0 + i as f64 * 20.0;
        let x = W - RIGHT + 15.0;
        let c = COLOURS[i % COLOURS.len()];
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{}" width="14" height="10" fill="{c}"/><text x="{}" y="{y}">{}</text>"#,
            y - 9.0,
            x + 20.0,
            esc(name)
        );
    }
}

/// "Nice" tick values covering `[lo, hi]`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-9);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(t);
        t += step;
    }
    out
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v.abs() >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A line chart. With `log_x`, x values must be positive and the axis is in decades.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_x: bool,
) -> String {
    let tx = |x: f64| if log_x { x.max(1e-9).log10() } else { x };
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0.0_f64, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(tx(x));
        x1 = x1.max(tx(x));
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y1) = (0.0, 1.0, 1.0);
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-9 {
        y1 = y0 + 1.0;
    }
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let px = |x: f64| LEFT + (tx(x) - x0) / (x1 - x0) * pw;
    let py = |y: f64| TOP + ph - (y - y0) / (y1 - y0) * ph;
    let mut out = String::new();
    header(&mut out, title);
    axes(&mut out, x_label, y_label);
    let xt = if log_x {
        (x0.floor() as i64..=x1.ceil() as i64)
            .map(|e| e as f64)
            .filter(|e| *e >= x0 - 1e-9 && *e <= x1 + 1e-9)
            .collect()
    } else {
        ticks(x0, x1)
    };
    for t in xt {
        let x = LEFT + (t - x0) / (x1 - x0) * pw;
        let label = if log_x {
            fmt_tick(10f64.powf(t))
        } else {
            fmt_tick(t)
        };
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{label}</text>"##,
            TOP,
            TOP + ph,
            TOP + ph + 16.0
        );
    }
    for t in ticks(y0, y1) {
        let y = py(t);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(t)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            COLOURS[i % COLOURS.len()],
            pts.join(" ")
        );
    }
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}

fn axes(out: &mut String, x_label: &str, y_label: &str) {
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="20" y="{}" text-anchor="middle" transform="rotate(-90 20 {})">{}</text>"##,
        LEFT + pw / 2.0,
        H - 15.0,
        esc(x_label),
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(y_label)
    );
}

/// Grouped horizontal bars: one group per category, one bar per series.
pub fn bar_chart(
    title: &str,
    x_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> String {
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let left = 200.0;
    let (pw, ph) = (W - left - RIGHT, H - TOP - BOTTOM);
    let group = ph / categories.len().max(1) as f64;
    let bar = (group * 0.8) / series.len().max(1) as f64;
    let mut out = String::new();
    header(&mut out, title);
    let _ = writeln!(
        out,
        r##"<text x="{}" y="{}" text-anchor="middle">{}</text>"##,
        left + pw / 2.0,
        H - 15.0,
        esc(x_label)
    );
    for t in ticks(0.0, max) {
        let x = left + t / max * pw;
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 16.0,
            fmt_tick(t)
        );
    }
    for (c, name) in categories.iter().enumerate() {
        let gy = TOP + c as f64 * group;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 6.0,
            gy + group / 2.0 + 4.0,
            esc(name)
        );
        for (s, (_, values)) in series.iter().enumerate() {
            let v = values.get(c).copied().unwrap_or(0.0);
            let _ = writeln!(
                out,
                r#"<rect x="{left}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                gy + group * 0.1 + s as f64 * bar,
                v / max * pw,
                bar,
                COLOURS[s % COLOURS.len()]
            );
        }
    }
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg() {
        let s = vec![Series {
            name: "a<b".into(),
            points: vec![(1.0, 0.0), (10.0, 0.5), (1000.0, 1.0)],
        }];
        let svg = line_chart("t", "x", "y", &s, true);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a&lt;b") && svg.contains("<polyline"));
        let bars = bar_chart("t", "usd", &["r1".into()], &[("s".into(), vec![3.0])]);
        assert!(bars.contains("<rect") && bars.contains("r1"));
        assert!(line_chart("empty", "x", "y", &[], false).contains("</svg>"));
    }
}

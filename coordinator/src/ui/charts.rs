//! Small inline SVG charts rendered on the server (no script, no external library).

use maud::{html, Markup};

/// A line chart of values in [0, 1] with a point per value and its label under the axis.
pub fn line_chart(id: &str, label: &str, points: &[(String, f64)]) -> Markup {
    let (w, h, pad) = (520.0_f64, 180.0_f64, 28.0_f64);
    let n = points.len();
    let x = |i: usize| {
        if n <= 1 {
            w / 2.0
        } else {
            pad + (w - 2.0 * pad) * i as f64 / (n - 1) as f64
        }
    };
    let y = |v: f64| h - pad - (h - 2.0 * pad) * v.clamp(0.0, 1.0);
    let path: String = points
        .iter()
        .enumerate()
        .map(|(i, (_, v))| {
            format!(
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { " L" },
                x(i),
                y(*v)
            )
        })
        .collect();
    html! {
        svg id=(id) role="img" aria-label=(label) viewBox=(format!("0 0 {w} {h}")) width="520" height="180" {
            line.axis x1=(pad) y1=(y(0.0)) x2=(w - pad) y2=(y(0.0)) {}
            line.axis x1=(pad) y1=(y(1.0)) x2=(w - pad) y2=(y(1.0)) {}
            text x="2" y=(y(1.0) + 4.0) font-size="10" { "1" }
            text x="2" y=(y(0.0) + 4.0) font-size="10" { "0" }
            @if n > 1 { path.line d=(path) {} }
            @for (i, (name, v)) in points.iter().enumerate() {
                circle.bar cx=(format!("{:.1}", x(i))) cy=(format!("{:.1}", y(*v))) r="4" {
                    title { (name) ": " (format!("{:.1} %", v * 100.0)) }
                }
                text x=(format!("{:.1}", x(i))) y=(h - 8.0) font-size="10" text-anchor="middle" { (name) }
            }
        }
    }
}

/// A sparkline of pass rates (the skills list's trend).
pub fn sparkline(values: &[f64]) -> Markup {
    let (w, h) = (80.0_f64, 20.0_f64);
    if values.is_empty() {
        return html! { span.muted { "—" } };
    }
    let n = values.len();
    let x = |i: usize| {
        if n <= 1 {
            w / 2.0
        } else {
            2.0 + (w - 4.0) * i as f64 / (n - 1) as f64
        }
    };
    let y = |v: f64| h - 2.0 - (h - 4.0) * v.clamp(0.0, 1.0);
    let path: String = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { " L" },
                x(i),
                y(*v)
            )
        })
        .collect();
    html! {
        svg.sparkline role="img" aria-label="pass-rate trend" viewBox=(format!("0 0 {w} {h}")) width="80" height="20" {
            @if n > 1 { path.line d=(path) {} } @else { circle.bar cx=(x(0)) cy=(y(values[0])) r="2" {} }
        }
    }
}

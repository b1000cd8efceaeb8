//! The quality report as Markdown and as a self-contained HTML page (inline SVG chart, inline
//! CSS, no script, no external font or image); JSON is the report's serde form.
//!
//! Every string that comes from data (skill name, versions, criterion names) is escaped for the
//! format it lands in, so a hostile version string cannot inject markup.

use std::fmt::Write;

use crate::quality::{MarkerKind, QualityBucket, QualityReport};

fn pct(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{:.1} %", v * 100.0))
}

fn num(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.3}"))
}

/// Escapes text for a Markdown table cell.
fn md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' | '\\' | '`' | '*' | '_' | '<' | '>' | '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Escapes text for HTML content and attribute values.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn ci(b: &QualityBucket) -> String {
    b.pass_rate_ci.map_or("–".into(), |i| {
        format!("{:.1}–{:.1} %", i.low * 100.0, i.high * 100.0)
    })
}

fn label(r: &QualityReport, b: &QualityBucket) -> String {
    match r.bucket {
        crate::quality::BucketSize::Hour => b.start.format("%Y-%m-%d %H:00").to_string(),
        crate::quality::BucketSize::Day => b.start.format("%Y-%m-%d").to_string(),
    }
}

fn marker_text(kind: MarkerKind, from: Option<&str>, to: &str) -> String {
    let what = match kind {
        MarkerKind::Version => "version",
        MarkerKind::MonitorRevision => "monitor revision",
    };
    match from {
        Some(f) => format!("{what} {f} → {to}"),
        None => format!("{what} {to}"),
    }
}

/// The report as Markdown.
pub fn markdown(r: &QualityReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Production quality: {}\n", md(&r.skill));
    let _ = writeln!(
        s,
        "{} to {}, by {}{}{}.\n",
        r.from.format("%Y-%m-%d %H:%M UTC"),
        r.to.format("%Y-%m-%d %H:%M UTC"),
        r.bucket.as_str(),
        r.version
            .as_deref()
            .map_or(String::new(), |v| format!(", version {}", md(v))),
        r.criterion
            .as_deref()
            .map_or(String::new(), |c| format!(", criterion {}", md(c))),
    );
    let t = &r.total;
    let _ = writeln!(
        s,
        "**Overall**: {} graded, pass rate {} (95 % CI {}), mean score {}{}.\n",
        t.n,
        pct(t.pass_rate),
        ci(t),
        num(t.mean_score),
        if t.errored > 0 {
            format!(", {} not graded (errored)", t.errored)
        } else {
            String::new()
        }
    );
    let criteria: Vec<&String> = t.criteria.keys().collect();
    s.push_str("| Bucket | n | Pass rate | 95 % CI | Mean | p10 | p50 | p90 |");
    for c in &criteria {
        let _ = write!(s, " {} |", md(c));
    }
    s.push_str(" Errored |\n|---|---:|---:|---|---:|---:|---:|---:|");
    for _ in &criteria {
        s.push_str("---:|");
    }
    s.push_str("---:|\n");
    for b in &r.buckets {
        let q = b.score_quantiles;
        let _ = write!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            label(r, b),
            b.n,
            pct(b.pass_rate),
            ci(b),
            num(b.mean_score),
            num(q.map(|q| q.p10)),
            num(q.map(|q| q.p50)),
            num(q.map(|q| q.p90)),
        );
        for c in &criteria {
            let _ = write!(s, " {} |", num(b.criteria.get(*c).copied()));
        }
        let _ = writeln!(s, " {} |", b.errored);
    }
    if !r.markers.is_empty() {
        s.push_str("\n**Changes**:\n\n");
        for m in &r.markers {
            let _ = writeln!(
                s,
                "- {}: {}",
                m.at.format("%Y-%m-%d %H:%M UTC"),
                md(&marker_text(m.kind, m.from.as_deref(), &m.to))
            );
        }
    }
    s
}

/// The chart: pass rate per bucket with its Wilson band, markers as vertical lines.
fn svg(r: &QualityReport) -> String {
    let (w, h, left, top, bottom) = (900.0, 300.0, 48.0, 16.0, 40.0);
    let plot_w = w - left - 16.0;
    let plot_h = h - top - bottom;
    let n = r.buckets.len().max(1) as f64;
    let x = |i: f64| left + plot_w * (i + 0.5) / n;
    let y = |v: f64| top + plot_h * (1.0 - v);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" role="img" aria-label="pass rate per bucket">"#
    );
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{:.0}%</text>"##,
            w - 16.0,
            left - 6.0,
            y(tick) + 4.0,
            tick * 100.0,
            y = y(tick)
        );
    }
    let with: Vec<(usize, &QualityBucket)> = r
        .buckets
        .iter()
        .enumerate()
        .filter(|(_, b)| b.pass_rate.is_some())
        .collect();
    for (i, b) in &with {
        if let Some(ci) = b.pass_rate_ci {
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="#9ab" stroke-width="6" stroke-linecap="round" opacity="0.5"><title>{}: 95 % CI {}</title></line>"##,
                y(ci.low),
                y(ci.high),
                html_escape(&label(r, b)),
                html_escape(&self::ci(b)),
                x = x(*i as f64)
            );
        }
    }
    let points: Vec<String> = with
        .iter()
        .filter_map(|(i, b)| {
            b.pass_rate
                .map(|p| format!("{:.1},{:.1}", x(*i as f64), y(p)))
        })
        .collect();
    if !points.is_empty() {
        let _ = write!(
            s,
            r##"<polyline fill="none" stroke="#246" stroke-width="2" points="{}"/>"##,
            points.join(" ")
        );
    }
    for (i, b) in &with {
        if let Some(p) = b.pass_rate {
            let _ = write!(
                s,
                r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#246"><title>{}: {} of {} ({})</title></circle>"##,
                x(*i as f64),
                y(p),
                html_escape(&label(r, b)),
                b.passed,
                b.n,
                html_escape(&pct(Some(p)))
            );
        }
    }
    for m in &r.markers {
        if let Some(i) = r.buckets.iter().position(|b| b.start == m.bucket_start) {
            let colour = match m.kind {
                MarkerKind::Version => "#c60",
                MarkerKind::MonitorRevision => "#609",
            };
            let xi = x(i as f64) - plot_w / n / 2.0;
            let _ = write!(
                s,
                r#"<line x1="{xi:.1}" x2="{xi:.1}" y1="{top}" y2="{:.1}" stroke="{colour}" stroke-dasharray="4 3"><title>{}</title></line>"#,
                top + plot_h,
                html_escape(&marker_text(m.kind, m.from.as_deref(), &m.to))
            );
        }
    }
    let every = (r.buckets.len() / 8).max(1);
    for (i, b) in r.buckets.iter().enumerate().step_by(every) {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
            x(i as f64),
            h - bottom + 18.0,
            html_escape(&label(r, b))
        );
    }
    s.push_str("</svg>");
    s
}

/// The report as one self-contained HTML page.
pub fn html(r: &QualityReport) -> String {
    let mut s = String::new();
    let title = format!("Production quality: {}", r.skill);
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:2em;color:#222}}\
         table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 7px;text-align:right}}\
         th:first-child,td:first-child{{text-align:left}}svg{{max-width:100%;height:auto}}</style></head><body>\n",
        html_escape(&title)
    );
    let _ = writeln!(s, "<h1>{}</h1>", html_escape(&title));
    let t = &r.total;
    let _ = writeln!(
        s,
        "<p>{} to {}, by {}{}{}. Overall: {} graded, pass rate {} (95 % CI {}), mean score {}, {} not graded.</p>",
        r.from.format("%Y-%m-%d %H:%M UTC"),
        r.to.format("%Y-%m-%d %H:%M UTC"),
        r.bucket.as_str(),
        r.version
            .as_deref()
            .map_or(String::new(), |v| format!(", version {}", html_escape(v))),
        r.criterion
            .as_deref()
            .map_or(String::new(), |c| format!(", criterion {}", html_escape(c))),
        t.n,
        html_escape(&pct(t.pass_rate)),
        html_escape(&ci(t)),
        num(t.mean_score),
        t.errored
    );
    s.push_str(&svg(r));
    s.push('\n');
    let criteria: Vec<&String> = t.criteria.keys().collect();
    s.push_str("<table><thead><tr><th>Bucket</th><th>n</th><th>Pass rate</th><th>95 % CI</th><th>Mean</th><th>p10</th><th>p50</th><th>p90</th>");
    for c in &criteria {
        let _ = write!(s, "<th>{}</th>", html_escape(c));
    }
    s.push_str("<th>Errored</th></tr></thead><tbody>\n");
    for b in &r.buckets {
        let q = b.score_quantiles;
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            html_escape(&label(r, b)),
            b.n,
            html_escape(&pct(b.pass_rate)),
            html_escape(&ci(b)),
            num(b.mean_score),
            num(q.map(|q| q.p10)),
            num(q.map(|q| q.p50)),
            num(q.map(|q| q.p90)),
        );
        for c in &criteria {
            let _ = write!(s, "<td>{}</td>", num(b.criteria.get(*c).copied()));
        }
        let _ = writeln!(s, "<td>{}</td></tr>", b.errored);
    }
    s.push_str("</tbody></table>\n");
    if !r.markers.is_empty() {
        s.push_str("<h2>Changes</h2><ul>\n");
        for m in &r.markers {
            let _ = writeln!(
                s,
                "<li>{}: {}</li>",
                m.at.format("%Y-%m-%d %H:%M UTC"),
                html_escape(&marker_text(m.kind, m.from.as_deref(), &m.to))
            );
        }
        s.push_str("</ul>\n");
    }
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::quality::{quality, GradedSample, QualityQuery, SampleStatus};
    use chrono::{TimeZone, Utc};

    fn report() -> QualityReport {
        let samples: Vec<GradedSample> = (0..6)
            .map(|i| GradedSample {
                sample_id: format!("s{i}"),
                observed_at: Utc.with_ymd_and_hms(2026, 3, 1 + i / 3, 9, 0, 0).unwrap(),
                version: Some(if i < 3 {
                    "1.0".into()
                } else {
                    "<script>alert(1)</script>".into()
                }),
                monitor_revision: 1,
                status: if i % 3 == 0 {
                    SampleStatus::Failed
                } else {
                    SampleStatus::Passed
                },
                score: Some(0.5),
                criteria: [(
                    "a|b<i>".to_string(),
                    crate::quality::CriterionGrade {
                        score: 0.5,
                        passed: true,
                    },
                )]
                .into_iter()
                .collect(),
            })
            .collect();
        quality("skill & <co>", &samples, &QualityQuery::default()).unwrap()
    }

    #[test]
    fn html_is_self_contained_and_escapes_every_data_string() {
        let page = html(&report());
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.contains("<svg") && page.contains("<polyline"));
        assert!(!page.contains("<script"), "unescaped data in the page");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(page.contains("skill &amp; &lt;co&gt;"));
        assert!(page.contains("a|b&lt;i&gt;"));
        // Nothing loaded from elsewhere: no script, stylesheet, font or image reference.
        for banned in ["<script", "<link", "src=", "@import", "url(", "href="] {
            assert!(!page.contains(banned), "{banned}");
        }
        // The only URL is the SVG namespace.
        assert_eq!(page.matches("http").count(), 1);
    }

    #[test]
    fn markdown_has_a_row_per_bucket_and_escapes_cells() {
        let text = markdown(&report());
        assert!(text.contains("| 2026-03-01 | 3 | 66.7 % |"), "{text}");
        assert!(text.contains("| 2026-03-02 | 3 | 66.7 % |"), "{text}");
        assert!(text.contains(r"a\|b\<i\>"), "{text}");
        assert!(text.contains(r"version 1.0 → \<script\>"), "{text}");
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(json["buckets"][0]["n"], 3);
        assert!(json["buckets"][0]["pass_rate_ci"]["low"].is_number());
    }
}

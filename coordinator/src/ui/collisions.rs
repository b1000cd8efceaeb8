//! The skill page's catalogue collisions section (docs/ui.md): the latest version's matrix
//! (maud escapes every name and query: they are the uploader's text, rendered as text) and
//! what other skills' evals found about this one, counts and rates only.

use maud::{html, Markup};
use skilleval_analysis::collisions::for_neighbour;
use skilleval_analysis::stats::proportion::Interval;
use skilleval_infra::store::catalogue::CollisionStatus;

use crate::collisions::CollisionsView;

fn rate(hits: u64, runs: u64, rate: Option<f64>, interval: Option<Interval>) -> String {
    let Some(r) = rate else {
        return format!("{hits}/{runs}");
    };
    let ci = interval.map_or(String::new(), |i| {
        format!(" [{:.0}–{:.0}%]", i.low * 100.0, i.high * 100.0)
    });
    format!("{hits}/{runs} = {:.0}%{ci}", r * 100.0)
}

/// The section; empty when the skill has no collision eval and no other skill named it.
pub(crate) fn section(view: &CollisionsView) -> Markup {
    if view.latest.is_none() && view.reported_by_others.is_empty() {
        return html! {};
    }
    html! {
        section #collisions {
            h3 { "Catalogue collisions" }
            @if let Some(latest) = &view.latest {
                p.muted { "Version " (latest.version) ": "
                    (match latest.status {
                        CollisionStatus::Pending => "the collision eval is running.",
                        CollisionStatus::Completed => "which neighbours' trigger queries pick this skill, and which of its queries pick them.",
                        CollisionStatus::Failed => "the collision eval did not run.",
                    }) }
                @if let Some(error) = &latest.error { p.error { (error) } }
                @if let Some(gate) = &latest.gate {
                    p { "Gate no_collision (max share " (format!("{:.0}%", gate.max_share * 100.0)) "): "
                        span.verdict.(if gate.passed { "pass" } else { "fail" }) { (if gate.passed { "passed" } else { "failed" }) } }
                }
                @if let Some(m) = &latest.matrix {
                    table #collision-pairs {
                        tr { th { "neighbour" } th { "similarity" } th { "its queries picking this skill" } th { "this skill's queries picking it" } }
                        @for n in &m.neighbours {
                            @if let Some(r) = for_neighbour(m, &n.name) {
                                tr {
                                    td { (n.name) @if n.foreign { " " span.muted { "(another publisher: counts only)" } } }
                                    td.num { (format!("{:.2}", n.similarity)) }
                                    td.num { (rate(r.taken_from_you.hits, r.taken_from_you.runs, r.taken_from_you.rate, r.taken_from_you.interval)) }
                                    td.num { (rate(r.taken_by_you.hits, r.taken_by_you.runs, r.taken_by_you.rate, r.taken_by_you.interval)) }
                                }
                            }
                        }
                    }
                    table #collision-queries {
                        tr { th { "query of" } th { "query" } th { "picked" } }
                        @for q in &m.queries {
                            tr {
                                td { (q.owner) }
                                td { (q.query) }
                                td { (q.picks.iter().map(|(k, v)| format!("{k} ×{v}")).collect::<Vec<_>>().join(", ")) }
                            }
                        }
                    }
                    @if m.hidden_queries > 0 {
                        p.muted { (m.hidden_queries) " queries of other publishers' skills are counted above and not shown." }
                    }
                }
            }
            @if !view.reported_by_others.is_empty() {
                h4 { "Found by other skills' collision evals" }
                table #collisions-by-others {
                    tr { th { "skill" } th { "similarity" } th { "this skill's queries picking it" } th { "its queries picking this skill" } }
                    @for r in &view.reported_by_others {
                        tr {
                            td { (r.skill.as_deref().unwrap_or("a skill of another publisher")) }
                            td.num { (format!("{:.2}", r.similarity)) }
                            td.num { (rate(r.taken_from_you.hits, r.taken_from_you.runs, r.taken_from_you.rate, r.taken_from_you.interval)) }
                            td.num { (rate(r.taken_by_you.hits, r.taken_by_you.runs, r.taken_by_you.rate, r.taken_by_you.interval)) }
                        }
                    }
                }
            }
        }
    }
}

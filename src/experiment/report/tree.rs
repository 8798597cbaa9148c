//! The summary's comparison of draft trees with chains at equal γ.
use crate::experiment::summary::PointSummary;
use crate::experiment::sweep::SweepPoint;

/// The chain point a tree point is compared with: same drafter, γ, sampling and cache.
fn chain_of<'a>(tree: &PointSummary, rows: &'a [PointSummary]) -> Option<&'a PointSummary> {
    rows.iter().find(|c| {
        let same = SweepPoint {
            tree_width: 1,
            tree_budget: c.settings.tree_budget,
            ..tree.settings.clone()
        };
        c.settings.tree_width == 1 && c.settings == same
    })
}

fn per_depth(row: &PointSummary) -> String {
    let parts: Vec<String> = row
        .acceptance_at
        .iter()
        .map(|a| format!("{a:.2}"))
        .collect();
    parts.join(" ")
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "—".into(), |v| format!("{v:.digits$}"))
}

/// A Markdown section comparing every tree point with its chain: τ, acceptance per depth
/// and tok/s side by side, with the tree/chain ratios; empty when the sweep has no trees.
pub fn tree_markdown(rows: &[PointSummary]) -> String {
    let trees: Vec<&PointSummary> = rows.iter().filter(|r| r.settings.is_tree()).collect();
    if trees.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "## Trees against chains (equal γ)\n\n\
         | tree | chain τ | tree τ | τ ratio | chain tok/s | tree tok/s | tok/s ratio | \
         chain α per depth | tree α per depth |\n|---|---:|---:|---:|---:|---:|---:|---|---|\n",
    );
    for tree in trees {
        let Some(chain) = chain_of(tree, rows) else {
            out.push_str(&format!(
                "| {} | — (add tree_width = 1 to the sweep) | {} | | | {:.1} | | | {} |\n",
                tree.label,
                num(tree.tau, 3),
                tree.tokens_per_s,
                per_depth(tree)
            ));
            continue;
        };
        let tau_ratio = tree.tau.zip(chain.tau).map(|(t, c)| t / c);
        let tps_ratio = (chain.tokens_per_s > 0.0).then(|| tree.tokens_per_s / chain.tokens_per_s);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {} | {} | {} |\n",
            tree.label,
            num(chain.tau, 3),
            num(tree.tau, 3),
            num(tau_ratio, 3),
            chain.tokens_per_s,
            tree.tokens_per_s,
            num(tps_ratio, 2),
            per_depth(chain),
            per_depth(tree)
        ));
    }
    out.push_str(
        "\nα per depth: entry i = steps whose accepted path reached depth i + 1 / steps whose \
         tree had that depth (for chains: acceptance per position). A tok/s ratio above 1 means \
         the tree bought speed on this machine; τ alone counts target forwards, not their cost \
         (a tree's verification forward runs over budget + 1 tokens).\n\n",
    );
    out
}

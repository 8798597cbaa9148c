//! The tree keys of `exp`: `tree_width` and `tree_budget` are validated with messages naming
//! the key, multiply the speculative points (chains once, trees once per budget), default the
//! budget to γ, and leave the seeds of chain points as they were without them.
use specdec::experiment::{max_block, sweep_points, ExperimentConfig, SweepPoint};

const BASE: &str = "name = \"t\"\n[drafters.small]\nkind = \"model\"\npath = \"models/draft\"\n";

fn config(sweep: &str) -> ExperimentConfig {
    let c = ExperimentConfig::from_toml(&format!("{BASE}[sweep]\n{sweep}")).unwrap();
    c.validate().unwrap();
    c
}

fn speculative(c: &ExperimentConfig) -> Vec<SweepPoint> {
    sweep_points(c)
        .into_iter()
        .filter(|p| p.drafter.is_some())
        .collect()
}

#[test]
fn bad_tree_values_name_the_key() {
    for (sweep, key, allowed) in [
        ("tree_width = 0\n", "sweep.tree_width", ">= 1"),
        ("tree_width = []\n", "sweep.tree_width", "at least one"),
        ("tree_width = [2, 2]\n", "sweep.tree_width", "listed twice"),
        ("tree_budget = 0\n", "sweep.tree_budget", ">= 1"),
        ("tree_budget = []\n", "sweep.tree_budget", "at least one"),
    ] {
        let text = format!("{BASE}[sweep]\n{sweep}");
        let err = ExperimentConfig::from_toml(&text)
            .and_then(|c| c.validate())
            .expect_err("config must be rejected")
            .to_string();
        assert!(
            err.contains(key) && err.contains(allowed),
            "{sweep:?} gave: {err}"
        );
    }
    let err = ExperimentConfig::from_toml(&format!("{BASE}[sweep]\ntree_depth = 3\n"))
        .expect_err("unknown key")
        .to_string();
    assert!(err.contains("tree_depth"), "{err}");
}

#[test]
fn widths_and_budgets_multiply_the_speculative_points() {
    let c = config("gamma = [2, 4]\ntree_width = [1, 2, 3]\ntree_budget = [8, 16]\n");
    let points = speculative(&c);
    // Per γ: the chain, then widths 2 and 3 with two budgets each.
    assert_eq!(points.len(), 2 * (1 + 2 * 2));
    let shapes: Vec<(usize, Option<usize>)> = points
        .iter()
        .map(|p| (p.tree_width, p.tree_budget))
        .collect();
    let per_gamma = |g| {
        vec![
            (1, Some(g)),
            (2, Some(8)),
            (2, Some(16)),
            (3, Some(8)),
            (3, Some(16)),
        ]
    };
    assert_eq!(shapes, [per_gamma(2), per_gamma(4)].concat());
    let mut labels: Vec<String> = points.iter().map(|p| p.label()).collect();
    labels.sort();
    labels.dedup();
    assert_eq!(labels.len(), points.len(), "labels are unique");
    assert_eq!(max_block(&c), 16, "slack rings hold the largest tree");
}

#[test]
fn the_budget_defaults_to_gamma_and_chain_seeds_are_unchanged() {
    let with_trees = config("gamma = [3]\ntree_width = [1, 2]\n");
    let budgets: Vec<_> = speculative(&with_trees)
        .iter()
        .map(|p| p.tree_budget)
        .collect();
    assert_eq!(budgets, [Some(3), Some(3)]);
    assert_eq!(max_block(&with_trees), 3);
    let chains_only = config("gamma = [3]\n");
    let (a, b) = (&speculative(&with_trees)[0], &speculative(&chains_only)[0]);
    assert_eq!(
        a, b,
        "the chain point is the same with or without tree keys"
    );
    assert_eq!(a.generation_seed(7, "p"), b.generation_seed(7, "p"));
    let tree = &speculative(&with_trees)[1];
    assert_ne!(tree.generation_seed(7, "p"), a.generation_seed(7, "p"));
}

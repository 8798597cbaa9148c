//! The order in which a sweep's generations run (`order` and `repeats` in the config).
use serde::{Deserialize, Serialize};

use super::config::{Method, RunOrder};
use super::sweep::SweepPoint;

/// One generation to run: which repeat, which point, which prompt (indices into the sweep's
/// points and the session's prompts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// Repeat, from 0.
    pub repeat: usize,
    /// Index of the sweep point.
    pub point: usize,
    /// Index of the prompt.
    pub prompt: usize,
}

/// True when `a` and `b` are compared with each other: same sampling, cache and engine
/// options (the autoregressive point of that setting is the baseline of the speculative ones).
fn same_pairing(a: &SweepPoint, b: &SweepPoint) -> bool {
    a.temperature == b.temperature
        && a.top_k == b.top_k
        && a.top_p == b.top_p
        && a.cache == b.cache
        && a.engine == b.engine
}

/// Groups of point indices that are compared with each other, in order of first appearance;
/// within a group the points keep their sweep order (autoregressive first).
pub fn pairing_groups(points: &[SweepPoint]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        match groups.iter_mut().find(|g| same_pairing(&points[g[0]], p)) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    for g in &mut groups {
        g.sort_by_key(|&i| (points[i].method != Method::Autoregressive, i));
    }
    groups
}

/// Every generation of the run, in the order it runs.
///
/// * `Grouped`: per repeat, every prompt of point 0, then of point 1, … (the sweep's order).
/// * `Interleaved`: per repeat, per pairing group (see [`pairing_groups`]), per prompt, the
///   group's points back to back, rotated left by `repeat + prompt` so that each point runs
///   first, second, … equally often and no point always follows the same one. Repeats are
///   the outer loop so that each group's repeats are spread over the whole run: a slow phase
///   of the machine then lands in every group instead of one group's whole measurement.
pub fn schedule(
    points: &[SweepPoint],
    prompts: usize,
    repeats: usize,
    order: RunOrder,
) -> Vec<Slot> {
    let mut slots = Vec::with_capacity(points.len() * prompts * repeats);
    match order {
        RunOrder::Grouped => {
            for repeat in 0..repeats {
                for point in 0..points.len() {
                    for prompt in 0..prompts {
                        slots.push(Slot {
                            repeat,
                            point,
                            prompt,
                        });
                    }
                }
            }
        }
        RunOrder::Interleaved => {
            let groups = pairing_groups(points);
            for repeat in 0..repeats {
                for group in &groups {
                    for prompt in 0..prompts {
                        let mut turn = group.clone();
                        turn.rotate_left((repeat + prompt) % group.len());
                        slots.extend(turn.into_iter().map(|point| Slot {
                            repeat,
                            point,
                            prompt,
                        }));
                    }
                }
            }
        }
    }
    slots
}

/// `[i]`: true when `slots[i]` ends a *turn*: the slots of one repeat of one pairing group
/// (interleaved) or of one point (grouped) that run back to back. The runner keeps per-point
/// state (caches, drafters) for one turn only, so only one group's caches are held at a time.
pub fn turn_ends(slots: &[Slot], points: &[SweepPoint], order: RunOrder) -> Vec<bool> {
    let groups = pairing_groups(points);
    let turn = |s: &Slot| match order {
        RunOrder::Grouped => (s.repeat, s.point),
        RunOrder::Interleaved => (
            s.repeat,
            groups
                .iter()
                .position(|g| g.contains(&s.point))
                .unwrap_or(0),
        ),
    };
    (0..slots.len())
        .map(|i| {
            slots
                .get(i + 1)
                .is_none_or(|next| turn(next) != turn(&slots[i]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::config::{CacheChoice, GammaChoice};

    fn point(method: Method, gamma: Option<usize>, temperature: f64) -> SweepPoint {
        SweepPoint {
            method,
            drafter: gamma.map(|_| "d".into()),
            gamma: gamma.map(GammaChoice::Fixed),
            temperature,
            top_k: 0,
            top_p: 1.0,
            cache: CacheChoice::Staged,
            prefix_cache: false,
            tree_width: 1,
            tree_budget: None,
            engine: crate::engine::EngineOptions::default(),
            engine_swept: Vec::new(),
        }
    }

    fn sweep() -> Vec<SweepPoint> {
        vec![
            point(Method::Autoregressive, None, 0.0),
            point(Method::Autoregressive, None, 1.0),
            point(Method::Speculative, Some(1), 0.0),
            point(Method::Speculative, Some(2), 0.0),
            point(Method::Speculative, Some(1), 1.0),
        ]
    }

    #[test]
    fn groups_pair_each_baseline_with_its_speculative_points() {
        assert_eq!(pairing_groups(&sweep()), vec![vec![0, 2, 3], vec![1, 4]]);
    }

    #[test]
    fn interleaved_runs_a_group_back_to_back_per_prompt_rotating() {
        let slots = schedule(&sweep(), 2, 2, RunOrder::Interleaved);
        let order: Vec<(usize, usize, usize)> = slots
            .iter()
            .map(|s| (s.repeat, s.prompt, s.point))
            .collect();
        #[rustfmt::skip]
        let want = vec![
            (0, 0, 0), (0, 0, 2), (0, 0, 3),
            (0, 1, 2), (0, 1, 3), (0, 1, 0),
            (0, 0, 1), (0, 0, 4),
            (0, 1, 4), (0, 1, 1),
            (1, 0, 2), (1, 0, 3), (1, 0, 0),
            (1, 1, 3), (1, 1, 0), (1, 1, 2),
            (1, 0, 4), (1, 0, 1),
            (1, 1, 1), (1, 1, 4),
        ];
        assert_eq!(order, want);
        let ends: Vec<usize> = turn_ends(&slots, &sweep(), RunOrder::Interleaved)
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.then_some(i))
            .collect();
        assert_eq!(ends, [5, 9, 15, 19]);
    }

    #[test]
    fn grouped_runs_every_prompt_of_a_point_before_the_next() {
        let slots = schedule(&sweep(), 2, 2, RunOrder::Grouped);
        let points: Vec<usize> = slots.iter().map(|s| s.point).collect();
        assert_eq!(
            points,
            [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
        );
        assert!(slots[..10].iter().all(|s| s.repeat == 0));
        let ends = turn_ends(&slots, &sweep(), RunOrder::Grouped);
        assert!(ends.iter().enumerate().all(|(i, e)| *e == (i % 2 == 1)));
    }

    #[test]
    fn both_orders_run_every_generation_exactly_once() {
        for order in [RunOrder::Interleaved, RunOrder::Grouped] {
            let mut slots = schedule(&sweep(), 3, 2, order);
            slots.sort_by_key(|s| (s.repeat, s.point, s.prompt));
            slots.dedup();
            assert_eq!(slots.len(), 5 * 3 * 2, "{order}");
        }
    }
}

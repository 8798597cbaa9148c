//! Prompt-lookup trees: several continuations of the context's suffix, merged into a trie.
use super::ngram::NgramDrafter;
use super::tree::{DraftTree, TreeShape};

impl NgramDrafter {
    /// Up to `width` distinct continuations (each up to `max` tokens) of the context's
    /// suffix: the matches of the longest n-gram first, latest first, then shorter n-grams
    /// while fewer than `width` were found. The first is [`NgramDrafter::lookup`]'s.
    pub fn lookup_many(&self, context: &[u32], max: usize, width: usize) -> Vec<Vec<u32>> {
        let mut found: Vec<Vec<u32>> = Vec::new();
        if max == 0 {
            return found;
        }
        for n in (self.min_ngram()..=self.max_ngram()).rev() {
            if context.len() <= n {
                continue;
            }
            let suffix = &context[context.len() - n..];
            // Starts strictly before the suffix itself, latest first.
            for start in (0..context.len() - n).rev() {
                if found.len() == width {
                    return found;
                }
                if &context[start..start + n] != suffix {
                    continue;
                }
                let from = start + n;
                let next = context[from..(from + max).min(context.len())].to_vec();
                if !found.contains(&next) {
                    found.push(next);
                }
            }
        }
        found
    }

    /// The continuations of [`NgramDrafter::lookup_many`] (`shape.depth` tokens each,
    /// `shape.width` of them) merged into a trie of at most `shape.budget` nodes: siblings
    /// carry distinct tokens, and every child is deterministic (`q` one-hot).
    pub fn lookup_tree(&self, context: &[u32], shape: TreeShape) -> DraftTree {
        let mut tree = DraftTree {
            child_q: vec![None],
            ..DraftTree::default()
        };
        for branch in self.lookup_many(context, shape.depth, shape.width) {
            let mut parent: Option<usize> = None;
            for token in branch {
                let existing =
                    (0..tree.len()).find(|&i| tree.parents[i] == parent && tree.tokens[i] == token);
                parent = match existing {
                    Some(node) => Some(node),
                    None if tree.len() < shape.budget => {
                        tree.tokens.push(token);
                        tree.parents.push(parent);
                        tree.child_q.push(None);
                        Some(tree.len() - 1)
                    }
                    None => break,
                };
            }
        }
        tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuations_merge_into_a_trie() {
        let d = NgramDrafter::new("ngram", 1, 2).unwrap();
        // Suffix [1, 2] occurs at 0 (then 3 4) and at 4 (then 5 6); suffix [2] adds nothing new.
        let context = [1, 2, 3, 4, 1, 2, 5, 6, 9, 1, 2];
        let many = d.lookup_many(&context, 2, 3);
        assert_eq!(many, [vec![5, 6], vec![3, 4]]);
        assert_eq!(many[0], d.lookup(&context, 2));
        let shape = TreeShape {
            depth: 2,
            width: 3,
            budget: 3,
        };
        let tree = d.lookup_tree(&context, shape);
        assert_eq!(tree.tokens, [5, 6, 3]);
        assert_eq!(tree.parents, [None, Some(0), None]);
        // Shared prefixes are shared nodes.
        let context = [7, 1, 2, 8, 1, 2, 9, 1];
        let tree = d.lookup_tree(
            &context,
            TreeShape {
                budget: 10,
                ..shape
            },
        );
        assert_eq!(tree.tokens, [2, 9, 8]);
        assert_eq!(tree.parents, [None, Some(0), Some(0)]);
    }
}

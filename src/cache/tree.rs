//! Token trees appended inside a speculation: the block's shape, described by parents.
//!
//! Node `i` of a block sits after the committed history; its parent is an earlier node of
//! the block, or none (a root, which follows the committed history directly). A node sees
//! the committed history and its own ancestors (itself included); its RoPE position is
//! `base + depth` where roots have depth 0. A chain is the tree whose node `i` has parent
//! `i - 1`. Nodes are in topological order (`parent < index`), so a block can be appended
//! in order, one frontier at a time.
use super::error::CacheError;
use crate::error::Result;

/// Most nodes a block described by [`TokenTree::step_words`] may follow (one bit a node).
pub const STEP_WORDS_MAX_NODES: usize = 32;

/// The shape of a speculative block: the parent of every node, in topological order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenTree {
    parents: Vec<Option<usize>>,
    /// `depth[i]`: ancestors of node `i` (0 for a root).
    depth: Vec<usize>,
}

impl TokenTree {
    /// A tree from its parents; refused unless every parent precedes its child.
    pub fn new(parents: Vec<Option<usize>>) -> Result<Self> {
        Self::default().extended(&parents)
    }

    /// The chain of `n` nodes (node `i` has parent `i - 1`).
    pub fn chain(n: usize) -> Self {
        Self {
            parents: (0..n).map(|i| i.checked_sub(1)).collect(),
            depth: (0..n).collect(),
        }
    }

    /// This tree with more nodes after its own (their parents index the whole tree).
    pub fn extended(&self, more: &[Option<usize>]) -> Result<Self> {
        let mut tree = self.clone();
        for &parent in more {
            let i = tree.parents.len();
            let depth = match parent {
                None => 0,
                Some(p) if p < i => tree.depth[p] + 1,
                Some(p) => return Err(bad_tree(format!("node {i} has parent {p}, not before it"))),
            };
            tree.parents.push(parent);
            tree.depth.push(depth);
        }
        Ok(tree)
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// True for the empty tree.
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// The parent of node `i` (`None` for a root or a node out of range).
    pub fn parent(&self, i: usize) -> Option<usize> {
        self.parents.get(i).copied().flatten()
    }

    /// The depth of node `i` (0 for a root); its position is the block's base plus this.
    pub fn depth(&self, i: usize) -> usize {
        self.depth.get(i).copied().unwrap_or(0)
    }

    /// True when node `a` is node `i` or one of its ancestors. O(depth of `i`).
    pub fn sees(&self, i: usize, a: usize) -> bool {
        let mut node = Some(i);
        while let Some(n) = node {
            if n == a {
                return true;
            }
            if n < a {
                return false;
            }
            node = self.parent(n);
        }
        false
    }

    /// For a kernel that masks a step of the block itself (a replayed CUDA graph's input),
    /// the step appending nodes `first .. first + t`: `1 + 2t` words — the nodes up to the
    /// step (`first + t`), each row's depth, each row's ancestors (bit `n` set when node `n`
    /// is the row's node or one of its ancestors). `None` past [`STEP_WORDS_MAX_NODES`]
    /// nodes or past the declared ones.
    pub fn step_words(&self, first: usize, t: usize) -> Option<Vec<u32>> {
        let nodes = first + t;
        if nodes > STEP_WORDS_MAX_NODES || nodes > self.len() {
            return None;
        }
        let mut masks = vec![0u32; nodes];
        for i in 0..nodes {
            masks[i] = (1u32 << i) | self.parent(i).map_or(0, |p| masks[p]);
        }
        let mut words = vec![nodes as u32];
        words.extend((first..nodes).map(|i| self.depth[i] as u32));
        words.extend(&masks[first..]);
        Some(words)
    }

    /// Refuses anything but a root-to-node path: `path[0]` a root, each next node a child of
    /// the one before. The empty path is allowed (nothing kept).
    pub fn check_path(&self, path: &[usize]) -> Result<()> {
        let mut expected: Option<usize> = None;
        for (j, &node) in path.iter().enumerate() {
            if node >= self.len() {
                return Err(bad_tree(format!(
                    "path node {node} outside the tree of {} nodes",
                    self.len()
                )));
            }
            if self.parents[node] != expected {
                return Err(bad_tree(format!(
                    "path step {j}: node {node} has parent {:?}, not {expected:?}",
                    self.parents[node]
                )));
            }
            expected = Some(node);
        }
        Ok(())
    }
}

/// Splits a checked path into runs `(dest, src, len)`: path step `dest + r` keeps node
/// `src + r` for `r < len`, with `src != dest` (nodes already in place are skipped). Because
/// a path increases strictly, `src >= dest` and copying the runs in order never overwrites a
/// node that a later run still reads.
pub(crate) fn path_moves(path: &[usize]) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for (dest, &src) in path.iter().enumerate() {
        if src == dest {
            continue;
        }
        match runs.last_mut() {
            Some((d, s, len)) if *d + *len == dest && *s + *len == src => *len += 1,
            _ => runs.push((dest, src, 1)),
        }
    }
    runs
}

fn bad_tree(msg: String) -> crate::error::Error {
    CacheError::BadTree(msg).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_ancestry_and_paths() {
        // 0 ─ 1 ─ 3
        //   └ 2 ─ 4 ─ 5
        let t = TokenTree::new(vec![None, Some(0), Some(0), Some(1), Some(2), Some(4)]).unwrap();
        assert_eq!(
            (0..6).map(|i| t.depth(i)).collect::<Vec<_>>(),
            [0, 1, 1, 2, 2, 3]
        );
        assert!(t.sees(5, 2) && t.sees(5, 0) && t.sees(5, 5) && !t.sees(5, 1));
        assert!(t.check_path(&[0, 2, 4, 5]).is_ok());
        assert!(t.check_path(&[0, 1, 4]).is_err());
        assert!(t.check_path(&[2]).is_err());
        assert!(TokenTree::new(vec![None, Some(1)]).is_err());
        assert_eq!(path_moves(&[0, 2, 4, 5]), [(1, 2, 1), (2, 4, 2)]);
        assert_eq!(path_moves(&[0, 1, 2]), []);
    }

    /// A step's words agree with `depth` and `sees` for every split of random trees into
    /// two appends, and stop at 32 nodes.
    #[test]
    fn step_words_match_depth_and_ancestry() {
        let mut state = 7u64;
        for n in 1..=STEP_WORDS_MAX_NODES {
            let parents: Vec<Option<usize>> = (0..n)
                .map(|i| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let r = (state >> 33) as usize % (i + 1);
                    (r < i).then_some(r)
                })
                .collect();
            let tree = TokenTree::new(parents).unwrap();
            for first in 0..n {
                let t = n - first;
                let w = tree.step_words(first, t).unwrap();
                assert_eq!(w.len(), 1 + 2 * t);
                assert_eq!(w[0] as usize, n);
                for r in 0..t {
                    let i = first + r;
                    assert_eq!(w[1 + r] as usize, tree.depth(i));
                    for a in 0..n {
                        assert_eq!((w[1 + t + r] >> a) & 1 == 1, tree.sees(i, a), "{i} {a}");
                    }
                }
            }
        }
        let big = TokenTree::chain(STEP_WORDS_MAX_NODES + 1);
        assert!(big.step_words(0, STEP_WORDS_MAX_NODES + 1).is_none());
        assert!(big.step_words(0, STEP_WORDS_MAX_NODES).is_some());
        assert!(TokenTree::chain(3).step_words(2, 2).is_none());
    }
}

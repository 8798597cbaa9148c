//! An independent model of a rotating cache's ring for the cache property tests: which
//! (position, token) each slot holds, written from the definition of canonical placement, so
//! that a restore's reachability is decided without the cache's own bookkeeping.

/// What a rotating layer's ring physically holds, written from the definition (the token at
/// position `p` goes to slot `p % capacity`) without the cache's bookkeeping: each slot's
/// (position, token), `None` when nothing valid was written since the last reset or restore.
#[derive(Debug, Clone)]
pub struct Ring {
    window: usize,
    /// Per slot: (position, token) last written there.
    pub slots: Vec<Option<(usize, u8)>>,
}

impl Ring {
    /// An empty ring of `capacity` slots for a sliding `window`.
    pub fn new(window: usize, capacity: usize) -> Self {
        Self {
            window,
            slots: vec![None; capacity],
        }
    }
    /// Forgets everything (a reset, or a restore that replaces the state).
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|x| *x = None);
    }
    /// Records `tokens` written at positions `first..`.
    pub fn write(&mut self, first: usize, tokens: &[u8]) {
        let cap = self.slots.len();
        for (i, &t) in tokens.iter().enumerate() {
            self.slots[(first + i) % cap] = Some((first + i, t));
        }
    }
    /// Slot of `pos` holds `token` at `pos`.
    pub fn holds(&self, pos: usize, token: u8) -> bool {
        self.slots[pos % self.slots.len()] == Some((pos, token))
    }
    /// First position a query at `pos` sees.
    pub fn needed(&self, pos: usize) -> usize {
        pos.saturating_sub(self.window - 1)
    }
    /// The live ring can serve a query at `target` of the history `tokens`.
    pub fn reachable(&self, target: usize, tokens: &[u8]) -> bool {
        (self.needed(target)..target).all(|p| self.holds(p, tokens[p]))
    }
    /// First position of the longest held run ending at `to`, at most `window` long: what a
    /// snapshot at `to` can hold.
    pub fn held_from(&self, to: usize, tokens: &[u8]) -> usize {
        let mut p = to;
        while p > to.saturating_sub(self.window) && self.holds(p - 1, tokens[p - 1]) {
            p -= 1;
        }
        p
    }
    /// A snapshot whose held run starts at `held_from` can serve a query at `target`.
    pub fn serves(&self, held_from: usize, target: usize) -> bool {
        (self.needed(target)..target).all(|p| p >= held_from)
    }
    /// After a restore to `target` from a snapshot holding `history[held_from..]`: the state is
    /// replaced by the last positions before `target` that fit the ring.
    pub fn restore(&mut self, held_from: usize, target: usize, history: &[u8]) {
        let start = held_from
            .max(target.saturating_sub(self.slots.len()))
            .min(target);
        self.clear();
        self.write(start, &history[start..target]);
    }
}

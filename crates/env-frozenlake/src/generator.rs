//! Random solvable maps, as gymnasium's `generate_random_map`.

use rand::Rng;

/// One cell of the lake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tile {
    Start,
    Frozen,
    Hole,
    Goal,
}

impl Tile {
    /// Holes and the goal end the episode.
    pub fn is_terminal(self) -> bool {
        matches!(self, Tile::Hole | Tile::Goal)
    }
}

/// An `size × size` lake, row-major; start at the top-left, goal at the bottom-right.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Map {
    pub size: usize,
    pub tiles: Vec<Tile>,
}

impl Map {
    /// Index of the start cell.
    pub fn start(&self) -> usize {
        0
    }

    /// Index of the goal cell.
    pub fn goal(&self) -> usize {
        self.size * self.size - 1
    }

    /// The cell reached from `pos` by moving `(dr, dc)`; moves off the map
    /// leave the player where it is (as gymnasium does).
    pub fn neighbour(&self, pos: usize, (dr, dc): (isize, isize)) -> usize {
        let n = self.size as isize;
        let r = (pos / self.size) as isize + dr;
        let c = (pos % self.size) as isize + dc;
        if r < 0 || r >= n || c < 0 || c >= n {
            pos
        } else {
            (r * n + c) as usize
        }
    }

    /// Whether the goal can be reached from the start without entering a hole.
    pub fn is_solvable(&self) -> bool {
        let mut seen = vec![false; self.tiles.len()];
        let mut stack = vec![self.start()];
        seen[self.start()] = true;
        while let Some(p) = stack.pop() {
            if p == self.goal() {
                return true;
            }
            for d in [(0, -1), (1, 0), (0, 1), (-1, 0)] {
                let q = self.neighbour(p, d);
                if !seen[q] && self.tiles[q] != Tile::Hole {
                    seen[q] = true;
                    stack.push(q);
                }
            }
        }
        false
    }

    /// Bytes identifying the map, for state keys.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.tiles.len() + 1);
        b.push(self.size as u8);
        b.extend(self.tiles.iter().map(|t| *t as u8));
        b
    }
}

/// Maps drawn at most before [`generate_map`] gives up: about 30 ms at
/// 16×16, while every default draws a solvable map within a few tries.
pub const MAX_MAP_DRAWS: usize = 10_000;

/// Draw maps until one is solvable: each cell is frozen with probability
/// `frozen_prob`, else a hole; start and goal are fixed corners. `size` must be
/// at least 2 and `frozen_prob` in (0, 1] (the caller validates both). `None`
/// after [`MAX_MAP_DRAWS`] unsolvable draws (a `frozen_prob` so low that
/// almost no map connects the corners).
pub fn generate_map<R: Rng>(rng: &mut R, size: usize, frozen_prob: f64) -> Option<Map> {
    (0..MAX_MAP_DRAWS).find_map(|_| {
        let mut tiles: Vec<Tile> = (0..size * size)
            .map(|_| {
                if rng.random::<f64>() < frozen_prob {
                    Tile::Frozen
                } else {
                    Tile::Hole
                }
            })
            .collect();
        tiles[0] = Tile::Start;
        tiles[size * size - 1] = Tile::Goal;
        let map = Map { size, tiles };
        map.is_solvable().then_some(map)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn generated_maps_are_always_solvable() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for size in [2, 4, 6, 8] {
            for _ in 0..200 {
                let m = generate_map(&mut rng, size, 0.8).unwrap();
                assert!(m.is_solvable());
                assert_eq!(m.tiles[0], Tile::Start);
                assert_eq!(m.tiles[size * size - 1], Tile::Goal);
            }
        }
    }

    #[test]
    fn generated_maps_contain_holes_at_about_the_drawn_rate() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let (mut holes, mut cells) = (0, 0);
        for _ in 0..500 {
            let m = generate_map(&mut rng, 6, 0.8).unwrap();
            holes += m.tiles.iter().filter(|t| **t == Tile::Hole).count();
            cells += m.tiles.len() - 2;
        }
        let rate = holes as f64 / cells as f64;
        // Rejection of unsolvable maps lowers the rate a little below 0.2.
        assert!(rate > 0.10 && rate < 0.21, "hole rate {rate}");
    }

    #[test]
    fn hopeless_frozen_prob_gives_up_within_the_budget() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let t = std::time::Instant::now();
        assert_eq!(generate_map(&mut rng, 16, 1e-9), None);
        // The budget bounds the work: well under a second even unoptimised.
        assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());
    }

    #[test]
    fn unsolvable_map_is_detected() {
        use Tile::*;
        let m = Map {
            size: 2,
            tiles: vec![Start, Hole, Hole, Goal],
        };
        assert!(!m.is_solvable());
    }
}

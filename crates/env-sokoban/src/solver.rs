//! The expert: breadth-first search over (player, boxes) states, which finds
//! a solution with the fewest moves (every move costs the same −0.1).

use std::collections::HashSet;

use agentrl_env_core::build_cancelled;

use crate::generator::{Room, State};
use crate::parser::{Action, ACTIONS};

/// States explored before the search gives up; rooms up to 16×16 with a few
/// boxes stay far below this, it only bounds pathological hand-made rooms.
pub const MAX_NODES: usize = 2_000_000;

/// The shortest move sequence that solves the room from `start`, if one of
/// at most `max_len` moves exists (an empty plan when already solved).
pub fn solve(room: &Room, start: &State, max_len: usize) -> Option<Vec<Action>> {
    solve_within(room, start, max_len, MAX_NODES).0
}

/// States expanded between two looks at [`build_cancelled`]: a look costs
/// a thread-local read, a few thousand states well under a millisecond.
const CANCEL_CHECK_EVERY: usize = 4096;

/// [`solve`] exploring at most `max_nodes` states; also returns how many it
/// explored, so that a caller drawing many rooms can bound its total work.
/// A cancelled build ([`build_cancelled`]) stops the search early, without
/// a solution.
pub fn solve_within(
    room: &Room,
    start: &State,
    max_len: usize,
    max_nodes: usize,
) -> (Option<Vec<Action>>, usize) {
    if start.is_solved(room) {
        return (Some(Vec::new()), 1);
    }
    // nodes[i] = (state, parent index, action from parent); BFS layer by layer.
    let mut nodes: Vec<(State, u32, Action)> = vec![(*start, u32::MAX, Action::Up)];
    let mut seen: HashSet<u64> = HashSet::new();
    seen.insert(start.key());
    let mut layer = 0..1;
    for _depth in 0..max_len {
        let end = nodes.len();
        for i in layer.clone() {
            if i % CANCEL_CHECK_EVERY == 0 && build_cancelled() {
                return (None, nodes.len());
            }
            let state = nodes[i].0;
            for a in ACTIONS {
                let Some((next, _)) = state.apply(room, a) else {
                    continue;
                };
                if !seen.insert(next.key()) {
                    continue;
                }
                nodes.push((next, i as u32, a));
                if next.is_solved(room) {
                    let mut plan = Vec::new();
                    let mut j = nodes.len() - 1;
                    while nodes[j].1 != u32::MAX {
                        plan.push(nodes[j].2);
                        j = nodes[j].1 as usize;
                    }
                    plan.reverse();
                    return (Some(plan), nodes.len());
                }
            }
        }
        if nodes.len() == end || nodes.len() > max_nodes {
            return (None, nodes.len());
        }
        layer = end..nodes.len();
    }
    (None, nodes.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::parse_room;

    #[test]
    fn finds_the_shortest_push_sequence() {
        let (room, s) = parse_room("######\n#P_XO#\n######").unwrap();
        assert_eq!(
            solve(&room, &s, 10).unwrap(),
            vec![Action::Right, Action::Right]
        );
        assert_eq!(solve(&room, &s, 1), None);
    }

    #[test]
    fn walks_around_to_push_from_the_other_side() {
        let (room, s) = parse_room("######\n#OX_P#\n#____#\n######").unwrap();
        let plan = solve(&room, &s, 20).unwrap();
        assert_eq!(plan, vec![Action::Left, Action::Left]);
        let (room, s) = parse_room("######\n#_XO_#\n#___P#\n######").unwrap();
        let plan = solve(&room, &s, 20).unwrap();
        // Around the box to its left: Left, Left, Left, Up, then push Right.
        assert_eq!(plan.len(), 5);
        assert_eq!(plan.last(), Some(&Action::Right));
    }

    #[test]
    fn reports_unsolvable_rooms() {
        // Box in a corner that is not a target.
        let (room, s) = parse_room("#####\n#X_O#\n#__P#\n#####").unwrap();
        assert_eq!(solve(&room, &s, 50), None);
    }
}

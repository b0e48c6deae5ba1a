//! The four grid moves FrozenLake and Sokoban share. Each game lists them in
//! its own RAGEN order, which fixes the 1-based indices a reply may use.

use crate::action::choose_action;
use crate::ActionError;

/// Longest move text accepted (after trimming); longer text is rejected
/// before any matching so that a runaway reply costs nothing.
pub const MAX_DIRECTION_LEN: usize = 64;

/// A move of the player on a grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Up,
    Down,
    Left,
    Right,
}

impl Direction {
    /// The canonical name (`Up`, `Down`, `Left`, `Right`).
    pub fn name(self) -> &'static str {
        match self {
            Direction::Up => "Up",
            Direction::Down => "Down",
            Direction::Left => "Left",
            Direction::Right => "Right",
        }
    }

    /// (row, column) offset of the move.
    pub fn delta(self) -> (isize, isize) {
        match self {
            Direction::Up => (-1, 0),
            Direction::Down => (1, 0),
            Direction::Left => (0, -1),
            Direction::Right => (0, 1),
        }
    }

    /// The opposite move.
    pub fn reverse(self) -> Direction {
        match self {
            Direction::Up => Direction::Down,
            Direction::Down => Direction::Up,
            Direction::Left => Direction::Right,
            Direction::Right => Direction::Left,
        }
    }

    /// The two moves at right angles to this one.
    pub fn perpendicular(self) -> [Direction; 2] {
        match self {
            Direction::Left | Direction::Right => [Direction::Up, Direction::Down],
            Direction::Up | Direction::Down => [Direction::Left, Direction::Right],
        }
    }
}

/// The names of `order`'s directions, in its order (a grid env's actions).
pub fn direction_names(order: &[Direction]) -> Vec<String> {
    order.iter().map(|d| d.name().to_string()).collect()
}

/// Parse one move: a direction name (case-insensitive, surrounding
/// whitespace ignored) or its 1-based index in `order`.
pub fn parse_direction(text: &str, order: &[Direction; 4]) -> Result<Direction, ActionError> {
    let names = order.map(Direction::name);
    let i = choose_action(text, &names, MAX_DIRECTION_LEN, || {
        format!("{} (or 1-4)", names.join(", "))
    })?;
    Ok(order[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_undoes_the_delta_and_perpendiculars_are_at_right_angles() {
        for d in [
            Direction::Up,
            Direction::Down,
            Direction::Left,
            Direction::Right,
        ] {
            let (a, b) = (d.delta(), d.reverse().delta());
            assert_eq!((a.0 + b.0, a.1 + b.1), (0, 0), "{d:?}");
            for p in d.perpendicular() {
                let q = p.delta();
                assert_eq!(a.0 * q.0 + a.1 * q.1, 0, "{d:?} ⟂ {p:?}");
            }
        }
    }

    #[test]
    fn indices_follow_the_given_order() {
        let order = [
            Direction::Left,
            Direction::Down,
            Direction::Right,
            Direction::Up,
        ];
        assert_eq!(parse_direction("1", &order), Ok(Direction::Left));
        assert_eq!(parse_direction("4", &order), Ok(Direction::Up));
        assert_eq!(parse_direction(" rIGHT ", &order), Ok(Direction::Right));
        let err = parse_direction("north", &order).unwrap_err().to_string();
        assert!(err.contains("Left, Down, Right, Up (or 1-4)"), "{err}");
    }
}

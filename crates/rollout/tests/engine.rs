//! The rollout engine against a scripted policy, a character codec and a tiny
//! corridor environment, so masks and rewards can be checked by hand.

use agentrl_env_core::{ActionError, Env, Split, Step, StepError, StepInfo, TaskSpec};
use agentrl_rollout::{
    expert_trajectory, run_rollouts, ChatCodec, CodecError, Generation, Policy, PolicyError,
    ReplyFormat, RolloutConfig, RolloutError, SamplingParams,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// One token per char; ids ≥ 1000 are the two specials.
struct CharCodec;
const IM_START: u32 = 1000;
const IM_END: u32 = 1001;

fn char_ids(text: &str) -> Vec<u32> {
    text.chars().map(|c| c as u32).collect()
}

impl ChatCodec for CharCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError> {
        Ok(char_ids(text))
    }
    fn decode(&self, ids: &[u32]) -> Result<String, CodecError> {
        Ok(ids
            .iter()
            .filter(|&&i| i < 1000)
            .filter_map(|&i| char::from_u32(i))
            .collect())
    }
    fn im_start(&self) -> u32 {
        IM_START
    }
    fn im_end(&self) -> u32 {
        IM_END
    }
}

/// Walk right from 0 to 3: "R" moves (+1 at the goal), "L" is invalid.
struct Corridor {
    spec: TaskSpec,
    pos: u32,
    steps: usize,
    invalid: usize,
}

impl Env for Corridor {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }
    fn instructions(&self) -> String {
        "Go R".into()
    }
    fn reset(&mut self) -> String {
        self.pos = 0;
        self.steps = 0;
        self.invalid = 0;
        self.observation()
    }
    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        if self.is_done() {
            return Err(StepError::EpisodeOver);
        }
        if action != "R" {
            self.invalid += 1;
            return Err(ActionError::Unknown {
                action: action.into(),
                expected: "R".into(),
            }
            .into());
        }
        self.pos += 1;
        self.steps += 1;
        Ok(Step {
            observation: self.observation(),
            reward: if self.pos == 3 { 1.0 } else { 0.0 },
            done: self.is_done(),
            success: self.is_success(),
            info: StepInfo {
                effective: true,
                ..Default::default()
            },
        })
    }
    fn observation(&self) -> String {
        format!("at {}", self.pos)
    }
    fn available_actions(&self) -> Vec<String> {
        vec!["R".into()]
    }
    fn state_key(&self) -> u64 {
        self.pos as u64
    }
    fn expert_action(&mut self) -> Option<String> {
        (!self.is_done()).then(|| "R".to_string())
    }
    fn steps(&self) -> usize {
        self.steps
    }
    fn invalid_actions(&self) -> usize {
        self.invalid
    }
    fn max_steps(&self) -> usize {
        10
    }
    fn is_done(&self) -> bool {
        self.pos >= 3
    }
    fn is_success(&self) -> bool {
        self.pos >= 3
    }
}

fn corridor() -> Box<dyn Env> {
    Box::new(Corridor {
        spec: TaskSpec::new("corridor", Split::Train, "easy", 0),
        pos: 0,
        steps: 0,
        invalid: 0,
    })
}

/// Replies from a fixed script, one per call per prompt.
struct Scripted {
    replies: Vec<&'static str>,
    calls: usize,
}

impl Policy for Scripted {
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        _rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Generation>, PolicyError> {
        let reply = self.replies[self.calls.min(self.replies.len() - 1)];
        self.calls += 1;
        Ok(prompts
            .iter()
            .map(|_| {
                let mut tokens = char_ids(reply);
                tokens.truncate(params.max_new_tokens - 1);
                tokens.push(IM_END);
                let logprobs = vec![-0.5; tokens.len()];
                Generation {
                    tokens,
                    logprobs,
                    stopped: true,
                }
            })
            .collect())
    }
}

fn cfg() -> RolloutConfig {
    RolloutConfig {
        max_turns: 5,
        max_actions_per_turn: 2,
        max_actions: 10,
        response_length: 64,
        ..Default::default()
    }
}

#[test]
fn loss_mask_covers_exactly_the_policy_replies() {
    let mut policy = Scripted {
        replies: vec![
            "<think></think><answer>R || R</answer>",
            "<think></think><answer>R</answer>",
        ],
        calls: 0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let trajs = run_rollouts(
        &mut policy,
        &CharCodec,
        vec![corridor()],
        &[0],
        &cfg(),
        &mut rng,
    )
    .unwrap();
    let t = &trajs[0];
    assert!(t.success);
    assert_eq!(t.turns.len(), 2);
    // Policy tokens are exactly the two replies with their end-of-turn token.
    let replies_len: usize = [
        "<think></think><answer>R || R</answer>",
        "<think></think><answer>R</answer>",
    ]
    .iter()
    .map(|r| r.chars().count() + 1)
    .sum();
    assert_eq!(t.generated_tokens(), replies_len);
    for turn in &t.turns {
        assert!(t.loss_mask[turn.start..turn.end].iter().all(|&m| m == 1));
        assert_eq!(t.tokens[turn.end - 1], IM_END);
    }
    // Nothing the environment or template wrote is trained on.
    let masked: usize = t.loss_mask.iter().map(|&m| m as usize).sum();
    assert_eq!(masked, replies_len);
    assert_eq!(t.tokens.len(), t.loss_mask.len());
    assert_eq!(t.tokens.len(), t.sample_logprobs.len());
}

#[test]
fn outcome_reward_lands_on_last_policy_token() {
    let mut policy = Scripted {
        replies: vec![
            "<think></think><answer>R || R</answer>",
            "<think></think><answer>R</answer>",
        ],
        calls: 0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let t = run_rollouts(
        &mut policy,
        &CharCodec,
        vec![corridor()],
        &[0],
        &cfg(),
        &mut rng,
    )
    .unwrap()
    .remove(0);
    let r = t.token_rewards(false);
    let last_policy = t.loss_mask.iter().rposition(|&m| m == 1).unwrap();
    assert_eq!(r[last_policy], 1.0);
    assert_eq!(r.iter().sum::<f32>(), 1.0);
    assert_eq!(t.loss_mask[last_policy], 1);
    let per_turn = t.token_rewards(true);
    for (i, &x) in per_turn.iter().enumerate() {
        if x != 0.0 {
            assert_eq!(t.loss_mask[i], 1, "reward on a non-policy token at {i}");
        }
    }
}

#[test]
fn unparseable_reply_costs_format_penalty_and_is_a_noop() {
    let mut policy = Scripted {
        replies: vec!["R R R"],
        calls: 0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let t = run_rollouts(
        &mut policy,
        &CharCodec,
        vec![corridor()],
        &[0],
        &cfg(),
        &mut rng,
    )
    .unwrap()
    .remove(0);
    assert_eq!(t.turns.len(), 5, "runs to the turn limit");
    assert!(t.turns.iter().all(|x| x.format_error && x.penalty == -0.1));
    assert_eq!(t.env_steps, 0);
    assert!((t.score() + 0.5).abs() < 1e-6);
    assert_eq!(t.raw_score(), 0.0, "raw score excludes penalties");
}

#[test]
fn invalid_action_is_penalised_and_counted() {
    let mut policy = Scripted {
        replies: vec!["<think></think><answer>L || R</answer>"],
        calls: 0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let t = run_rollouts(
        &mut policy,
        &CharCodec,
        vec![corridor()],
        &[0],
        &cfg(),
        &mut rng,
    )
    .unwrap()
    .remove(0);
    assert_eq!(t.turns[0].invalid_actions, 1);
    assert_eq!(t.turns[0].penalty, -0.1);
    assert_eq!(t.invalid_actions(), 3);
    assert!(t.success);
}

#[test]
fn action_budget_ends_the_trajectory() {
    let c = RolloutConfig {
        max_actions: 1,
        ..cfg()
    };
    let mut policy = Scripted {
        replies: vec!["<think></think><answer>R || R</answer>"],
        calls: 0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let t = run_rollouts(
        &mut policy,
        &CharCodec,
        vec![corridor()],
        &[0],
        &c,
        &mut rng,
    )
    .unwrap()
    .remove(0);
    assert_eq!(t.env_steps, 1);
    assert_eq!(t.turns.len(), 1);
    assert!(!t.success);
}

#[test]
fn context_limit_truncates() {
    let c = RolloutConfig {
        max_context_tokens: 400,
        max_actions_per_turn: 1,
        ..cfg()
    };
    let mut policy = Scripted {
        replies: vec!["<think></think><answer>R</answer>"],
        calls: 0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let t = run_rollouts(
        &mut policy,
        &CharCodec,
        vec![corridor()],
        &[0],
        &c,
        &mut rng,
    )
    .unwrap()
    .remove(0);
    assert!(t.truncated);
    assert!(t.turns.len() < 3, "stopped before the corridor's end");
    assert!(t.tokens.len() <= 400);
    // A prompt that cannot fit a reply is not played at all.
    let c = RolloutConfig {
        max_context_tokens: 50,
        ..cfg()
    };
    let t = run_rollouts(
        &mut policy,
        &CharCodec,
        vec![corridor()],
        &[0],
        &c,
        &mut rng,
    )
    .unwrap()
    .remove(0);
    assert!(t.truncated && t.turns.is_empty());
}

#[test]
fn expert_demo_matches_rollout_layout() {
    let c = cfg();
    let demo = expert_trajectory(
        corridor(),
        0,
        &CharCodec,
        &c,
        2,
        0.0,
        &mut ChaCha8Rng::seed_from_u64(0),
    )
    .unwrap();
    assert!(demo.success);
    assert_eq!(demo.turns.len(), 2);
    assert_eq!(demo.turns[0].actions, vec!["R", "R"]);
    // The same replies through the engine give the same tokens and mask.
    let mut policy = Scripted {
        replies: vec![
            "<think></think><answer>R || R</answer>",
            "<think></think><answer>R</answer>",
        ],
        calls: 0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let t = run_rollouts(
        &mut policy,
        &CharCodec,
        vec![corridor()],
        &[0],
        &c,
        &mut rng,
    )
    .unwrap()
    .remove(0);
    assert_eq!(demo.tokens, t.tokens);
    assert_eq!(demo.loss_mask, t.loss_mask);
    assert_eq!(
        ReplyFormat::ThinkAnswer
            .parse(&demo.turns[1].reply, 2)
            .unwrap(),
        vec!["R"]
    );
}

/// [`CharCodec`] whose decoding fails: the policy's reply cannot be read.
struct UndecodableCodec;

impl ChatCodec for UndecodableCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError> {
        CharCodec.encode(text)
    }
    fn decode(&self, ids: &[u32]) -> Result<String, CodecError> {
        Err(CodecError::Decode {
            count: ids.len(),
            reason: "test codec refuses".into(),
        })
    }
    fn im_start(&self) -> u32 {
        IM_START
    }
    fn im_end(&self) -> u32 {
        IM_END
    }
}

#[test]
fn a_tokenizer_error_fails_the_rollout_instead_of_playing_empty_text() {
    let mut policy = Scripted {
        replies: vec!["<think></think><answer>R</answer>"],
        calls: 0,
    };
    let err = run_rollouts(
        &mut policy,
        &UndecodableCodec,
        vec![corridor()],
        &[0],
        &cfg(),
        &mut ChaCha8Rng::seed_from_u64(0),
    )
    .unwrap_err();
    assert!(
        matches!(err, RolloutError::Codec(CodecError::Decode { count, .. }) if count > 0),
        "{err}"
    );
    assert!(err.to_string().contains("test codec refuses"), "{err}");
}

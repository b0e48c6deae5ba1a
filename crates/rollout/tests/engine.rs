//! The rollout engine against a scripted policy, a character codec and a tiny
//! corridor environment, so masks and rewards can be checked by hand.

use agentrl_env_core::{ActionError, Env, Split, Step, StepError, StepInfo, TaskSpec};
use agentrl_rollout::{
    expert_demonstrations, play_episodes, run_rollouts, state_prompt, Actor, ChatCodec, CodecError,
    ExpertActor, Followup, Generation, Policy, PolicyActor, PolicyFn, RandomActor, RandomMoves,
    ReplyFormat, RolloutConfig, RolloutError, SamplingParams, Trajectory, SYSTEM_PROMPT,
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
/// A walled corridor lists no valid action and has no expert move.
struct Corridor {
    spec: TaskSpec,
    pos: u32,
    steps: usize,
    invalid: usize,
    walled: bool,
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
        match self.walled {
            true => vec![],
            false => vec!["R".into()],
        }
    }
    fn state_key(&self) -> u64 {
        self.pos as u64
    }
    fn expert_action(&mut self) -> Option<String> {
        (!self.is_done() && !self.walled).then(|| "R".to_string())
    }
    fn perception(&self) -> Option<String> {
        Some(format!("at {}", self.pos))
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
        walled: false,
    })
}

/// Replies from a fixed script, one per call per prompt.
fn scripted(replies: &[&'static str]) -> impl Policy {
    let replies = replies.to_vec();
    let mut calls = 0;
    PolicyFn::new(
        move |prompts: &[Vec<u32>], params: &SamplingParams, _: &mut ChaCha8Rng| {
            let reply = replies[calls.min(replies.len() - 1)];
            calls += 1;
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
        },
    )
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

/// The two replies that walk the corridor: two steps, then one.
const WALK: [&str; 2] = [
    "<think></think><answer>R || R</answer>",
    "<think></think><answer>R</answer>",
];

/// One corridor episode played by a scripted policy replying `replies`.
fn play(replies: &[&'static str], c: &RolloutConfig) -> Trajectory {
    let mut policy = scripted(replies);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    run_rollouts(&mut policy, &CharCodec, vec![corridor()], &[0], c, &mut rng)
        .unwrap()
        .remove(0)
}

#[test]
fn loss_mask_covers_exactly_the_policy_replies() {
    let t = play(&WALK, &cfg());
    assert!(t.success);
    assert_eq!(t.turns.len(), 2);
    // Policy tokens are exactly the two replies with their end-of-turn token.
    let replies_len: usize = WALK.iter().map(|r| r.chars().count() + 1).sum();
    assert_eq!(t.generated_tokens(), replies_len);
    for turn in &t.turns {
        assert!(t.loss_mask[turn.start..turn.end].iter().all(|&m| m == 1));
        assert_eq!(t.tokens[turn.end - 1], IM_END);
    }
    // Nothing the environment or template wrote is trained on.
    let masked: usize = t.loss_mask.iter().map(|&m| m as usize).sum();
    assert_eq!(masked, replies_len);
    assert_eq!(t.tokens.len(), t.loss_mask.len());
}

#[test]
fn outcome_reward_lands_on_last_policy_token() {
    let t = play(&WALK, &cfg());
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
    let t = play(&["R R R"], &cfg());
    assert_eq!(t.turns.len(), 5, "runs to the turn limit");
    assert!(t.turns.iter().all(|x| x.format_error && x.penalty == -0.1));
    assert_eq!(t.env_steps, 0);
    assert!((t.score() + 0.5).abs() < 1e-6);
    assert_eq!(t.raw_score(), 0.0, "raw score excludes penalties");
}

#[test]
fn invalid_action_is_penalised_and_counted() {
    let t = play(&["<think></think><answer>L || R</answer>"], &cfg());
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
    let t = play(&[WALK[0]], &c);
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
    let t = play(&[WALK[1]], &c);
    assert!(t.truncated);
    assert!(t.turns.len() < 3, "stopped before the corridor's end");
    assert!(t.tokens.len() <= 400);
    // A prompt that cannot fit a reply is not played at all.
    let c = RolloutConfig {
        max_context_tokens: 50,
        ..cfg()
    };
    let t = play(&[WALK[1]], &c);
    assert!(t.truncated && t.turns.is_empty());
}

/// The expert's demonstration of one corridor, `per_turn` moves a turn.
fn demo(per_turn: usize, c: &RolloutConfig) -> Trajectory {
    let mut expert = ExpertActor::new(per_turn, 0.0);
    expert_demonstrations(&mut expert, &CharCodec, vec![corridor()], &[0], c)
        .unwrap()
        .remove(0)
}

#[test]
fn expert_demo_matches_rollout_layout() {
    let c = cfg();
    let demo = demo(2, &c);
    assert!(demo.success);
    assert_eq!(demo.turns.len(), 2);
    assert_eq!(demo.turns[0].actions, vec!["R", "R"]);
    // The same replies through the engine give the same tokens and mask.
    let t = play(&WALK, &c);
    assert_eq!(demo.tokens, t.tokens);
    assert_eq!(demo.loss_mask, t.loss_mask);
    assert_eq!(
        ReplyFormat::ThinkAnswer
            .parse(&demo.turns[1].reply, 2)
            .unwrap(),
        vec!["R"]
    );
}

/// With the pre-fill every prompt ends with `<think>`, which is context:
/// the policy writes the rest, its reply is read with the pre-fill in
/// front, and the expert's demonstrations lay out exactly the same tokens.
#[test]
fn a_prefilled_prompt_opens_the_reply_and_stays_out_of_the_loss() {
    let c = RolloutConfig {
        prefill: true,
        ..cfg()
    };
    const WRITTEN: [&str; 2] = [
        "</think><answer>R || R</answer>",
        "</think><answer>R</answer>",
    ];
    let t = play(&WRITTEN, &c);
    assert!(t.success, "{:?}", t.turns);
    assert_eq!(t.turns.len(), 2);
    for (turn, written) in t.turns.iter().zip(WRITTEN) {
        let before = CharCodec.decode(&t.tokens[..turn.start]).unwrap();
        assert!(before.ends_with("assistant\n<think>"), "{before:?}");
        assert_eq!(turn.reply, format!("<think>{written}"));
        assert_eq!(
            CharCodec.decode(&t.tokens[turn.start..turn.end]).unwrap(),
            written
        );
    }
    let masked: usize = t.loss_mask.iter().map(|&m| m as usize).sum();
    let written_len: usize = WRITTEN.iter().map(|r| r.chars().count() + 1).sum();
    assert_eq!(masked, written_len);
    // The expert's demonstration: the same tokens and mask.
    let demo = demo(2, &c);
    assert_eq!(demo.tokens, t.tokens);
    assert_eq!(demo.loss_mask, t.loss_mask);
    // Without the pre-fill the same written text is a format error.
    let t = play(&WRITTEN, &cfg());
    assert!(t.turns.iter().all(|x| x.format_error));
}

/// The prompt states the tighter of the two budgets: an env that allows
/// fewer steps than the rollout's action budget is shown its own.
#[test]
fn the_prompt_states_the_env_step_limit_when_it_is_tighter() {
    let c = RolloutConfig {
        max_actions: 50,
        ..cfg()
    };
    let t = play(&WALK, &c);
    let opening = CharCodec.decode(&t.tokens[..t.turns[0].start]).unwrap();
    assert!(opening.contains("You have 10 actions left."), "{opening}");
    let second = CharCodec
        .decode(&t.tokens[t.turns[0].end..t.turns[1].start])
        .unwrap();
    assert!(second.contains("You have 8 actions left."), "{second}");
}

#[test]
fn a_perceiving_expert_thinks_what_it_sees_before_it_moves() {
    let c = cfg();
    let mut expert = ExpertActor::new(2, 0.0).perceiving(true);
    let demo = expert_demonstrations(&mut expert, &CharCodec, vec![corridor()], &[0], &c)
        .unwrap()
        .remove(0);
    let replies: Vec<&str> = demo.turns.iter().map(|t| t.reply.as_str()).collect();
    assert_eq!(
        replies,
        [
            "<think>at 0</think><answer>R || R</answer>",
            "<think>at 2</think><answer>R</answer>"
        ]
    );
    // The thought is policy text like the rest of the reply.
    let start = demo.turns[0].start;
    assert_eq!(
        &demo.tokens[start..start + 15],
        &char_ids("<think>at 0</think>")[..15]
    );
    assert!(demo.loss_mask[start..demo.turns[0].end]
        .iter()
        .all(|&m| m == 1));
}

#[test]
fn show_perception_puts_the_reading_under_each_state_and_out_of_the_loss() {
    let shown = RolloutConfig {
        show_perception: true,
        ..cfg()
    };
    let played = demo(2, &shown);
    let text = CharCodec.decode(&played.tokens).unwrap();
    // Each turn's state message carries the reading of that state.
    let first = text.find("Reading: at 0\n").expect("turn 1's reading");
    let second = text.find("Reading: at 2\n").expect("turn 2's reading");
    assert!(text[..first].contains("Turn 1:\nState:\n"));
    assert!(text[first..second].contains("Turn 2:\nState:\n"));
    // Context, never trained: every reading lies before its turn's reply.
    for (turn, reading) in played.turns.iter().zip([first, second]) {
        assert!(reading < turn.start);
        assert!(played.loss_mask[reading..reading + 13]
            .iter()
            .all(|&m| m == 0));
    }
    // Off (the default), the prompt shows no reading at all.
    let plain = CharCodec.decode(&demo(2, &cfg()).tokens).unwrap();
    assert!(!plain.contains("Reading:"));
    // The perception prompts match the rollout's.
    let (first_prompt, _) = corridor_state_prompts(&shown);
    assert_eq!(first_prompt, played.tokens[..played.turns[0].start]);
}

/// The state prompts of the corridor's turn 1 (fresh) and turn 2 (after
/// the two-move expert's first turn, `R || R`).
fn corridor_state_prompts(c: &RolloutConfig) -> (Vec<u32>, Vec<u32>) {
    let mut env = corridor();
    env.reset();
    let first = state_prompt(&CharCodec, &*env, c, 1, c.max_actions, 0.0).unwrap();
    env.step("R").unwrap();
    env.step("R").unwrap();
    let second = state_prompt(&CharCodec, &*env, c, 2, c.max_actions - 2, 0.0).unwrap();
    (first, second)
}

#[test]
fn a_state_prompt_ends_as_the_rollouts_prompt_of_that_state_does() {
    let c = cfg();
    let demo = demo(2, &c);
    let (first, second) = corridor_state_prompts(&c);
    // Turn 1: exactly the episode's opening.
    assert_eq!(first, demo.tokens[..demo.turns[0].start]);
    // Turn 2 (two steps in): the system prompt, then the state's message
    // and the assistant header just as the dialogue's second prompt ends.
    let system = CharCodec.message("system", SYSTEM_PROMPT).unwrap();
    let user_header = CharCodec.assistant_header_for("user").unwrap();
    assert_eq!(second[..system.len()], system[..]);
    let state_part = &second[system.len() + user_header.len()..];
    assert!(CharCodec
        .decode(state_part)
        .unwrap()
        .starts_with("Turn 2:\nState:\n"));
    assert!(demo.tokens[..demo.turns[1].start].ends_with(state_part));
}

#[test]
fn with_an_empty_history_window_a_state_prompt_is_the_rollouts_prompt_at_every_turn() {
    let c = RolloutConfig {
        history_turns: Some(0),
        ..cfg()
    };
    let demo = demo(2, &c);
    assert_eq!(demo.sequence_starts.len(), 1);
    let (first, second) = corridor_state_prompts(&c);
    assert_eq!(first, demo.tokens[..demo.turns[0].start]);
    assert_eq!(
        second,
        demo.tokens[demo.sequence_starts[0]..demo.turns[1].start]
    );
}

/// Without repeated instructions a window's later prompts drop the
/// instructions and the reply format, the first keeps them, and a state
/// prompt still matches the rollout's at every turn.
#[test]
fn instructions_shown_once_leave_later_window_prompts_and_state_prompts_alike() {
    let c = RolloutConfig {
        history_turns: Some(0),
        repeat_instructions: false,
        ..cfg()
    };
    let demo = demo(2, &c);
    let [second_start] = demo.sequence_starts[..] else {
        panic!("{:?}", demo.sequence_starts)
    };
    let first_text = CharCodec.decode(&demo.tokens[..second_start]).unwrap();
    let second_text = CharCodec
        .decode(&demo.tokens[second_start..demo.turns[1].start])
        .unwrap();
    let format = c.format.instruction(c.max_actions_per_turn);
    assert!(first_text.contains("Go R") && first_text.contains(&format));
    assert!(!second_text.contains("Go R") && !second_text.contains(&format));
    assert!(second_text.contains("Turn 2:\nState:\n"), "{second_text}");
    let repeated = crate::demo(
        2,
        &RolloutConfig {
            repeat_instructions: true,
            ..c.clone()
        },
    );
    assert!(demo.tokens.len() < repeated.tokens.len());
    let (first, second) = corridor_state_prompts(&c);
    assert_eq!(first, demo.tokens[..demo.turns[0].start]);
    assert_eq!(second, demo.tokens[second_start..demo.turns[1].start]);
}

/// Six steps, each of four moves valid; the expert always says "A", and
/// only "B" is safe.
struct Crossroads {
    spec: TaskSpec,
    steps: usize,
}

impl Env for Crossroads {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }
    fn instructions(&self) -> String {
        "Pick".into()
    }
    fn reset(&mut self) -> String {
        self.steps = 0;
        self.observation()
    }
    fn step(&mut self, _action: &str) -> Result<Step, StepError> {
        self.steps += 1;
        Ok(Step {
            observation: self.observation(),
            reward: 0.0,
            done: self.is_done(),
            success: false,
            info: StepInfo::default(),
        })
    }
    fn observation(&self) -> String {
        format!("step {}", self.steps)
    }
    fn available_actions(&self) -> Vec<String> {
        ["A", "B", "C", "D"].map(String::from).to_vec()
    }
    fn safe_actions(&self) -> Vec<String> {
        vec!["B".into()]
    }
    fn state_key(&self) -> u64 {
        self.steps as u64
    }
    fn expert_action(&mut self) -> Option<String> {
        (!self.is_done()).then(|| "A".to_string())
    }
    fn steps(&self) -> usize {
        self.steps
    }
    fn max_steps(&self) -> usize {
        6
    }
    fn is_done(&self) -> bool {
        self.steps >= 6
    }
}

#[test]
fn a_noisy_experts_random_moves_come_from_the_safe_actions_when_asked() {
    let c = RolloutConfig {
        max_turns: 6,
        max_actions_per_turn: 1,
        max_actions: 6,
        ..cfg()
    };
    let moves = |random_moves| {
        let mut expert = ExpertActor::new(1, 1.0).random_moves(random_moves);
        let envs: Vec<Box<dyn Env>> = (0..8)
            .map(|seed| {
                Box::new(Crossroads {
                    spec: TaskSpec::new("crossroads", Split::Train, "easy", seed),
                    steps: 0,
                }) as Box<dyn Env>
            })
            .collect();
        let groups: Vec<usize> = (0..8).collect();
        expert_demonstrations(&mut expert, &CharCodec, envs, &groups, &c)
            .unwrap()
            .iter()
            .flat_map(|t| t.turns.iter().flat_map(|turn| turn.actions.clone()))
            .collect::<Vec<String>>()
    };
    let safe = moves(RandomMoves::Safe);
    assert_eq!(safe.len(), 48);
    assert!(safe.iter().all(|m| m == "B"), "{safe:?}");
    // Drawn from every valid action, the 48 moves are not all one.
    let valid = moves(RandomMoves::Valid);
    assert_eq!(valid.len(), 48);
    assert!(["A", "B", "C", "D"]
        .iter()
        .all(|m| valid.iter().any(|v| v == m)));
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
    let mut policy = scripted(&["<think></think><answer>R</answer>"]);
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

/// Play `envs` with a scripted `actor` and no conversation.
fn play_scripted(actor: &mut dyn Actor, mut envs: Vec<Box<dyn Env>>) -> Vec<Trajectory> {
    let groups: Vec<usize> = (0..envs.len()).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    play_episodes(
        actor,
        None,
        &mut envs,
        &groups,
        &RolloutConfig::scripted(),
        &mut rng,
    )
    .unwrap()
}

#[test]
fn scripted_play_needs_no_conversation() {
    let t = play_scripted(&mut ExpertActor::new(1, 0.0), vec![corridor()]).remove(0);
    assert!(t.success);
    assert_eq!((t.turns.len(), t.env_steps), (3, 3));
    assert!(t.tokens.is_empty() && t.loss_mask.is_empty());
    assert_eq!(t.score(), 1.0);
    let r = play_scripted(&mut RandomActor::new(0), vec![corridor()]).remove(0);
    assert!(r.success, "the corridor's only valid move is R");
}

#[test]
fn a_scripted_player_with_no_move_ends_its_episode() {
    let walled = || -> Box<dyn Env> {
        Box::new(Corridor {
            spec: TaskSpec::new("corridor", Split::Train, "easy", 0),
            pos: 0,
            steps: 0,
            invalid: 0,
            walled: true,
        })
    };
    let players: [&mut dyn Actor; 2] = [&mut RandomActor::new(0), &mut ExpertActor::new(1, 0.0)];
    for actor in players {
        let t = play_scripted(actor, vec![walled()]).remove(0);
        assert!(t.turns.is_empty() && t.env_steps == 0 && !t.success);
    }
}

#[test]
fn random_play_is_a_pure_function_of_seed_and_task() {
    let specs = |n: u64| -> Vec<Box<dyn Env>> {
        (0..n)
            .map(|s| {
                agentrl_envs::make_env(
                    &TaskSpec::new("frozenlake", Split::Val, "easy", s),
                    &Default::default(),
                )
                .unwrap()
            })
            .collect()
    };
    let actions = |trajs: &[Trajectory]| -> Vec<Vec<String>> {
        trajs
            .iter()
            .map(|t| t.turns.iter().flat_map(|x| x.actions.clone()).collect())
            .collect()
    };
    let all = actions(&play_scripted(&mut RandomActor::new(5), specs(4)));
    assert_eq!(
        all,
        actions(&play_scripted(&mut RandomActor::new(5), specs(4)))
    );
    // A task plays the same whatever else shares its batch.
    let alone = actions(&play_scripted(&mut RandomActor::new(5), specs(1)));
    assert_eq!(alone[0], all[0]);
    assert_ne!(
        all,
        actions(&play_scripted(&mut RandomActor::new(6), specs(4)))
    );
}

#[test]
fn a_models_reply_without_a_conversation_is_an_error() {
    let mut policy = scripted(&[WALK[1]]);
    let mut actor = PolicyActor::new(&mut policy, cfg().sampling(IM_END));
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let e = play_episodes(&mut actor, None, &mut [corridor()], &[0], &cfg(), &mut rng);
    assert!(matches!(e, Err(RolloutError::NoConversation)));
}

/// What each sequence of a trajectory reads as text.
fn sequence_texts(t: &Trajectory) -> Vec<String> {
    t.sequences()
        .into_iter()
        .map(|s| CharCodec.decode(s).unwrap())
        .collect()
}

#[test]
fn history_window_gives_each_turn_its_own_sequence() {
    let one_step = ["<think></think><answer>R</answer>"];
    for k in [0, 1] {
        let c = RolloutConfig {
            history_turns: Some(k),
            ..cfg()
        };
        let t = play(&one_step, &c);
        assert!(t.success);
        assert_eq!(t.turns.len(), 3);
        let ranges = t.sequence_ranges();
        assert_eq!(ranges.len(), 3, "one sequence per turn (k = {k})");
        assert_one_reply_per_sequence(&t);
        for (turn, range) in t.turns.iter().zip(&ranges) {
            // Each sequence opens with the system message and ends with its reply.
            assert_eq!(t.tokens[range.start], IM_START);
            assert_eq!(turn.end, range.end);
        }
        let texts = sequence_texts(&t);
        for (i, text) in texts.iter().enumerate() {
            // Every prompt is whole: the instructions, then the state now.
            assert!(text.contains("Go R"), "turn {}: {text}", i + 1);
            assert!(text.contains(&format!("Turn {}:\nState:\nat {i}\n", i + 1)));
            assert_eq!(
                text.matches("State:").count(),
                1 + k.min(i),
                "turn {}",
                i + 1
            );
        }
        if k == 1 {
            // The window holds the last turn only: its state, actions and reward.
            assert!(texts[2]
                .contains("Your last 1 turns:\nTurn 2:\nState:\nat 1\nActions: R\nReward: 0.00\n"));
            assert!(!texts[2].contains("at 0"));
        } else {
            assert!(!texts[1].contains("Your last") && texts[1].contains("Reward: 0.00\n"));
        }
    }
}

#[test]
fn history_window_matches_the_dialogue_turn_for_turn() {
    // The same replies score the same rewards, actions and policy tokens with
    // or without the window; only the prompts differ.
    let full = play(&WALK, &cfg());
    let windowed = play(
        &WALK,
        &RolloutConfig {
            history_turns: Some(2),
            ..cfg()
        },
    );
    assert!(full.sequence_starts.is_empty());
    assert_eq!(windowed.sequence_starts.len(), 1);
    assert_eq!(full.generated_tokens(), windowed.generated_tokens());
    for (a, b) in full.turns.iter().zip(&windowed.turns) {
        assert_eq!((&a.actions, a.reward()), (&b.actions, b.reward()));
        assert_eq!(full.tokens[a.start..a.end], windowed.tokens[b.start..b.end]);
    }
    assert_eq!(full.score(), windowed.score());
}

#[test]
fn history_window_limits_each_sequence_not_the_trajectory() {
    // Four one-step turns of ~200 tokens each fit a 300-token context with a
    // window of 0, though the whole dialogue would not.
    let c = RolloutConfig {
        max_context_tokens: 300,
        max_actions_per_turn: 1,
        ..cfg()
    };
    let one_step = ["<think></think><answer>R</answer>"];
    assert!(play(&one_step, &c).truncated);
    let t = play(
        &one_step,
        &RolloutConfig {
            history_turns: Some(0),
            ..c
        },
    );
    assert!(!t.truncated && t.success);
    assert!(t.sequence_ranges().iter().all(|r| r.len() <= 300));
}

/// Policy tokens of each sequence: exactly its turn's reply.
fn assert_one_reply_per_sequence(t: &Trajectory) {
    let ranges = t.sequence_ranges();
    assert_eq!(ranges.len(), t.turns.len());
    for (turn, range) in t.turns.iter().zip(&ranges) {
        let policy: Vec<usize> = range.clone().filter(|&i| t.loss_mask[i] == 1).collect();
        assert_eq!(policy, (turn.start..turn.end).collect::<Vec<_>>());
    }
}

#[test]
fn plan_agent_keeps_its_first_thoughts_in_every_prompt() {
    let c = RolloutConfig {
        agent: agentrl_rollout::AgentStrategy::Plan,
        history_turns: Some(0),
        max_actions_per_turn: 1,
        ..cfg()
    };
    let reply = ["<think>walk right</think><answer>R</answer>"];
    let t = play(&reply, &c);
    assert!(t.success);
    assert_one_reply_per_sequence(&t);
    let texts = sequence_texts(&t);
    assert!(texts[0].contains("First write a short plan"));
    assert!(!texts[0].contains("Your plan:"));
    for text in &texts[1..] {
        assert!(text.contains("Your plan: walk right\n"), "{text}");
        assert!(!text.contains("First write a short plan"));
    }
}

#[test]
fn reflect_agent_reflects_after_a_failure_and_keeps_the_reflection() {
    let replies = [
        "<think></think><answer>L</answer>",
        "<think>L is a wall</think><answer>R</answer>",
        "<think></think><answer>R</answer>",
    ];
    let c = RolloutConfig {
        agent: agentrl_rollout::AgentStrategy::Reflect,
        history_turns: Some(0),
        max_actions_per_turn: 1,
        ..cfg()
    };
    let t = play(&replies, &c);
    assert!(t.success);
    assert_one_reply_per_sequence(&t);
    let texts = sequence_texts(&t);
    assert!(!texts[0].contains("reflect"));
    assert!(texts[1].contains("Your last reply failed. Before acting, reflect"));
    assert!(!texts[1].contains("Your reflection:"));
    for text in &texts[2..] {
        assert!(text.contains("Your reflection: L is a wall\n"), "{text}");
        assert!(!text.contains("Your last reply failed"));
    }
    // In a dialogue the reflection is in the context already: asked for once.
    let t = play(
        &replies,
        &RolloutConfig {
            history_turns: None,
            ..c
        },
    );
    let text = CharCodec.decode(&t.tokens).unwrap();
    assert_eq!(text.matches("Your last reply failed").count(), 1);
    assert!(!text.contains("Your reflection:"));
}

/// `format = "tools"`: the prompt asks for `act` tool calls, each call is
/// an action, and a reply without a well-formed call is a format error.
#[test]
fn an_env_is_driven_through_tool_calls() {
    let c = RolloutConfig {
        format: ReplyFormat::Tools,
        response_length: 512,
        ..cfg()
    };
    let call = |a: &str| {
        format!("<tool_call>\n{{\"name\": \"act\", \"arguments\": {{\"action\": \"{a}\"}}}}\n</tool_call>")
    };
    let two: &'static str = format!("two steps right\n{}\n{}", call("R"), call("R")).leak();
    let one: &'static str = format!("one more\n{}", call("R")).leak();
    let t = play(&[two, one], &c);
    assert!(t.success);
    assert_eq!(t.turns.len(), 2);
    assert_eq!(t.turns[0].actions, vec!["R", "R"]);
    assert_eq!(t.turns[1].actions, vec!["R"]);
    assert!(t.turns.iter().all(|turn| !turn.format_error));
    let prompt = CharCodec.decode(&t.tokens[..t.turns[0].start]).unwrap();
    assert!(
        prompt.contains("calling the tool act") && prompt.contains("<tool_call>"),
        "{prompt}"
    );
    // Plain text, or a call to another tool, is a format error.
    let other: &'static str =
        "<tool_call>{\"name\": \"move\", \"arguments\": {\"action\": \"R\"}}</tool_call>";
    let t = play(&["R", other], &c);
    assert!(t.turns[0].format_error && t.turns[1].format_error);
    assert!(t.turns[0].actions.is_empty() && t.turns[1].actions.is_empty());
}

/// A reply chosen by the last observation of the prompt: two moves, one
/// of them invalid, from the start; one move from 1; an unreadable reply
/// from 2.
fn reply_to(prompt: &[u32]) -> Generation {
    let text = CharCodec.decode(prompt).unwrap();
    let at = text.rfind("at ").map(|i| &text[i + 3..i + 4]);
    let reply = match at {
        Some("0") => "<think></think><answer>R || L</answer>",
        Some("1") => "<think></think><answer>R</answer>",
        _ => "no answer",
    };
    let mut tokens = char_ids(reply);
    tokens.push(IM_END);
    Generation {
        logprobs: vec![-0.5; tokens.len()],
        tokens,
        stopped: true,
    }
}

/// [`reply_to`] each prompt of `batch`.
fn replies_to(batch: agentrl_rollout::PromptBatch<'_>) -> agentrl_rollout::Generations {
    Ok(batch.prompts.iter().map(|p| reply_to(p)).collect())
}

/// Replies by [`reply_to`]; a continuous batch is played depth-first from
/// its last sequence, an order no lock-step turn takes.
struct DepthFirst;

impl Policy for DepthFirst {
    fn generate_batch(
        &mut self,
        batch: agentrl_rollout::PromptBatch<'_>,
        _: &mut ChaCha8Rng,
    ) -> agentrl_rollout::Generations {
        replies_to(batch)
    }

    fn generate_continuous(
        &mut self,
        prompts: Vec<Vec<u32>>,
        _: &SamplingParams,
        _: &mut ChaCha8Rng,
        next: &mut dyn FnMut(usize, Generation) -> Followup,
    ) -> Result<(), agentrl_rollout::PolicyError> {
        for (i, mut prompt) in prompts.into_iter().enumerate().rev() {
            loop {
                match next(i, reply_to(&prompt)) {
                    Followup::Continue(context) => prompt = context,
                    Followup::Done => break,
                    Followup::Abort => return Ok(()),
                }
            }
        }
        Ok(())
    }
}

fn continuous(c: RolloutConfig) -> RolloutConfig {
    RolloutConfig {
        continuous_batching: true,
        ..c
    }
}

fn corridors(policy: &mut dyn Policy, c: &RolloutConfig) -> Result<Vec<Trajectory>, RolloutError> {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let envs = vec![corridor(), corridor(), corridor()];
    run_rollouts(policy, &CharCodec, envs, &[0, 0, 1], c, &mut rng)
}

#[test]
fn a_continuous_batch_in_any_order_plays_the_lockstep_trajectories() {
    for c in [
        cfg(),
        RolloutConfig {
            history_turns: Some(1),
            ..cfg()
        },
    ] {
        let lockstep = corridors(&mut DepthFirst, &c).unwrap();
        // Three turns: a move and an invalid one, a move, then unreadable
        // replies until the turn budget.
        let t = &lockstep[0];
        assert_eq!(t.turns.len(), 5);
        assert_eq!(t.turns[0].invalid_actions, 1);
        assert!(t.turns[2..].iter().all(|x| x.format_error));
        assert_eq!(
            corridors(&mut DepthFirst, &continuous(c)).unwrap(),
            lockstep
        );
    }
}

#[test]
fn a_policy_without_continuous_batching_plays_lockstep_turns_either_way() {
    // The default `generate_continuous`: one call a turn, as lock-step.
    let lockstep = corridors(
        &mut scripted(&["<think></think><answer>R</answer>"]),
        &cfg(),
    );
    let c = continuous(cfg());
    let played = corridors(&mut scripted(&["<think></think><answer>R</answer>"]), &c);
    assert_eq!(played.unwrap(), lockstep.unwrap());
}

/// A continuous policy that answers as `answer` says and then returns.
struct Misbehaving(fn(&mut dyn FnMut(usize, Generation) -> Followup));

impl Policy for Misbehaving {
    fn generate_batch(
        &mut self,
        batch: agentrl_rollout::PromptBatch<'_>,
        _: &mut ChaCha8Rng,
    ) -> agentrl_rollout::Generations {
        replies_to(batch)
    }

    fn generate_continuous(
        &mut self,
        _: Vec<Vec<u32>>,
        _: &SamplingParams,
        _: &mut ChaCha8Rng,
        next: &mut dyn FnMut(usize, Generation) -> Followup,
    ) -> Result<(), agentrl_rollout::PolicyError> {
        (self.0)(next);
        Ok(())
    }
}

#[test]
fn a_continuous_policy_that_loses_a_sequence_is_an_error() {
    let c = continuous(cfg());
    let stranger = corridors(
        &mut Misbehaving(|next| {
            next(3, reply_to(&[]));
        }),
        &c,
    );
    assert!(
        matches!(
            stranger,
            Err(RolloutError::UnknownSequence { index: 3, batch: 3 })
        ),
        "{stranger:?}"
    );
    let quitter = corridors(&mut Misbehaving(|_| {}), &c);
    assert!(
        matches!(quitter, Err(RolloutError::Unfinished { episode: 0 })),
        "{quitter:?}"
    );
}

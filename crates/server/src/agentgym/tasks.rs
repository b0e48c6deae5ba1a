//! AgentGym's task indices (`data_idx`, `game`, `session_id`, item `id`) →
//! agentrl tasks, per env. Pure functions; `scripts/agentgym/GAP.md` §3 gives
//! AgentGym's ranges.

use agentrl_env_core::Split;

/// The AgentGym server an env's `/{env}/` routes imitate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    TextCraft,
    BabyAi,
    AlfWorld,
    WebShop,
    SearchQa,
    /// An env AgentGym has no server for: the dialect its BaseTask clients
    /// share (TextCraft's and BabyAI's), with agentrl's full answers.
    Generic,
}

impl Flavor {
    /// The flavor of the env called `name`.
    pub(crate) fn of(name: &str) -> Self {
        match name {
            "textcraft" => Self::TextCraft,
            "babyai" => Self::BabyAi,
            "alfworld" => Self::AlfWorld,
            "webshop" => Self::WebShop,
            "searchqa" => Self::SearchQa,
            _ => Self::Generic,
        }
    }

    /// The body field (and GET query) holding the session id.
    pub(crate) fn id_key(self) -> &'static str {
        match self {
            Self::WebShop | Self::SearchQa => "env_idx",
            _ => "id",
        }
    }
}

/// An agentrl task: split, difficulty, seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Task {
    pub split: Split,
    pub difficulty: String,
    pub seed: u64,
}

/// An index past the env's data (AgentGym: `list index out of range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfRange {
    /// How many indices there are.
    pub len: u64,
}

/// TextCraft: AgentGym's 544 goals sorted by recipe depth
/// (`sorted(item_recipes_min_depth(1), key=depth)[data_idx % 544]`): the
/// first index of each depth 1..4, then the end.
const TEXTCRAFT_DEPTH_STARTS: [u64; 5] = [0, 125, 416, 533, 544];

/// BabyAI: AgentGym's 40 levels in `data_idx % 40` order, each with the
/// agentrl family that stands in for it (named alike where one exists, else
/// the nearest: mazes and sequences → `goto`, key and box levels → `unlock`,
/// Synth*/Boss* → `bosslevel`).
pub(crate) const BABYAI_LEVELS: [(&str, &str); 40] = [
    ("GoToRedBallGrey", "gotoredball"),
    ("GoToRedBall", "gotoredball"),
    ("GoToRedBallNoDists", "gotoredball"),
    ("GoToObjS6", "gotolocal"),
    ("GoToLocalS8N7", "gotolocal"),
    ("GoToObjMazeS7", "goto"),
    ("GoToImpUnlock", "unlock"),
    ("GoToSeqS5R2", "goto"),
    ("GoToRedBlueBall", "gotolocal"),
    ("GoToDoor", "goto"),
    ("GoToObjDoor", "goto"),
    ("Open", "opendoor"),
    ("OpenRedDoor", "opendoor"),
    ("OpenDoorLoc", "opendoor"),
    ("OpenRedBlueDoorsDebug", "opendoor"),
    ("OpenDoorsOrderN4Debug", "opendoor"),
    ("Pickup", "pickuploc"),
    ("UnblockPickup", "pickuploc"),
    ("PickupLoc", "pickuploc"),
    ("PickupDistDebug", "pickuploc"),
    ("PickupAbove", "pickuploc"),
    ("PutNextLocalS6N4", "putnextlocal"),
    ("PutNextS7N4Carrying", "putnextlocal"),
    ("Unlock", "unlock"),
    ("UnlockLocalDist", "unlock"),
    ("KeyInBox", "unlock"),
    ("UnlockPickupDist", "unlock"),
    ("BlockedUnlockPickup", "unlock"),
    ("UnlockToUnlock", "unlock"),
    ("ActionObjDoor", "opendoor"),
    ("FindObjS7", "goto"),
    ("KeyCorridorS6R3", "unlock"),
    ("OneRoomS20", "gotolocal"),
    ("MoveTwoAcrossS8N9", "putnextlocal"),
    ("SynthS5R2", "bosslevel"),
    ("SynthLoc", "bosslevel"),
    ("SynthSeq", "bosslevel"),
    ("MiniBossLevel", "bosslevel"),
    ("BossLevel", "bosslevel"),
    ("BossLevelNoUnlock", "bosslevel"),
];

/// ALFWorld: `game` 0..2419 are the training games, 2420..2619 the 200
/// evaluation games (`mappings_train.json`, `mappings_test.json`).
const ALFWORLD_TRAIN_GAMES: u64 = 2420;
const ALFWORLD_GAMES: u64 = 2620;

/// SearchQA: item ids 0..51712 are test questions, 51713..221327 training ones.
const SEARCHQA_TEST_ITEMS: u64 = 51713;
const SEARCHQA_ITEMS: u64 = 221328;

/// The agentrl task for AgentGym index `index` of `flavor`. `default` is the
/// session's default difficulty; `operator` the one the operator set with
/// `--env-param ENV.difficulty=…`, which replaces AgentGym's level/depth
/// tables: `index` is then a seed of that difficulty.
pub(crate) fn task_for(
    flavor: Flavor,
    index: u64,
    default: &str,
    operator: Option<&str>,
) -> Result<Task, OutOfRange> {
    let train = |difficulty: &str, seed: u64| Task {
        split: Split::Train,
        difficulty: difficulty.to_string(),
        seed,
    };
    if let (Some(d), Flavor::TextCraft | Flavor::BabyAi) = (operator, flavor) {
        return Ok(train(d, index));
    }
    match flavor {
        Flavor::TextCraft => {
            let goal = index % TEXTCRAFT_DEPTH_STARTS[4];
            let depth = TEXTCRAFT_DEPTH_STARTS[1..]
                .iter()
                .position(|&end| goal < end)
                .unwrap_or(3);
            Ok(train(
                &format!("depth{}", depth + 1),
                goal - TEXTCRAFT_DEPTH_STARTS[depth],
            ))
        }
        Flavor::BabyAi => {
            let (_, family) = BABYAI_LEVELS[(index % 40) as usize];
            Ok(train(family, index / 40))
        }
        Flavor::AlfWorld => match index {
            i if i < ALFWORLD_TRAIN_GAMES => Ok(train(default, i)),
            i if i < ALFWORLD_GAMES => Ok(Task {
                split: Split::Test,
                difficulty: default.to_string(),
                seed: i - ALFWORLD_TRAIN_GAMES,
            }),
            _ => Err(OutOfRange {
                len: ALFWORLD_GAMES,
            }),
        },
        Flavor::SearchQa => match index {
            i if i < SEARCHQA_TEST_ITEMS => Ok(Task {
                split: Split::Test,
                difficulty: default.to_string(),
                seed: i,
            }),
            i if i < SEARCHQA_ITEMS => Ok(train(default, i - SEARCHQA_TEST_ITEMS)),
            _ => Err(OutOfRange {
                len: SEARCHQA_ITEMS,
            }),
        },
        Flavor::WebShop | Flavor::Generic => Ok(train(default, index)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(flavor: Flavor, index: u64) -> Result<Task, OutOfRange> {
        task_for(flavor, index, "easy", None)
    }

    #[test]
    fn textcraft_indices_follow_agentgyms_depth_order_and_wrap_at_544() {
        let t = |i| task(Flavor::TextCraft, i).unwrap();
        assert_eq!((t(0).difficulty.as_str(), t(0).seed), ("depth1", 0));
        assert_eq!((t(124).difficulty.as_str(), t(124).seed), ("depth1", 124));
        assert_eq!((t(125).difficulty.as_str(), t(125).seed), ("depth2", 0));
        assert_eq!((t(416).difficulty.as_str(), t(416).seed), ("depth3", 0));
        assert_eq!((t(543).difficulty.as_str(), t(543).seed), ("depth4", 10));
        assert_eq!(t(544), t(0));
        assert_eq!(t(2_147_483_648), t(2_147_483_648 % 544));
    }

    #[test]
    fn babyai_level_is_index_mod_40_and_seed_index_div_40() {
        let t = |i| task(Flavor::BabyAi, i).unwrap();
        assert_eq!((t(0).difficulty.as_str(), t(0).seed), ("gotoredball", 0));
        assert_eq!((t(39).difficulty.as_str(), t(39).seed), ("bosslevel", 0));
        assert_eq!(
            (t(40 * 7 + 18).difficulty.as_str(), t(298).seed),
            ("pickuploc", 7)
        );
        let families = agentrl_envs::find("babyai").unwrap().difficulties;
        assert!(BABYAI_LEVELS.iter().all(|(_, f)| families.contains(f)));
    }

    #[test]
    fn an_operator_difficulty_makes_the_index_a_seed() {
        let t = task_for(Flavor::BabyAi, 41, "easy", Some("hard")).unwrap();
        assert_eq!((t.difficulty.as_str(), t.seed), ("hard", 41));
        let t = task_for(Flavor::TextCraft, 700, "easy", Some("depth3")).unwrap();
        assert_eq!((t.difficulty.as_str(), t.seed), ("depth3", 700));
        // ALFWorld keeps its game ranges; the difficulty is the default given.
        let t = task_for(Flavor::AlfWorld, 2420, "hard", Some("hard")).unwrap();
        assert_eq!(
            (t.split, t.difficulty.as_str(), t.seed),
            (Split::Test, "hard", 0)
        );
    }

    #[test]
    fn alfworld_games_and_searchqa_items_map_to_splits_and_end() {
        assert_eq!(task(Flavor::AlfWorld, 2419).unwrap().split, Split::Train);
        assert_eq!(task(Flavor::AlfWorld, 2619).unwrap().seed, 199);
        assert_eq!(task(Flavor::AlfWorld, 2620), Err(OutOfRange { len: 2620 }));
        assert_eq!(task(Flavor::SearchQa, 51712).unwrap().split, Split::Test);
        let t = task(Flavor::SearchQa, 51713).unwrap();
        assert_eq!((t.split, t.seed), (Split::Train, 0));
        assert_eq!(
            task(Flavor::SearchQa, 221328),
            Err(OutOfRange { len: 221328 })
        );
        assert_eq!(task(Flavor::WebShop, 9).unwrap().seed, 9);
        assert_eq!(task(Flavor::Generic, 9).unwrap().split, Split::Train);
    }
}

//! The household catalog: room kinds, receptacle types, object types and
//! where each object is plausibly found (the order the expert searches in).

/// The four room kinds of ALFWorld's scenes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RoomKind {
    Kitchen,
    Bedroom,
    Bathroom,
    LivingRoom,
}

impl RoomKind {
    pub const ALL: [RoomKind; 4] = [
        RoomKind::Kitchen,
        RoomKind::Bedroom,
        RoomKind::Bathroom,
        RoomKind::LivingRoom,
    ];

    fn bit(self) -> u8 {
        match self {
            RoomKind::Kitchen => K,
            RoomKind::Bedroom => BED,
            RoomKind::Bathroom => BATH,
            RoomKind::LivingRoom => LIV,
        }
    }
}

const K: u8 = 1;
const BED: u8 = 2;
const BATH: u8 = 4;
const LIV: u8 = 8;

/// A receptacle type.
#[derive(Debug, PartialEq, Eq)]
pub struct RecepDef {
    pub name: &'static str,
    /// Has a door or lid: starts closed and must be opened to see inside.
    pub openable: bool,
    /// "in" for containers and basins, "on" for surfaces.
    pub prep: &'static str,
    /// How many a room of each kind may hold: (room bit mask, max count).
    rooms: u8,
    pub max: u32,
}

impl RecepDef {
    pub fn in_room(&self, room: RoomKind) -> bool {
        self.rooms & room.bit() != 0
    }
}

macro_rules! recep {
    ($name:literal, $open:literal, $prep:literal, $rooms:expr, $max:literal) => {
        RecepDef {
            name: $name,
            openable: $open,
            prep: $prep,
            rooms: $rooms,
            max: $max,
        }
    };
}

/// Every receptacle type, in the order rooms list them.
pub static RECEPTACLES: &[RecepDef] = &[
    recep!("armchair", false, "on", LIV, 2),
    recep!("bathtubbasin", false, "in", BATH, 1),
    recep!("bed", false, "on", BED, 1),
    recep!("cabinet", true, "in", K | BATH | LIV, 6),
    recep!("coffeemachine", false, "on", K, 1),
    recep!("coffeetable", false, "on", LIV, 1),
    recep!("countertop", false, "on", K | BATH, 3),
    recep!("desk", false, "on", BED, 1),
    recep!("diningtable", false, "on", K | LIV, 1),
    recep!("drawer", true, "in", K | BED | BATH | LIV, 5),
    recep!("dresser", false, "on", BED | LIV, 1),
    recep!("fridge", true, "in", K, 1),
    recep!("garbagecan", false, "in", K | BED | BATH | LIV, 1),
    recep!("microwave", true, "in", K, 1),
    recep!("safe", true, "in", BED | LIV, 1),
    recep!("shelf", false, "on", K | BED | BATH | LIV, 3),
    recep!("sidetable", false, "on", BED | LIV, 2),
    recep!("sinkbasin", false, "in", K | BATH, 2),
    recep!("sofa", false, "on", LIV, 1),
    recep!("stoveburner", false, "on", K, 4),
    recep!("toilet", false, "on", BATH, 1),
    recep!("towelholder", false, "on", BATH, 1),
    recep!("tvstand", false, "on", LIV, 1),
];

/// The receptacle type called `name`.
pub fn recep_def(name: &str) -> Option<&'static RecepDef> {
    RECEPTACLES.iter().find(|r| r.name == name)
}

/// An object type.
#[derive(Debug, PartialEq, Eq)]
pub struct ObjDef {
    pub name: &'static str,
    rooms: u8,
    /// Receptacle types it is found in, most plausible first.
    pub found_in: &'static [&'static str],
    pub cleanable: bool,
    pub heatable: bool,
    pub coolable: bool,
    /// Can be examined under a desk lamp (look_at_obj_in_light tasks).
    pub lamp_task: bool,
    /// Can be picked up (the desk lamp cannot).
    pub pickable: bool,
}

impl ObjDef {
    pub fn in_room(&self, room: RoomKind) -> bool {
        self.rooms & room.bit() != 0
    }
}

/// What an object type affords, for the [`OBJECTS`] table: bits of
/// cleanable, heatable, coolable and lamp task.
const NONE: u8 = 0;
const CLEAN: u8 = 1;
const HEAT: u8 = 2;
const COOL: u8 = 4;
const LAMP: u8 = 8;

macro_rules! obj {
    ($name:literal, $rooms:expr, [$($r:literal),*], $affords:expr) => {
        ObjDef {
            name: $name,
            rooms: $rooms,
            found_in: &[$($r),*],
            cleanable: $affords & CLEAN != 0,
            heatable: $affords & HEAT != 0,
            coolable: $affords & COOL != 0,
            lamp_task: $affords & LAMP != 0,
            pickable: true,
        }
    };
}

/// The desk lamp: an object that stays on its surface and can be switched on.
pub static DESKLAMP: ObjDef = ObjDef {
    name: "desklamp",
    rooms: BED | LIV,
    found_in: &["desk", "sidetable", "dresser"],
    cleanable: false,
    heatable: false,
    coolable: false,
    lamp_task: false,
    pickable: false,
};

/// Every pickable object type (name, rooms, found in, what it affords).
// A table, one object a line: rustfmt would spread each over a dozen.
#[rustfmt::skip]
pub static OBJECTS: &[ObjDef] = &[
    obj!("alarmclock",    BED | LIV, ["desk", "sidetable", "shelf", "dresser"],                                                              LAMP),
    obj!("apple",         K,         ["countertop", "diningtable", "fridge", "garbagecan", "sinkbasin", "microwave"],                        CLEAN | HEAT | COOL),
    obj!("book",          BED | LIV, ["desk", "bed", "shelf", "sidetable", "coffeetable", "sofa", "drawer"],                                 LAMP),
    obj!("bowl",          K,         ["countertop", "diningtable", "cabinet", "shelf", "sinkbasin", "fridge", "microwave"],                  CLEAN | HEAT | COOL),
    obj!("bread",         K,         ["countertop", "diningtable", "fridge", "cabinet", "microwave"],                                        HEAT | COOL),
    obj!("candle",        BATH,      ["countertop", "toilet", "shelf", "cabinet", "bathtubbasin"],                                           NONE),
    obj!("cd",            BED | LIV, ["desk", "shelf", "drawer", "sidetable", "safe", "dresser", "garbagecan"],                              LAMP),
    obj!("cellphone",     BED | LIV, ["desk", "bed", "sidetable", "dresser", "sofa", "shelf", "drawer"],                                     LAMP),
    obj!("cloth",         BATH,      ["countertop", "cabinet", "bathtubbasin", "towelholder", "drawer"],                                     CLEAN),
    obj!("creditcard",    BED | LIV, ["desk", "dresser", "sidetable", "coffeetable", "sofa", "armchair", "shelf", "drawer"],                 LAMP),
    obj!("cup",           K,         ["countertop", "diningtable", "cabinet", "shelf", "sinkbasin", "microwave", "fridge"],                  CLEAN | HEAT | COOL),
    obj!("dishsponge",    K | BATH,  ["countertop", "sinkbasin", "cabinet", "drawer", "garbagecan"],                                         CLEAN),
    obj!("egg",           K,         ["countertop", "diningtable", "fridge", "garbagecan", "sinkbasin", "microwave"],                        CLEAN | HEAT | COOL),
    obj!("fork",          K,         ["countertop", "diningtable", "drawer", "sinkbasin"],                                                   CLEAN),
    obj!("keychain",      BED | LIV, ["desk", "dresser", "sidetable", "coffeetable", "shelf", "sofa", "safe", "drawer"],                     LAMP),
    obj!("knife",         K,         ["countertop", "diningtable", "drawer", "sinkbasin"],                                                   CLEAN),
    obj!("laptop",        BED | LIV, ["desk", "bed", "sofa", "coffeetable", "diningtable"],                                                  LAMP),
    obj!("lettuce",       K,         ["countertop", "diningtable", "fridge", "sinkbasin", "garbagecan"],                                     CLEAN | COOL),
    obj!("mug",           K,         ["countertop", "coffeemachine", "diningtable", "cabinet", "shelf", "sinkbasin", "microwave", "fridge"], CLEAN | HEAT | COOL),
    obj!("newspaper",     LIV,       ["coffeetable", "sofa", "armchair", "sidetable", "diningtable", "garbagecan"],                          LAMP),
    obj!("pan",           K,         ["stoveburner", "countertop", "cabinet", "sinkbasin", "fridge"],                                        CLEAN | COOL),
    obj!("pen",           BED | LIV, ["desk", "sidetable", "shelf", "dresser", "drawer"],                                                    LAMP),
    obj!("pencil",        BED | LIV, ["desk", "sidetable", "shelf", "dresser", "drawer"],                                                    LAMP),
    obj!("peppershaker",  K,         ["countertop", "diningtable", "cabinet", "shelf", "drawer"],                                            NONE),
    obj!("pillow",        BED | LIV, ["bed", "sofa", "armchair"],                                                                            LAMP),
    obj!("plate",         K,         ["countertop", "diningtable", "cabinet", "shelf", "sinkbasin", "fridge"],                               CLEAN | HEAT | COOL),
    obj!("pot",           K,         ["stoveburner", "countertop", "cabinet", "sinkbasin", "fridge"],                                        CLEAN | COOL),
    obj!("potato",        K,         ["countertop", "diningtable", "fridge", "garbagecan", "sinkbasin", "microwave", "stoveburner"],         CLEAN | HEAT | COOL),
    obj!("remotecontrol", LIV,       ["coffeetable", "sofa", "armchair", "sidetable", "tvstand", "dresser"],                                 LAMP),
    obj!("saltshaker",    K,         ["countertop", "diningtable", "cabinet", "shelf", "drawer"],                                            NONE),
    obj!("soapbar",       BATH,      ["countertop", "sinkbasin", "bathtubbasin", "toilet", "cabinet", "garbagecan"],                         CLEAN),
    obj!("soapbottle",    BATH,      ["countertop", "cabinet", "toilet", "shelf", "sinkbasin", "bathtubbasin"],                              NONE),
    obj!("spatula",       K,         ["countertop", "diningtable", "drawer", "sinkbasin"],                                                   CLEAN),
    obj!("spoon",         K,         ["countertop", "diningtable", "drawer", "sinkbasin"],                                                   CLEAN),
    obj!("spraybottle",   BATH,      ["countertop", "cabinet", "toilet", "shelf", "garbagecan"],                                             NONE),
    obj!("statue",        BED | LIV, ["shelf", "coffeetable", "sidetable", "dresser", "tvstand", "desk"],                                    LAMP),
    obj!("toiletpaper",   BATH,      ["toilet", "cabinet", "countertop", "shelf", "drawer", "garbagecan"],                                   NONE),
    obj!("towel",         BATH,      ["towelholder", "countertop", "cabinet", "bathtubbasin"],                                               CLEAN),
    obj!("vase",          BED | LIV, ["shelf", "coffeetable", "sidetable", "dresser", "diningtable", "tvstand"],                             LAMP),
    obj!("watch",         BED | LIV, ["coffeetable", "sidetable", "dresser", "shelf", "desk", "drawer"],                                     LAMP),
    obj!("winebottle",    K,         ["countertop", "diningtable", "fridge", "cabinet", "shelf"],                                            COOL),
];

/// The object type called `name` (the desk lamp included).
pub fn obj_def(name: &str) -> Option<&'static ObjDef> {
    if name == DESKLAMP.name {
        return Some(&DESKLAMP);
    }
    OBJECTS.iter().find(|o| o.name == name)
}

/// The six ALFWorld task types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaskType {
    PickAndPlace,
    LookAtObjInLight,
    PickCleanThenPlace,
    PickHeatThenPlace,
    PickCoolThenPlace,
    PickTwoObjAndPlace,
}

impl TaskType {
    pub const ALL: [TaskType; 6] = [
        TaskType::PickAndPlace,
        TaskType::LookAtObjInLight,
        TaskType::PickCleanThenPlace,
        TaskType::PickHeatThenPlace,
        TaskType::PickCoolThenPlace,
        TaskType::PickTwoObjAndPlace,
    ];

    /// ALFWorld's name for the type (also accepted as a difficulty).
    pub fn name(self) -> &'static str {
        match self {
            TaskType::PickAndPlace => "pick_and_place",
            TaskType::LookAtObjInLight => "look_at_obj_in_light",
            TaskType::PickCleanThenPlace => "pick_clean_then_place",
            TaskType::PickHeatThenPlace => "pick_heat_then_place",
            TaskType::PickCoolThenPlace => "pick_cool_then_place",
            TaskType::PickTwoObjAndPlace => "pick_two_obj_and_place",
        }
    }

    pub fn from_name(name: &str) -> Option<TaskType> {
        TaskType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The appliance receptacle a transforming task uses.
    pub fn appliance(self) -> Option<&'static str> {
        match self {
            TaskType::PickCleanThenPlace => Some("sinkbasin"),
            TaskType::PickHeatThenPlace => Some("microwave"),
            TaskType::PickCoolThenPlace => Some("fridge"),
            _ => None,
        }
    }

    /// Rooms the task can be set in.
    pub fn rooms(self) -> &'static [RoomKind] {
        match self {
            TaskType::PickAndPlace | TaskType::PickTwoObjAndPlace => &RoomKind::ALL,
            TaskType::LookAtObjInLight => &[RoomKind::Bedroom, RoomKind::LivingRoom],
            TaskType::PickCleanThenPlace => &[RoomKind::Kitchen, RoomKind::Bathroom],
            TaskType::PickHeatThenPlace | TaskType::PickCoolThenPlace => &[RoomKind::Kitchen],
        }
    }

    /// Whether objects of `o` can be the goal object of this task type.
    pub fn accepts(self, o: &ObjDef) -> bool {
        match self {
            TaskType::PickAndPlace | TaskType::PickTwoObjAndPlace => o.pickable,
            TaskType::LookAtObjInLight => o.lamp_task,
            TaskType::PickCleanThenPlace => o.cleanable,
            TaskType::PickHeatThenPlace => o.heatable,
            TaskType::PickCoolThenPlace => o.coolable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_found_in_names_a_receptacle() {
        for o in OBJECTS.iter().chain(std::iter::once(&DESKLAMP)) {
            for r in o.found_in {
                assert!(recep_def(r).is_some(), "{} found in unknown {r}", o.name);
            }
        }
    }

    #[test]
    fn every_task_type_has_goal_objects_in_each_of_its_rooms() {
        for t in TaskType::ALL {
            for &room in t.rooms() {
                assert!(
                    OBJECTS.iter().any(|o| o.in_room(room) && t.accepts(o)),
                    "{t:?} in {room:?}"
                );
            }
        }
    }
}

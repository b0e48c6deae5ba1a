//! WebShop's reward, ported from its `engine/goal.py` and `engine/normalize.py`.
//!
//! r = (matched attributes + matched options + [price ≤ ceiling]) /
//!     (|goal attributes| + |goal options| + 1), times the type factor r_type.
//!
//! The one deliberate difference: WebShop finds the nouns of a title with
//! spaCy (`en_core_web_lg`, POS NOUN / PROPN); we have no tagger, so
//! [`title_nouns`] keeps the content words of a title — tokens with a letter
//! that are not in a list of function words and the product adjectives spaCy
//! does not tag as nouns. The list follows spaCy's tags on WebShop's titles:
//! it tags "men", "pack", "oz", "organic", "waterproof", "ipx7" and single
//! letters as nouns there (kept) and "athletic", "over", "wired", "limited"
//! as other parts of speech (dropped).

use crate::catalog::{Goal, Product};

/// WebShop's `COLOR_SET`, in its order: [`normalize_color`] returns the first
/// entry contained in the text, so the order decides ("dark roast coffee" → "coffee").
pub const COLOR_SET: &[&str] = &[
    "alabaster",
    "apricot",
    "aqua",
    "ash",
    "asphalt",
    "azure",
    "banana",
    "beige",
    "black",
    "blue",
    "blush",
    "bordeaux",
    "bronze",
    "brown",
    "burgundy",
    "camel",
    "camo",
    "caramel",
    "champagne",
    "charcoal",
    "cheetah",
    "chestnut",
    "chocolate",
    "christmas",
    "coffee",
    "cognac",
    "copper",
    "coral",
    "cranberry",
    "cream",
    "crystal",
    "dark",
    "denim",
    "eggplant",
    "elephant",
    "espresso",
    "fuchsia",
    "gold",
    "granite",
    "grape",
    "graphite",
    "grass",
    "gray",
    "grey",
    "heather",
    "indigo",
    "ivory",
    "ivy",
    "khaki",
    "lavender",
    "lemon",
    "leopard",
    "light",
    "lilac",
    "lime",
    "magenta",
    "maroon",
    "mauve",
    "merlot",
    "midnight",
    "mint",
    "mocha",
    "multicolor",
    "mushroom",
    "mustard",
    "natural",
    "navy",
    "nude",
    "olive",
    "orange",
    "peach",
    "pewter",
    "pink",
    "plum",
    "purple",
    "rainbow",
    "red",
    "rose",
    "royal",
    "rust",
    "sand",
    "sapphire",
    "seashell",
    "silver",
    "skull",
    "slate",
    "steel",
    "stone",
    "stonewash",
    "sunflower",
    "tan",
    "taupe",
    "teal",
    "tiger",
    "turquoise",
    "violet",
    "walnut",
    "wheat",
    "white",
    "wine",
    "yellow",
];

/// `normalize_color`: the first colour word contained in `s`, else `s` itself.
pub fn normalize_color(s: &str) -> String {
    COLOR_SET
        .iter()
        .find(|c| s.contains(*c))
        .map(|c| c.to_string())
        .unwrap_or_else(|| s.to_string())
}

/// fuzzywuzzy's `utils.full_process` with `force_ascii=True`: drop code points
/// 128–255, turn every non-word character into a space, lower-case, trim.
pub fn full_process(s: &str) -> String {
    let kept: String = s
        .chars()
        .filter(|c| !(128..=255).contains(&(*c as u32)))
        .map(|c| {
            if c.is_alphanumeric() || c == '_' {
                c
            } else {
                ' '
            }
        })
        .collect();
    kept.to_lowercase().trim().to_string()
}

/// fuzzywuzzy's `fuzz.ratio` with python-Levenshtein: 100 × (|a| + |b| −
/// indel distance) / (|a| + |b|), rounded half-to-even as Python's `round`.
/// Equal strings score 100; otherwise an empty one scores 0.
pub fn ratio(a: &str, b: &str) -> u32 {
    if a == b {
        return 100;
    }
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.is_empty() || b.is_empty() {
        return 0;
    }
    // Indel distance = |a| + |b| − 2·LCS, so the ratio is 2·LCS / (|a| + |b|).
    let mut prev = vec![0usize; b.len() + 1];
    let mut cur = vec![0usize; b.len() + 1];
    for &ca in &a {
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = if ca == cb {
                prev[j] + 1
            } else {
                prev[j + 1].max(cur[j])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    let lcs = prev[b.len()];
    let r = 100.0 * (2 * lcs) as f64 / (a.len() + b.len()) as f64;
    r.round_ties_even() as u32
}

/// fuzzywuzzy's `fuzz.token_set_ratio` (full processing, force ASCII): the best
/// `ratio` among the sorted intersection and the intersection plus each side's
/// remaining sorted tokens.
pub fn token_set_ratio(s1: &str, s2: &str) -> u32 {
    let p1 = full_process(s1);
    let p2 = full_process(s2);
    if p1.is_empty() || p2.is_empty() {
        return 0;
    }
    let t1: std::collections::BTreeSet<&str> = p1.split_whitespace().collect();
    let t2: std::collections::BTreeSet<&str> = p2.split_whitespace().collect();
    let sect: Vec<&str> = t1.intersection(&t2).copied().collect();
    let d12: Vec<&str> = t1.difference(&t2).copied().collect();
    let d21: Vec<&str> = t2.difference(&t1).copied().collect();
    let sorted_sect = sect.join(" ");
    let combined_12 = format!("{} {}", sorted_sect, d12.join(" "))
        .trim()
        .to_string();
    let combined_21 = format!("{} {}", sorted_sect, d21.join(" "))
        .trim()
        .to_string();
    let sorted_sect = sorted_sect.trim().to_string();
    ratio(&sorted_sect, &combined_12)
        .max(ratio(&sorted_sect, &combined_21))
        .max(ratio(&combined_12, &combined_21))
}

/// Function words and common product adjectives, never counted as nouns.
const NOT_NOUNS: &[&str] = &[
    "a",
    "an",
    "the",
    "and",
    "or",
    "of",
    "for",
    "with",
    "without",
    "in",
    "on",
    "to",
    "by",
    "from",
    "at",
    "as",
    "is",
    "it",
    "its",
    "this",
    "that",
    "per",
    "set",
    "ct",
    "fl",
    "lb",
    "lbs",
    "ounce",
    "ounces",
    "pound",
    "pounds",
    "inch",
    "inches",
    "ft",
    "feet",
    "new",
    "free",
    "natural",
    "fresh",
    "premium",
    "best",
    "great",
    "original",
    "classic",
    "extra",
    "super",
    "ultra",
    "pure",
    "soft",
    "large",
    "small",
    "medium",
    "big",
    "mini",
    "long",
    "light",
    "dark",
    "high",
    "low",
    "heavy",
    "thin",
    "thick",
    "slim",
    "durable",
    "portable",
    "adjustable",
    "compatible",
    "non",
    "anti",
    "black",
    "white",
    "red",
    "blue",
    "green",
    "pink",
    "grey",
    "gray",
    "brown",
    "purple",
    "yellow",
    "orange",
    "unisex",
    "xl",
    "xxl",
    "athletic",
    "over",
    "wired",
    "limited",
];

/// The "nouns" of a title for WebShop's title score (see module docs):
/// lower-cased content words with at least one letter (spaCy tags "ipx7"
/// and single letters as nouns, bare numbers as numerals), duplicates kept,
/// in order.
pub fn title_nouns(title: &str) -> Vec<String> {
    // spaCy splits a possessive off ("Men's" → "Men" + "'s", a particle).
    let title = title.replace("'s", " ").replace("’s", " ");
    title
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| t.chars().any(char::is_alphabetic))
        .map(|t| t.to_lowercase())
        .filter(|t| !NOT_NOUNS.contains(&t.as_str()))
        .collect()
}

/// Every term of WebShop's reward, for the step info and for tests.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardBreakdown {
    pub r_type: f64,
    pub query_match: bool,
    pub category_match: bool,
    pub title_score: f64,
    pub attr_matches: usize,
    pub num_attrs: usize,
    pub option_matches: usize,
    pub num_options: usize,
    pub price_ok: bool,
    /// The final reward in [0, 1].
    pub total: f64,
}

/// `get_type_reward`: 1 when query, category (≥ 2 shared levels) or title
/// (score > 0.2) match, else 0.5; then 0.1 when the title score is below 0.1
/// and 0 when it is 0, whatever matched before.
pub fn type_reward(purchased: &Product, goal: &Goal) -> (f64, bool, bool, f64) {
    let query_match = purchased.query == goal.query;
    let levels = |c: &str| {
        c.split('›')
            .map(|x| x.trim().to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    let category_match = levels(&purchased.product_category)
        .intersection(&levels(&goal.product_category))
        .count()
        >= 2;
    let purchased_nouns: std::collections::BTreeSet<String> =
        title_nouns(&purchased.title).into_iter().collect();
    let desired = title_nouns(&goal.name);
    let desired_set: std::collections::BTreeSet<&String> = desired.iter().collect();
    // As WebShop: the intersection is of sets, the denominator keeps duplicates.
    let n_intersect = desired_set
        .iter()
        .filter(|n| purchased_nouns.contains(n.as_str()))
        .count();
    let title_score = if desired.is_empty() {
        0.2
    } else {
        n_intersect as f64 / desired.len() as f64
    };
    let mut r_type = 1.0;
    if !(query_match || category_match || title_score > 0.2) {
        r_type = 0.5;
    }
    if title_score < 0.1 {
        r_type = 0.1;
    }
    if title_score == 0.0 {
        r_type = 0.0;
    }
    (r_type, query_match, category_match, title_score)
}

/// `get_attribute_reward`: a goal attribute matches a product attribute with
/// token-set ratio > 85, or else occurs in the lower-cased title, bullet points
/// or description.
pub fn attribute_matches(purchased: &Product, goal_attrs: &[String]) -> usize {
    let title = purchased.title.to_lowercase();
    let bullets = purchased.bullet_points.join(" ").to_lowercase();
    let description = purchased.description.to_lowercase();
    goal_attrs
        .iter()
        .filter(|g| {
            purchased
                .attributes
                .iter()
                .any(|p| token_set_ratio(p, g) > 85)
                || title.contains(g.as_str())
                || bullets.contains(g.as_str())
                || description.contains(g.as_str())
        })
        .count()
}

/// A goal option as WebShop's `get_option_reward` sees it. A goal whose
/// options are a dict (every synthetic goal, and human goals stored as an
/// object) hands over `(name, value)` tuples: `normalize_color`'s `in` is then
/// tuple membership (only an exact colour word, name or value, normalises),
/// and the fuzzy score reads `str(tuple)`, the name's tokens included. A goal
/// whose options are a list (an empty `name` here) hands over the value.
pub fn goal_option_text(name: &str, value: &str) -> String {
    if name.is_empty() {
        return normalize_color(value);
    }
    match COLOR_SET.iter().find(|c| **c == name || **c == value) {
        Some(c) => c.to_string(),
        None => format!("('{name}', '{value}')"),
    }
}

/// `get_option_reward`: goal options (see [`goal_option_text`]) matched by a
/// chosen option value after colour normalisation, with token-set ratio > 85.
pub fn option_matches(chosen: &[String], goal_options: &[(String, String)]) -> usize {
    let chosen: Vec<String> = chosen.iter().map(|o| normalize_color(o)).collect();
    goal_options
        .iter()
        .map(|(name, value)| goal_option_text(name, value))
        .filter(|g| chosen.iter().any(|p| token_set_ratio(p, g) > 85))
        .count()
}

/// `get_reward`: the reward for buying `purchased` at `price` with the option
/// values `chosen`, against `goal`.
pub fn reward(purchased: &Product, goal: &Goal, price: f64, chosen: &[String]) -> RewardBreakdown {
    let (r_type, query_match, category_match, title_score) = type_reward(purchased, goal);
    let attr_matches = attribute_matches(purchased, &goal.attributes);
    let option_matches = option_matches(chosen, &goal.options);
    let price_ok = price <= goal.price_upper;
    let denom = (goal.attributes.len() + goal.options.len() + 1) as f64;
    let total = (attr_matches + option_matches + usize::from(price_ok)) as f64 / denom * r_type;
    RewardBreakdown {
        r_type,
        query_match,
        category_match,
        title_score,
        attr_matches,
        num_attrs: goal.attributes.len(),
        option_matches,
        num_options: goal.options.len(),
        price_ok,
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn product() -> Product {
        Product {
            asin: "B000000001".into(),
            title: "Kestrel Organic Dark Roast Coffee, Whole Bean".into(),
            category: "grocery".into(),
            query: "coffee".into(),
            product_category: "Grocery & Gourmet Food › Beverages › Coffee".into(),
            description: "A bold coffee roasted in small batches. Strawberry notes.".into(),
            bullet_points: vec!["Fair trade certified beans".into()],
            attributes: vec!["gluten free".into(), "organic".into()],
            options: vec![
                (
                    "roast".into(),
                    vec!["light roast".into(), "dark roast".into()],
                ),
                ("size".into(), vec!["12 ounce".into(), "5 pound".into()]),
            ],
            price: 23.99,
        }
    }

    fn goal() -> Goal {
        Goal {
            asin: "B000000001".into(),
            name: "Kestrel Organic Dark Roast Coffee, Whole Bean".into(),
            query: "coffee".into(),
            product_category: "Grocery & Gourmet Food › Beverages › Coffee".into(),
            attributes: vec!["gluten free".into(), "fair trade".into()],
            options: vec![("roast".into(), "dark roast".into())],
            price_upper: 40.0,
            instruction: "i need a gluten free and fair trade coffee with roast: dark roast".into(),
        }
    }

    #[test]
    fn ratio_matches_python_levenshtein() {
        // Levenshtein.ratio("ounce 12", "ounce 2") = 14/15 → 93.
        assert_eq!(ratio("ounce 12", "ounce 2"), 93);
        assert_eq!(ratio("abc", "abc"), 100);
        assert_eq!(ratio("", "abc"), 0);
        assert_eq!(ratio("", ""), 100);
        // 2·LCS/(lensum): "kitten"/"sitting" LCS 4 → 8/13 = 61.5 → 62.
        assert_eq!(ratio("kitten", "sitting"), 62);
        // Python rounds half to even: 87.5 → 88 ("of pack" vs "of pack 6": 14/16).
        assert_eq!(ratio("of pack", "of pack 6"), 88);
        // 82.5 → 82 (half to even): 2·33/80.
        let a = "a".repeat(33) + &"b".repeat(7);
        let b = "a".repeat(33) + &"c".repeat(7);
        assert_eq!(ratio(&a, &b), 82);
    }

    #[test]
    fn token_set_ratio_matches_fuzzywuzzy() {
        // Same tokens in another order and case: 100.
        assert_eq!(token_set_ratio("Dark Roast", "roast dark"), 100);
        // A subset scores 100 (the intersection equals one side).
        assert_eq!(token_set_ratio("gluten free", "gluten free coffee"), 100);
        // Punctuation is whitespace: "t-shirt" == "t shirt".
        assert_eq!(token_set_ratio("t-shirt", "T Shirt!"), 100);
        // "12 ounce" vs "2 ounce": max("ounce"/"ounce 12" 77, "ounce"/"ounce 2" 83, 93) = 93.
        assert_eq!(token_set_ratio("12 ounce", "2 ounce"), 93);
        assert_eq!(token_set_ratio("", "x"), 0);
        assert_eq!(token_set_ratio("!!!", "x"), 0);
        // Latin-1 characters are dropped before comparing (force_ascii).
        assert_eq!(token_set_ratio("café", "caf"), 100);
    }

    #[test]
    fn normalize_color_takes_first_listed_color() {
        assert_eq!(normalize_color("dark roast"), "dark");
        assert_eq!(normalize_color("dark roast coffee"), "coffee");
        assert_eq!(normalize_color("violet lavender"), "lavender");
        assert_eq!(normalize_color("12 ounce"), "12 ounce");
    }

    #[test]
    fn perfect_purchase_scores_one() {
        let mut p = product();
        p.bullet_points.push("Gluten free".into());
        let r = reward(
            &p,
            &goal(),
            23.99,
            &["dark roast".into(), "12 ounce".into()],
        );
        assert_eq!(r.attr_matches, 2);
        assert_eq!(r.option_matches, 1);
        assert!(r.price_ok);
        assert_eq!(r.r_type, 1.0);
        assert_eq!(r.total, 1.0);
    }

    #[test]
    fn partial_match_counts_each_term() {
        // "gluten free" via attributes, "fair trade" via bullet substring,
        // option wrong (light roast), price over the ceiling:
        // (2 + 0 + 0) / (2 + 1 + 1) = 0.5.
        let r = reward(&product(), &goal(), 45.0, &["light roast".into()]);
        assert_eq!(
            (r.attr_matches, r.option_matches, r.price_ok),
            (2, 0, false)
        );
        assert!((r.total - 0.5).abs() < 1e-12);
        // No option chosen, price fine: (2 + 0 + 1) / 4 = 0.75.
        let r = reward(&product(), &goal(), 10.0, &[]);
        assert!((r.total - 0.75).abs() < 1e-12);
    }

    #[test]
    fn substring_fallback_is_case_sensitive_on_goal_side() {
        let p = product();
        // "raw" occurs in "strawberry" in the description: matched, as in WebShop.
        assert_eq!(attribute_matches(&p, &["raw".into()]), 1);
        // A goal attribute with capitals never matches the lower-cased text.
        assert_eq!(attribute_matches(&p, &["Strawberry".into()]), 0);
    }

    #[test]
    fn type_factor_halves_for_unrelated_type_with_weak_title() {
        // Different query and category, title shares 1 of the goal's nouns.
        let mut p = product();
        p.query = "tea".into();
        p.product_category = "Beauty › Hair Care › Shampoo".into();
        p.title = "Zenora Herbal Shampoo Coffee".into();
        let g = goal();
        let (r_type, q, c, title_score) = type_reward(&p, &g);
        // Goal nouns: kestrel, organic, roast, coffee, whole, bean (6); shared: coffee → 1/6.
        assert!(!q && !c);
        assert!((title_score - 1.0 / 6.0).abs() < 1e-12);
        assert_eq!(r_type, 0.5);
        let r = reward(&p, &g, 10.0, &["dark roast".into()]);
        // attrs: "gluten free" (attribute) + "fair trade" (bullet) = 2, option 1, price 1 → 4/4 × 0.5.
        assert!((r.total - 0.5).abs() < 1e-12);
    }

    #[test]
    fn type_factor_zero_when_no_title_noun_shared_even_if_category_matches() {
        let mut p = product();
        p.title = "Zenora Green Tea".into();
        let (r_type, q, c, s) = type_reward(&p, &goal());
        assert!(q && c);
        assert_eq!(s, 0.0);
        assert_eq!(r_type, 0.0);
        assert_eq!(reward(&p, &goal(), 1.0, &["dark roast".into()]).total, 0.0);
    }

    #[test]
    fn type_factor_tenth_when_title_score_below_a_tenth() {
        let mut p = product();
        p.title = "Kestrel Mug".into();
        let mut g = goal();
        // 11 goal nouns, 1 shared → 1/11 < 0.1.
        g.name = "Kestrel alpha beta gamma delta epsilon zeta theta iota kappa lambda".into();
        let (r_type, _, c, s) = type_reward(&p, &g);
        assert!(c);
        assert!(s > 0.0 && s < 0.1);
        assert_eq!(r_type, 0.1);
    }

    fn opt(name: &str, value: &str) -> (String, String) {
        (name.into(), value.into())
    }

    #[test]
    fn option_match_uses_color_normalisation() {
        // A list goal's values normalise by substring: "navy blue" and "blue" both → "blue".
        assert_eq!(option_matches(&["navy blue".into()], &[opt("", "blue")]), 1);
        assert_eq!(option_matches(&["red".into()], &[opt("", "blue")]), 0);
        // A dict goal's ("color", "blue") is an exact colour word: → "blue".
        assert_eq!(
            option_matches(&["navy blue".into()], &[opt("color", "blue")]),
            1
        );
    }

    /// WebShop scores a dict goal's option as `str((name, value))` (thefuzz,
    /// force_ascii), so the name's tokens count. Hand-computed for the
    /// chosen "x large tall" against ("size", "x large"): tokens {large, x,
    /// tall} vs {large, size, x}; sorted intersection "large x" (7 chars),
    /// with the rest "large x tall" and "large x size" (12 each);
    /// ratio("large x", "large x tall") = round(100·2·7/19) = 74 and
    /// ratio("large x tall", "large x size") = round(100·2·8/24) = 67, so 74:
    /// no match. By value alone the goal's tokens lie inside the chosen ones
    /// and the score is 100: a match.
    #[test]
    fn dict_goal_options_are_scored_with_their_names() {
        assert_eq!(goal_option_text("size", "x-large"), "('size', 'x-large')");
        assert_eq!(
            full_process(&goal_option_text("size", "x-large")),
            "size    x large"
        );
        assert_eq!(
            option_matches(&["x-large".into()], &[opt("size", "x-large")]),
            1
        );
        let tall = ["x large tall".to_string()];
        assert_eq!(token_set_ratio(&tall[0], "('size', 'x large')"), 74);
        assert_eq!(option_matches(&tall, &[opt("size", "x large")]), 0);
        assert_eq!(option_matches(&tall, &[opt("", "x large")]), 1);
        // Only an exact colour word normalises a dict option: "dark blue" stays
        // "('color', 'dark blue')", while a list option becomes "blue".
        assert_eq!(
            goal_option_text("color", "dark blue"),
            "('color', 'dark blue')"
        );
        assert_eq!(goal_option_text("", "dark blue"), "blue");
        assert_eq!(goal_option_text("color", "black"), "black");
    }

    #[test]
    fn title_nouns_follow_spacy_on_webshop_titles() {
        assert_eq!(
            title_nouns("Men's Waterproof IPX7 Athletic Shoes, 2 Pack, Size 9 W"),
            ["men", "waterproof", "ipx7", "shoes", "pack", "size", "w"]
        );
        assert_eq!(
            title_nouns("Wired Over Ear Headphones, Limited Edition"),
            ["ear", "headphones", "edition"]
        );
    }

    /// The case: a purchase whose only shared title noun was one the
    /// old list dropped ("pack") kept r_type 0 although the category matched.
    #[test]
    fn a_shared_noun_spacy_keeps_saves_the_type_factor() {
        let mut bought = product();
        bought.title = "Organic Granola Pack".into();
        let mut g = goal();
        g.name = "Variety Pack".into();
        let (r_type, _, category_match, title_score) = type_reward(&bought, &g);
        assert!(category_match);
        assert_eq!(title_score, 0.5);
        assert_eq!(r_type, 1.0);
    }
}

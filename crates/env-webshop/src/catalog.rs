//! The product catalog: its types, and the built-in generator.
//!
//! The generator draws products of 20 kinds (coffee, shampoo, running shoes,
//! …), each with a category path "A › B › C", a brand, 4 attributes from the
//! kind's pool, a subset of the kind's option values, a price, a description
//! and bullet features that state the attributes. On `hard`, products come in
//! families of near-twins (one attribute swapped, price far above any ceiling,
//! other option values, another brand), so that matching every constraint
//! matters.

use agentrl_search_index::DocRef;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;

/// One product as the shop and the reward see it (WebShop's product fields).
#[derive(Debug, Clone, PartialEq)]
pub struct Product {
    /// Product id (WebShop's ASIN), unique in the catalog.
    pub asin: String,
    /// WebShop's `Title` (`name` in its files).
    pub title: String,
    /// Top-level category (WebShop's `category`).
    pub category: String,
    /// The search query the product was collected under (WebShop's `query`).
    pub query: String,
    /// "A › B › C" (WebShop's `product_category`).
    pub product_category: String,
    pub description: String,
    /// Bullet features (WebShop's `BulletPoints`).
    pub bullet_points: Vec<String>,
    /// Hidden attribute labels the reward matches against (WebShop's `Attributes`).
    pub attributes: Vec<String>,
    /// Option groups in display order: (name, values), values lower-case.
    pub options: Vec<(String, Vec<String>)>,
    /// The price a buyer pays.
    pub price: f64,
}

/// The search bodies of a catalog, in catalog order (see [`search_docs`]).
pub fn search_bodies(products: &[Product]) -> Vec<String> {
    products.iter().map(Product::search_body).collect()
}

/// The documents the search engine indexes, one per product in catalog
/// order: the title and the product's entry of [`search_bodies`].
pub fn search_docs<'a>(products: &'a [Product], bodies: &'a [String]) -> Vec<DocRef<'a>> {
    products
        .iter()
        .zip(bodies)
        .map(|(p, body)| DocRef {
            title: &p.title,
            body,
        })
        .collect()
}

impl Product {
    /// The text indexed for search besides the title.
    pub fn search_body(&self) -> String {
        let mut s = String::new();
        s.push_str(&self.product_category);
        s.push('\n');
        s.push_str(&self.description);
        s.push('\n');
        s.push_str(&self.bullet_points.join("\n"));
        for (name, values) in &self.options {
            s.push('\n');
            s.push_str(name);
            s.push_str(": ");
            s.push_str(&values.join(", "));
        }
        s
    }
}

/// What the buyer is asked for (WebShop's goal dict).
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    /// The target product the goal was made from.
    pub asin: String,
    /// The target's title (WebShop's goal `name`), for the title score.
    pub name: String,
    pub query: String,
    pub product_category: String,
    /// Attributes to match (WebShop's `attributes`).
    pub attributes: Vec<String>,
    /// Options to choose: (option name, value) (WebShop's `goal_options`).
    pub options: Vec<(String, String)>,
    /// Price ceiling (WebShop's `price_upper`).
    pub price_upper: f64,
    /// The text shown to the agent.
    pub instruction: String,
}

/// WebShop's `PRICE_RANGE`: 10, 20, …, 990.
fn price_range() -> impl Iterator<Item = f64> {
    (1..100).map(|i| 10.0 * i as f64)
}

/// WebShop's ceiling: two distinct draws from the first four round prices
/// above the product's price, keep the larger; none → no ceiling (1e6).
pub fn price_ceiling(price: f64, rng: &mut ChaCha8Rng) -> f64 {
    let above: Vec<f64> = price_range().filter(|p| *p > price).take(4).collect();
    if above.len() < 2 {
        return 1_000_000.0;
    }
    let i = rng.random_range(0..above.len());
    let mut j = rng.random_range(0..above.len() - 1);
    if j >= i {
        j += 1;
    }
    above[i].max(above[j])
}

/// The instruction sentence for a goal, WebShop style:
/// "i need a gluten free coffee with roast: dark roast, and price lower than 40.00 dollars".
pub fn instruction_text(
    lead: &str,
    attributes: &[String],
    noun: &str,
    options: &[(String, String)],
    price_upper: f64,
) -> String {
    let mut s = format!("{lead} ");
    if !attributes.is_empty() {
        s.push_str(&attributes.join(" and "));
        s.push(' ');
    }
    s.push_str(noun);
    if !options.is_empty() {
        let opts: Vec<String> = options.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        s.push_str(" with ");
        s.push_str(&opts.join(", and "));
    }
    if price_upper < 1_000_000.0 {
        s.push_str(&format!(", and price lower than {price_upper:.2} dollars"));
    }
    s
}

/// Openings of generated instructions.
pub const LEADS: &[&str] = &[
    "i need",
    "i am looking for",
    "find me",
    "i want to buy",
    "i would like",
];

/// One kind of product the generator makes.
pub struct Kind {
    pub path: [&'static str; 3],
    /// WebShop's `query` for products of this kind, and the noun used in instructions.
    pub query: &'static str,
    /// Noun phrases used in titles.
    pub nouns: &'static [&'static str],
    /// Attribute pool (lower-case, pairwise distinct under the reward's matching).
    pub attrs: &'static [&'static str],
    /// Option groups: (name, values).
    pub options: &'static [(&'static str, &'static [&'static str])],
    pub price: (f64, f64),
}

const COLORS_A: &[&str] = &["black", "white", "navy", "olive", "red"];
const COLORS_B: &[&str] = &["black", "silver", "white"];
const SIZES_CLOTH: &[&str] = &["small", "medium", "large", "xl"];

/// The 20 kinds of the built-in catalog. No option value outside a colour
/// group contains a colour word ("standard" holds "tan", "peppermint"
/// "mint"): WebShop's `normalize_color` would turn the chosen value into that
/// colour while the goal's `(name, value)` stays whole, and even a perfect
/// purchase could not score 1.
pub const KINDS: &[Kind] = &[
    Kind {
        path: ["Grocery & Gourmet Food", "Beverages", "Coffee"],
        query: "coffee",
        nouns: &["Coffee", "Whole Bean Coffee", "Ground Coffee"],
        attrs: &[
            "gluten free",
            "organic",
            "fair trade",
            "decaf",
            "kosher",
            "non gmo",
            "single origin",
            "low acid",
        ],
        options: &[
            ("roast", &["light roast", "medium roast", "dark roast"]),
            ("size", &["12 ounce", "5 pound", "sample box"]),
        ],
        price: (8.0, 45.0),
    },
    Kind {
        path: ["Grocery & Gourmet Food", "Beverages", "Tea"],
        query: "tea",
        nouns: &["Green Tea", "Herbal Tea", "Black Tea"],
        attrs: &[
            "organic",
            "caffeine free",
            "sugar free",
            "kosher",
            "non gmo",
            "fair trade",
            "loose leaf",
            "vegan",
        ],
        options: &[(
            "flavor",
            &["hibiscus", "lemon ginger", "chamomile", "jasmine"],
        )],
        price: (4.0, 25.0),
    },
    Kind {
        path: ["Grocery & Gourmet Food", "Snacks", "Protein Bars"],
        query: "protein bars",
        nouns: &["Protein Bars", "Snack Bars"],
        attrs: &[
            "gluten free",
            "low sugar",
            "high protein",
            "keto friendly",
            "vegan",
            "dairy free",
            "non gmo",
            "kosher",
        ],
        options: &[(
            "flavor",
            &["chocolate", "peanut butter", "caramel", "almond"],
        )],
        price: (12.0, 40.0),
    },
    Kind {
        path: ["Beauty & Personal Care", "Hair Care", "Shampoo"],
        query: "shampoo",
        nouns: &["Shampoo", "Moisturizing Shampoo"],
        attrs: &[
            "sulfate free",
            "paraben free",
            "cruelty free",
            "natural ingredients",
            "for dry hair",
            "color safe",
            "vegan",
            "travel size",
        ],
        options: &[
            ("scent", &["coconut", "lavender", "unscented", "tea tree"]),
            ("size", &["8 fl oz", "16 fl oz", "33 fl oz"]),
        ],
        price: (6.0, 35.0),
    },
    Kind {
        path: ["Beauty & Personal Care", "Skin Care", "Face Moisturizer"],
        query: "face moisturizer",
        nouns: &["Face Moisturizer", "Night Cream"],
        attrs: &[
            "fragrance free",
            "hyaluronic acid",
            "for sensitive skin",
            "oil free",
            "spf 30",
            "cruelty free",
            "paraben free",
            "anti aging",
        ],
        options: &[("size", &["1.7 ounce", "3.4 ounce"])],
        price: (10.0, 60.0),
    },
    Kind {
        path: ["Beauty & Personal Care", "Makeup", "Lipstick"],
        query: "lipstick",
        nouns: &["Lipstick", "Matte Lipstick"],
        attrs: &[
            "long lasting",
            "cruelty free",
            "vegan",
            "paraben free",
            "waterproof",
            "moisturizing",
        ],
        options: &[("color", &["red", "pink", "nude", "plum", "coral"])],
        price: (5.0, 30.0),
    },
    Kind {
        path: ["Clothing, Shoes & Jewelry", "Men", "T-Shirts"],
        query: "t-shirt",
        nouns: &["T-Shirt", "Crew Neck T-Shirt"],
        attrs: &[
            "cotton",
            "machine wash",
            "slim fit",
            "moisture wicking",
            "short sleeve",
            "relaxed fit",
        ],
        options: &[("color", COLORS_A), ("size", SIZES_CLOTH)],
        price: (9.0, 35.0),
    },
    Kind {
        path: ["Clothing, Shoes & Jewelry", "Women", "Dresses"],
        query: "dress",
        nouns: &["Dress", "Midi Dress", "Maxi Dress"],
        attrs: &[
            "machine wash",
            "polyester",
            "v neck",
            "long sleeve",
            "pockets",
            "elastic waist",
        ],
        options: &[("color", COLORS_A), ("size", SIZES_CLOTH)],
        price: (18.0, 70.0),
    },
    Kind {
        path: ["Clothing, Shoes & Jewelry", "Shoes", "Running Shoes"],
        query: "running shoes",
        nouns: &["Running Shoes", "Trail Running Shoes"],
        attrs: &[
            "non slip",
            "lightweight",
            "breathable",
            "rubber sole",
            "arch support",
            "memory foam",
        ],
        options: &[("color", COLORS_A), ("size", &["7", "8", "9", "10", "11"])],
        price: (30.0, 120.0),
    },
    Kind {
        path: ["Clothing, Shoes & Jewelry", "Accessories", "Backpacks"],
        query: "backpack",
        nouns: &["Backpack", "Laptop Backpack"],
        attrs: &[
            "water resistant",
            "usb charging port",
            "anti theft",
            "lightweight",
            "padded laptop sleeve",
        ],
        options: &[("color", COLORS_A)],
        price: (20.0, 80.0),
    },
    Kind {
        path: ["Cell Phones & Accessories", "Cases & Covers", "Phone Cases"],
        query: "phone case",
        nouns: &["Phone Case", "Protective Phone Case"],
        attrs: &[
            "shockproof",
            "wireless charging compatible",
            "slim",
            "drop protection",
            "screen protector included",
        ],
        options: &[
            ("style", &["wallet", "card holder", "clear back"]),
            ("color", COLORS_B),
        ],
        price: (7.0, 30.0),
    },
    Kind {
        path: ["Electronics", "Headphones", "Earbuds"],
        query: "headphones",
        nouns: &["Headphones", "Wireless Earbuds"],
        attrs: &[
            "noise cancelling",
            "bluetooth",
            "long battery life",
            "hands free",
            "water resistant",
            "fast charging",
        ],
        options: &[("color", COLORS_B)],
        price: (20.0, 150.0),
    },
    Kind {
        path: ["Electronics", "Accessories", "Charging Cables"],
        query: "charging cable",
        nouns: &["Charging Cable", "USB C Cable"],
        attrs: &[
            "fast charging",
            "braided",
            "usb c",
            "durable",
            "gold plated",
        ],
        options: &[("length", &["3 feet", "6 feet", "10 feet"])],
        price: (5.0, 25.0),
    },
    Kind {
        path: ["Home & Kitchen", "Lighting", "Desk Lamps"],
        query: "desk lamp",
        nouns: &["Desk Lamp", "LED Desk Lamp"],
        attrs: &[
            "dimmable",
            "usb charging port",
            "eye caring",
            "touch control",
            "energy efficient",
            "easy assemble",
        ],
        options: &[("color", COLORS_B)],
        price: (15.0, 60.0),
    },
    Kind {
        path: ["Home & Kitchen", "Bedding", "Pillows"],
        query: "pillow",
        nouns: &["Pillow", "Memory Foam Pillow"],
        attrs: &[
            "hypoallergenic",
            "machine washable",
            "cooling",
            "adjustable loft",
            "for side sleepers",
        ],
        options: &[("size", &["regular", "queen", "king"])],
        price: (15.0, 70.0),
    },
    Kind {
        path: ["Home & Kitchen", "Bath", "Towels"],
        query: "bath towels",
        nouns: &["Bath Towels", "Towel Set"],
        attrs: &[
            "quick dry",
            "highly absorbent",
            "cotton",
            "machine washable",
            "oversized",
        ],
        options: &[("color", &["white", "grey", "navy", "beige"])],
        price: (12.0, 55.0),
    },
    Kind {
        path: ["Sports & Outdoors", "Fitness", "Yoga Mats"],
        query: "yoga mat",
        nouns: &["Yoga Mat", "Exercise Mat"],
        attrs: &[
            "non slip",
            "extra thick",
            "eco friendly",
            "carrying strap",
            "lightweight",
        ],
        options: &[("color", &["purple", "blue", "black", "pink"])],
        price: (15.0, 60.0),
    },
    Kind {
        path: ["Sports & Outdoors", "Outdoor Recreation", "Water Bottles"],
        query: "water bottle",
        nouns: &["Water Bottle", "Insulated Water Bottle"],
        attrs: &[
            "bpa free",
            "leak proof",
            "stainless steel",
            "dishwasher safe",
            "keeps drinks cold",
        ],
        options: &[("capacity", &["18 ounce", "32 ounce", "64 ounce"])],
        price: (10.0, 45.0),
    },
    Kind {
        path: ["Pet Supplies", "Dogs", "Dog Food"],
        query: "dog food",
        nouns: &["Dry Dog Food", "Dog Food"],
        attrs: &[
            "grain free",
            "high protein",
            "natural ingredients",
            "for small breeds",
            "no artificial flavors",
        ],
        options: &[("flavor", &["chicken", "salmon", "lamb", "beef"])],
        price: (15.0, 80.0),
    },
    Kind {
        path: ["Home & Kitchen", "Home Decor", "Candles"],
        query: "scented candle",
        nouns: &["Scented Candle", "Soy Candle"],
        attrs: &[
            "soy wax",
            "long lasting",
            "non toxic",
            "hand poured",
            "cotton wick",
        ],
        options: &[("scent", &["vanilla", "lavender", "sea salt", "pine"])],
        price: (8.0, 40.0),
    },
];

const BRAND_HEADS: &[&str] = &[
    "Ka", "Ve", "Lo", "Mar", "Tri", "Zen", "Or", "Bel", "Cor", "Dra", "El", "Fen", "Quil", "Sa",
    "Tor", "Vy",
];
const BRAND_TAILS: &[&str] = &[
    "stra", "nix", "mora", "vel", "don", "lux", "tis", "ora", "tek", "ara", "wyn", "ette",
];

/// A brand name from the syllable tables.
fn brand(rng: &mut ChaCha8Rng) -> String {
    let h = BRAND_HEADS.choose(rng).copied().unwrap_or("Ka");
    let t = BRAND_TAILS.choose(rng).copied().unwrap_or("ra");
    format!("{h}{t}")
}

fn title_case(s: &str) -> String {
    s.split(' ')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Fixed seed of the built-in catalog: the catalog is a function of
/// (size, difficulty) only, the task seed picks the goal within it.
const CATALOG_SEED: u64 = 0x5745_4253_484f_5021;

/// Generator settings of one difficulty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenConfig {
    pub size: usize,
    /// Products per family of near-twins (1 = independent products).
    pub family: usize,
}

struct Draft {
    kind: usize,
    brand: String,
    noun: String,
    attrs: Vec<String>,
    options: Vec<(String, Vec<String>)>,
    price: f64,
}

fn draft(kind_idx: usize, rng: &mut ChaCha8Rng) -> Draft {
    let kind = &KINDS[kind_idx];
    let mut attrs: Vec<String> = kind.attrs.iter().map(|s| s.to_string()).collect();
    attrs.shuffle(rng);
    attrs.truncate(4.min(attrs.len()));
    let options = kind
        .options
        .iter()
        .map(|(name, values)| (name.to_string(), pick_values(values, rng)))
        .collect();
    let (lo, hi) = kind.price;
    let price = (rng.random_range(lo..hi)).floor() + 0.99;
    Draft {
        kind: kind_idx,
        brand: brand(rng),
        noun: kind
            .nouns
            .choose(rng)
            .copied()
            .unwrap_or(kind.query)
            .to_string(),
        attrs,
        options,
        price,
    }
}

/// A subset of 2..=all values, kept in the kind's order.
fn pick_values(values: &[&str], rng: &mut ChaCha8Rng) -> Vec<String> {
    let n = rng.random_range(2.min(values.len())..=values.len());
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.shuffle(rng);
    let mut chosen: Vec<usize> = idx[..n].to_vec();
    chosen.sort_unstable();
    chosen.into_iter().map(|i| values[i].to_string()).collect()
}

const FEATURE_TAILS: &[&str] = &[
    "for everyday use",
    "made to last",
    "tested by our team",
    "loved by customers",
    "with a satisfaction guarantee",
];

fn render(d: &Draft, asin: String, rng: &mut ChaCha8Rng) -> Product {
    let kind = &KINDS[d.kind];
    // Two of the attributes go into the title, as sellers do.
    let title_attrs: Vec<String> = d.attrs.iter().take(2).map(|a| title_case(a)).collect();
    let title = format!("{} {} {}", d.brand, title_attrs.join(" "), d.noun);
    let bullet_points = d
        .attrs
        .iter()
        .map(|a| {
            format!(
                "{} - {}",
                a.to_uppercase(),
                FEATURE_TAILS.choose(rng).copied().unwrap_or("")
            )
        })
        .collect();
    let description = format!(
        "{title}. This {} from {} is {}. Sold by {} in the {} department.",
        kind.query,
        d.brand,
        d.attrs.join(", "),
        d.brand,
        kind.path[0]
    );
    Product {
        asin,
        title,
        category: kind.path[0].to_lowercase(),
        query: kind.query.to_string(),
        product_category: kind.path.join(" › "),
        description,
        bullet_points,
        attributes: d.attrs.clone(),
        options: d.options.clone(),
        price: d.price,
    }
}

/// Draws at most for one fresh ASIN: 36^8 tails against at most 100,000
/// products, so this only stops a table edit from hanging the generator.
const MAX_ASIN_DRAWS: usize = 1000;

fn asin(rng: &mut ChaCha8Rng, used: &mut BTreeSet<String>) -> Option<String> {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    (0..MAX_ASIN_DRAWS).find_map(|_| {
        let tail: String = (0..8)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
            .collect();
        let a = format!("B0{tail}");
        used.insert(a.clone()).then_some(a)
    })
}

/// The near-twin variants of a base draft (hard catalogs).
fn variant(base: &Draft, which: usize, rng: &mut ChaCha8Rng) -> Draft {
    let kind = &KINDS[base.kind];
    let mut d = Draft {
        kind: base.kind,
        brand: base.brand.clone(),
        noun: base.noun.clone(),
        attrs: base.attrs.clone(),
        options: base.options.clone(),
        price: base.price,
    };
    match which % 3 {
        0 => {
            // One attribute swapped for another of the pool.
            let unused: Vec<&str> = kind
                .attrs
                .iter()
                .copied()
                .filter(|a| !d.attrs.iter().any(|x| x == a))
                .collect();
            if let Some(new) = unused.choose(rng) {
                let i = rng.random_range(0..d.attrs.len());
                d.attrs[i] = new.to_string();
            }
        }
        1 => {
            // Same product, priced far above any ceiling WebShop would set.
            d.price = (base.price * 2.0 + 45.0).floor() + 0.99;
        }
        _ => {
            // Another brand, other option values.
            d.brand = brand(rng);
            d.options = kind
                .options
                .iter()
                .map(|(name, values)| (name.to_string(), pick_values(values, rng)))
                .collect();
        }
    }
    d
}

/// The built-in catalog for a generator setting: deterministic, sorted by
/// nothing but generation order (the same on every machine). `None` if no
/// fresh product id came up (see `MAX_ASIN_DRAWS`).
pub fn generate(cfg: GenConfig) -> Option<Vec<Product>> {
    let mut rng =
        ChaCha8Rng::seed_from_u64(CATALOG_SEED ^ (cfg.size as u64) ^ ((cfg.family as u64) << 40));
    let mut used = BTreeSet::new();
    let mut out = Vec::with_capacity(cfg.size);
    let family = cfg.family.max(1);
    while out.len() < cfg.size {
        let base = draft(rng.random_range(0..KINDS.len()), &mut rng);
        let a = asin(&mut rng, &mut used)?;
        out.push(render(&base, a, &mut rng));
        for v in 1..family {
            if out.len() >= cfg.size {
                break;
            }
            let d = variant(&base, v - 1, &mut rng);
            let a = asin(&mut rng, &mut used)?;
            out.push(render(&d, a, &mut rng));
        }
    }
    Some(out)
}

/// Builds a goal whose target is `target`: `n_attrs` of its attributes,
/// one value for each of up to `n_options` of its option groups, WebShop's
/// price ceiling and an instruction sentence.
pub fn make_goal(target: &Product, n_attrs: usize, n_options: usize, rng: &mut ChaCha8Rng) -> Goal {
    let mut attrs = target.attributes.clone();
    attrs.shuffle(rng);
    attrs.truncate(n_attrs.max(1).min(attrs.len()));
    let mut groups: Vec<usize> = (0..target.options.len())
        .filter(|&i| !target.options[i].1.is_empty())
        .collect();
    groups.shuffle(rng);
    groups.truncate(n_options);
    groups.sort_unstable();
    let options: Vec<(String, String)> = groups
        .into_iter()
        .filter_map(|g| {
            let (name, values) = &target.options[g];
            values.choose(rng).map(|v| (name.clone(), v.clone()))
        })
        .collect();
    let price_upper = price_ceiling(target.price, rng);
    let lead = LEADS.choose(rng).copied().unwrap_or("i need");
    let instruction = instruction_text(lead, &attrs, &target.query, &options, price_upper);
    Goal {
        asin: target.asin.clone(),
        name: target.title.clone(),
        query: target.query.clone(),
        product_category: target.product_category.clone(),
        attributes: attrs,
        options,
        price_upper,
        instruction,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::{normalize_color, token_set_ratio};

    #[test]
    fn every_option_value_earns_its_option_point() {
        for kind in KINDS {
            for (name, values) in kind.options {
                for v in *values {
                    let goal = [(name.to_string(), v.to_string())];
                    assert_eq!(
                        crate::reward::option_matches(&[v.to_string()], &goal),
                        1,
                        "{}: {name} = {v}",
                        kind.query
                    );
                }
            }
        }
    }

    #[test]
    fn generator_is_deterministic_and_ids_unique() {
        let cfg = GenConfig {
            size: 300,
            family: 4,
        };
        let a = generate(cfg).unwrap();
        let b = generate(cfg).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 300);
        let ids: BTreeSet<&str> = a.iter().map(|p| p.asin.as_str()).collect();
        assert_eq!(ids.len(), 300);
    }

    #[test]
    fn option_values_of_a_kind_never_match_each_other() {
        // Otherwise choosing the wrong value would still earn the option point.
        for k in KINDS {
            for (name, values) in k.options {
                for (i, a) in values.iter().enumerate() {
                    for b in &values[i + 1..] {
                        let s = token_set_ratio(&normalize_color(a), &normalize_color(b));
                        assert!(s <= 85, "{} {name}: '{a}' vs '{b}' score {s}", k.query);
                    }
                }
            }
        }
    }

    #[test]
    fn attributes_of_a_kind_never_match_each_other() {
        for k in KINDS {
            for (i, a) in k.attrs.iter().enumerate() {
                for b in &k.attrs[i + 1..] {
                    let s = token_set_ratio(a, b);
                    assert!(
                        s <= 85 && !a.contains(b) && !b.contains(a),
                        "{}: '{a}' vs '{b}' score {s}",
                        k.query
                    );
                }
            }
        }
    }

    #[test]
    fn price_ceiling_follows_webshop() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..100 {
            let c = price_ceiling(23.99, &mut rng);
            // Two of {30, 40, 50, 60}, the larger: 40..=60.
            assert!([40.0, 50.0, 60.0].contains(&c), "{c}");
        }
        assert_eq!(price_ceiling(985.0, &mut rng), 1_000_000.0);
    }

    #[test]
    fn instruction_names_attributes_options_and_price() {
        let s = instruction_text(
            "i need",
            &["gluten free".into()],
            "coffee",
            &[("roast".into(), "dark roast".into())],
            40.0,
        );
        assert_eq!(
            s,
            "i need gluten free coffee with roast: dark roast, and price lower than 40.00 dollars"
        );
    }
}

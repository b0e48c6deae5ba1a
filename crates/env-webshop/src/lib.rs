//! WebShop: find and buy the product an instruction describes, in a text shop
//! with a real BM25 search engine (tantivy, through `agentrl-search-index`).
//!
//! Pages, as in WebShop: the search page, result pages (10 per page, up to 50
//! results, `next >` / `< prev`), the item page (options, `description`,
//! `features`, `buy now`) and its description / features sub-pages. Actions
//! are WebShop's `search[query]` and `click[...]`; results may be clicked by
//! product id or title. Buying ends the episode with WebShop's reward (see
//! [`reward`]); success means reward 1.
//!
//! Data: a built-in generated catalog (default), or WebShop's own files when
//! the `data_dir` parameter names a directory holding them (see [`loader`]).
//!
//! Parameters (`[env]` keys): `catalog_size` (100–100000), `data_dir`,
//! `goals` (`auto` | `human` | `synthetic`, for `data_dir`), `cache_dir`
//! (index cache directory, or `memory`), `max_steps`.

pub mod catalog;
mod expert;
pub mod loader;
pub mod parser;
pub mod reward;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use agentrl_env_core::{
    param_error, param_in_range, parse_params, stable_hash, task_rng, ActionError, Env,
    EnvDescriptor, EnvError, EnvParams, Episode, Outcome, Reservation, SharedCache, Step,
    StepError, TaskSpec, MAX_STEPS_PARAM, SHARED_DATA,
};
use agentrl_search_index::{data_hash, shared_index, IndexError, IndexLocation, SearchIndex};
use rand::seq::IndexedRandom;
use rand::Rng;
use serde::Deserialize;

use crate::catalog::{GenConfig, Goal, Product};
use crate::loader::{GoalSource, GoalTemplate};
use crate::parser::{normalize_target, Action};

/// Results per page, as WebShop.
pub const RESULTS_PER_PAGE: usize = 10;
/// Results a search returns at most, as WebShop (5 pages).
pub const MAX_RESULTS: usize = 50;
/// Registry name.
pub const NAME: &str = "webshop";

/// The registry entry.
pub fn descriptor() -> EnvDescriptor {
    EnvDescriptor {
        name: NAME,
        summary: "Shop a product catalog with a BM25 search engine: search[query], click[...]; WebShop's attribute/option/price reward",
        difficulties: &["easy", "hard"],
        default_max_turns: 15,
        request_params: &["catalog_size", "goals", "max_steps"],
        operator_params: &["data_dir", "cache_dir"],
        factory: |spec, params| Ok(Box::new(WebShopEnv::new(spec, params)?)),
    }
}

/// How goals are made for the catalog.
#[derive(Debug, Clone)]
enum GoalPool {
    /// Built-in catalog: any product is a target.
    Generated,
    /// WebShop files: goal templates from its instruction files.
    Loaded(Vec<GoalTemplate>),
}

/// A catalog with its search index, shared by every env over it.
#[derive(Debug)]
pub struct World {
    pub products: Vec<Product>,
    index: Arc<SearchIndex>,
    pool: GoalPool,
    /// Its share of the process's shared-data budget, held while it lives.
    _charge: Reservation,
}

impl World {
    /// BM25 search over the catalog: product indices, best first.
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<usize>, IndexError> {
        self.index.top_docs(query, limit)
    }
}

/// The `[env]` params (see the crate docs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    catalog_size: Option<usize>,
    data_dir: Option<PathBuf>,
    #[serde(default)]
    goals: GoalSource,
    #[serde(default = "IndexLocation::default_cache")]
    cache_dir: IndexLocation,
    #[serde(default = "default_max_steps")]
    max_steps: usize,
}

fn default_max_steps() -> usize {
    30
}

impl Params {
    fn new(params: &EnvParams) -> Result<Self, EnvError> {
        let p: Params = parse_params(NAME, params)?;
        if let Some(n) = p.catalog_size {
            param_in_range(NAME, "catalog_size", n, 100..=100_000)?;
            if p.data_dir.is_some() {
                return Err(param_error(
                    NAME,
                    "catalog_size",
                    "not used with data_dir (the files set the catalog)",
                ));
            }
        }
        param_in_range(NAME, "max_steps", p.max_steps, 1..=MAX_STEPS_PARAM)?;
        Ok(p)
    }
}

/// Generator setting of a difficulty.
fn gen_config(difficulty: &str, size: Option<usize>) -> GenConfig {
    match difficulty {
        "hard" => GenConfig {
            size: size.unwrap_or(10_000),
            family: 4,
        },
        _ => GenConfig {
            size: size.unwrap_or(1_000),
            family: 1,
        },
    }
}

fn build_world(
    products: Vec<Product>,
    pool: GoalPool,
    location: &IndexLocation,
    charge: Reservation,
) -> Result<World, EnvError> {
    let bodies = catalog::search_bodies(&products);
    let docs = catalog::search_docs(&products, &bodies);
    let index =
        shared_index(&docs, data_hash(&docs), location).map_err(|e| e.into_env_error(NAME))?;
    Ok(World {
        products,
        index,
        pool,
        _charge: charge,
    })
}

/// Memory a generated catalog holds besides its products (the index's
/// fixed structures), and per product with its share of the search index:
/// the RSS growth of a process creating catalogs of 1,000 to 50,000
/// products with an in-memory index, 2026-11-27 on a 2-core AMD EPYC Zen 5
/// with AVX-512 (+8 MiB at 1,000 products, +28 MiB at 10,000, +111 MiB at
/// 50,000).
const WORLD_BYTES_FIXED: usize = 5 << 20;
const WORLD_BYTES_PER_PRODUCT: usize = 2_500;

/// What a world over `products` products, or over the WebShop files in
/// `dir`, holds in memory, for the shared-data budget.
fn world_bytes(p: &Params, generated_size: usize) -> usize {
    match &p.data_dir {
        // Loaded data takes about what its JSON files take on disk.
        Some(dir) => std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len() as usize)
                    .sum()
            })
            .unwrap_or(0),
        None => WORLD_BYTES_FIXED + generated_size.saturating_mul(WORLD_BYTES_PER_PRODUCT),
    }
}

/// The shared catalog and index for a difficulty and parameters. Catalogs
/// are cached by source (generator setting or data directory): `bench envs`
/// and rollouts create one env per task, and none may regenerate, reload or
/// re-hash the catalog. Every catalog alive, in use or cached, counts
/// against [`SHARED_DATA`]: sessions over many distinct sizes cannot hold
/// more than that budget, whatever the session cap.
fn world_for(difficulty: &str, p: &Params) -> Result<Arc<World>, EnvError> {
    // Both difficulties plus a couple of catalog sizes; a client cycling
    // through sizes evicts the oldest instead of growing memory.
    static WORLDS: SharedCache<String, World> = SharedCache::new(4);
    let generated = gen_config(difficulty, p.catalog_size);
    let key = match &p.data_dir {
        Some(dir) => format!("dir:{}:{:?}", dir.display(), p.goals),
        None => format!("gen:{}:{}", generated.size, generated.family),
    };
    let bytes = world_bytes(p, generated.size);
    WORLDS.get_or_try_build_charged(
        key,
        bytes,
        &SHARED_DATA,
        |charge| match &p.data_dir {
            Some(dir) => {
                let data = loader::load_dir(dir, p.goals)?;
                build_world(
                    data.products,
                    GoalPool::Loaded(data.goals),
                    &p.cache_dir,
                    charge,
                )
            }
            None => {
                let products = catalog::generate(generated)
                    .ok_or_else(|| EnvError::generation(NAME, "no fresh product id came up"))?;
                build_world(products, GoalPool::Generated, &p.cache_dir, charge)
            }
        },
        |over| EnvError::Busy {
            env: NAME.to_string(),
            reason: match &p.data_dir {
                Some(dir) => format!("no room for the catalog of {}: {over}", dir.display()),
                None => format!(
                    "no room for a catalog of {} products: {over}",
                    generated.size
                ),
            },
        },
    )
}

/// Which sub-page of an item is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    Description,
    Features,
}

/// The page the agent is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Page {
    Search,
    /// Result page `page` (0-based).
    Results {
        page: usize,
    },
    /// Product `product` (catalog index), opened from result page `page`.
    Item {
        product: usize,
        page: usize,
    },
    Detail {
        product: usize,
        page: usize,
        which: Detail,
    },
}

/// One WebShop task.
pub struct WebShopEnv {
    spec: TaskSpec,
    world: Arc<World>,
    goal: Goal,
    page: Page,
    query: String,
    results: Vec<usize>,
    /// Chosen option values by option name.
    selected: BTreeMap<String, String>,
    episode: Episode,
    last_reward: Option<reward::RewardBreakdown>,
}

agentrl_env_core::debug_fields!(WebShopEnv { spec, goal, page });

impl WebShopEnv {
    /// Create the env for a spec (see the crate docs for parameters).
    pub fn new(spec: &TaskSpec, params: &EnvParams) -> Result<Self, EnvError> {
        let p = Params::new(params)?;
        let world = world_for(&spec.difficulty, &p)?;
        let mut rng = task_rng(spec)?;
        let hard = spec.difficulty == "hard";
        let goal = match &world.pool {
            GoalPool::Generated => {
                let target = &world.products[rng.random_range(0..world.products.len())];
                let (n_attrs, n_options) = if hard {
                    (rng.random_range(2..=3), 2)
                } else {
                    (1, 1)
                };
                catalog::make_goal(target, n_attrs, n_options, &mut rng)
            }
            GoalPool::Loaded(templates) => {
                let ids = loader::split_goals(templates, &world.products, spec.split);
                let t = &templates[*ids
                    .choose(&mut rng)
                    .ok_or_else(|| EnvError::InvalidSpec("no goals".into()))?];
                loaded_goal(t, &world.products[t.product], &mut rng)
            }
        };
        let mut env = WebShopEnv {
            spec: spec.clone(),
            world,
            goal,
            page: Page::Search,
            query: String::new(),
            results: Vec::new(),
            selected: BTreeMap::new(),
            episode: Episode::new(p.max_steps),
            last_reward: None,
        };
        env.reset();
        Ok(env)
    }

    /// The goal of this task.
    pub fn goal(&self) -> &Goal {
        &self.goal
    }

    /// The shared catalog.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// The current page.
    pub fn page(&self) -> &Page {
        &self.page
    }

    /// The reward buying catalog product `product` would earn with the option
    /// values that match the goal chosen (the expert's scoring of a product).
    pub fn achievable_reward(&self, product: usize) -> f64 {
        expert::achievable(self, product)
    }

    /// Product indices of the current search results, best first.
    pub fn results(&self) -> &[usize] {
        &self.results
    }

    /// The reward breakdown of the purchase, once bought.
    pub fn last_reward(&self) -> Option<&reward::RewardBreakdown> {
        self.last_reward.as_ref()
    }

    fn num_pages(&self) -> usize {
        self.results.len().div_ceil(RESULTS_PER_PAGE)
    }

    fn page_results(&self, page: usize) -> &[usize] {
        let start = (page * RESULTS_PER_PAGE).min(self.results.len());
        let end = (start + RESULTS_PER_PAGE).min(self.results.len());
        &self.results[start..end]
    }

    fn header(&self) -> String {
        format!("Instruction: {}\n", self.goal.instruction)
    }

    fn render(&self) -> String {
        let mut s = self.header();
        match &self.page {
            Page::Search => s.push_str("[Search]\n"),
            Page::Results { page } => {
                s.push_str("[Back to Search]\n");
                s.push_str(&format!(
                    "Page {} (Total results: {})\n",
                    page + 1,
                    self.results.len()
                ));
                if *page > 0 {
                    s.push_str("[< Prev]\n");
                }
                if page + 1 < self.num_pages() {
                    s.push_str("[Next >]\n");
                }
                if self.results.is_empty() {
                    s.push_str(&format!("No products match '{}'.\n", self.query));
                }
                for &i in self.page_results(*page) {
                    let p = &self.world.products[i];
                    s.push_str(&format!("[{}] {}\n${:.2}\n", p.asin, p.title, p.price));
                }
            }
            Page::Item { product, .. } => {
                let p = &self.world.products[*product];
                s.push_str("[Back to Search]\n[< Prev]\n");
                for (name, values) in &p.options {
                    let vals: Vec<String> = values.iter().map(|v| format!("[{v}]")).collect();
                    s.push_str(&format!("{name}: {}", vals.join(" ")));
                    if let Some(sel) = self.selected.get(name) {
                        s.push_str(&format!("  (selected: {sel})"));
                    }
                    s.push('\n');
                }
                s.push_str(&format!(
                    "{}\nPrice: ${:.2}\nRating: N.A.\n",
                    p.title, p.price
                ));
                s.push_str("[Description] [Features] [Buy Now]\n");
            }
            Page::Detail { product, which, .. } => {
                let p = &self.world.products[*product];
                s.push_str("[Back to Search]\n[< Prev]\n");
                match which {
                    Detail::Description => s.push_str(&format!("{}\n", p.description)),
                    Detail::Features => {
                        for b in &p.bullet_points {
                            s.push_str(&format!("- {b}\n"));
                        }
                    }
                }
            }
        }
        s
    }

    /// The clickable targets of the current page, in display order (as typed in `click[...]`).
    fn clickables(&self) -> Vec<String> {
        match &self.page {
            Page::Search => Vec::new(),
            Page::Results { page } => {
                let mut c = vec!["back to search".to_string()];
                if *page > 0 {
                    c.push("< prev".into());
                }
                if page + 1 < self.num_pages() {
                    c.push("next >".into());
                }
                c.extend(
                    self.page_results(*page)
                        .iter()
                        .map(|&i| self.world.products[i].asin.to_lowercase()),
                );
                c
            }
            Page::Item { product, .. } => {
                let mut c = vec!["back to search".to_string(), "< prev".into()];
                for (_, values) in &self.world.products[*product].options {
                    c.extend(values.iter().cloned());
                }
                c.extend(["description".into(), "features".into(), "buy now".into()]);
                c
            }
            Page::Detail { .. } => vec!["back to search".into(), "< prev".into()],
        }
    }

    fn unknown_click(&self, target: &str) -> ActionError {
        let clickables: Vec<String> = self
            .clickables()
            .iter()
            .map(|c| format!("click[{c}]"))
            .collect();
        ActionError::unknown(&format!("click[{target}]"), clickables.join(", "))
    }

    /// Apply a parsed action; `Err` leaves the state untouched. A search the
    /// index fails to answer is refused with the index's error, never shown
    /// as an empty result page.
    fn apply(&mut self, action: Action) -> Result<(f64, bool), ActionError> {
        match action {
            Action::Search(q) => {
                if self.page != Page::Search {
                    return Err(ActionError::not_possible(
                        &format!("search[{q}]"),
                        "search is only possible on the search page; click[back to search] first",
                    ));
                }
                self.results = self
                    .world
                    .search(&q, MAX_RESULTS)
                    .map_err(|e| e.into_refusal(&format!("search[{q}]")))?;
                self.query = q;
                self.page = Page::Results { page: 0 };
                Ok((0.0, true))
            }
            Action::Click(target) => self.click(&target),
        }
    }

    fn click(&mut self, target: &str) -> Result<(f64, bool), ActionError> {
        let page = self.page.clone();
        if target == "back to search" && page != Page::Search {
            self.page = Page::Search;
            self.selected.clear();
            return Ok((0.0, true));
        }
        match page {
            Page::Search => Err(ActionError::not_possible(
                &format!("click[{target}]"),
                "nothing to click on the search page; use search[query]",
            )),
            Page::Results { page } => {
                if target == "next >" && page + 1 < self.num_pages() {
                    self.page = Page::Results { page: page + 1 };
                    return Ok((0.0, true));
                }
                if target == "< prev" && page > 0 {
                    self.page = Page::Results { page: page - 1 };
                    return Ok((0.0, true));
                }
                let hit = self.page_results(page).iter().copied().find(|&i| {
                    let p = &self.world.products[i];
                    p.asin.to_lowercase() == target || normalize_target(&p.title) == target
                });
                match hit {
                    Some(product) => {
                        self.page = Page::Item { product, page };
                        self.selected.clear();
                        Ok((0.0, true))
                    }
                    None => Err(self.unknown_click(target)),
                }
            }
            Page::Item { product, page } => match target {
                "< prev" => {
                    self.page = Page::Results { page };
                    Ok((0.0, true))
                }
                "description" | "features" => {
                    let which = if target == "description" {
                        Detail::Description
                    } else {
                        Detail::Features
                    };
                    self.page = Page::Detail {
                        product,
                        page,
                        which,
                    };
                    Ok((0.0, true))
                }
                "buy now" => Ok(self.buy(product)),
                _ => {
                    let p = &self.world.products[product];
                    let found = p.options.iter().find_map(|(name, values)| {
                        values
                            .iter()
                            .find(|v| normalize_target(v) == target)
                            .map(|v| (name, v))
                    });
                    match found {
                        Some((name, value)) => {
                            let changed = self.selected.get(name) != Some(value);
                            self.selected.insert(name.clone(), value.clone());
                            Ok((0.0, changed))
                        }
                        None => Err(self.unknown_click(target)),
                    }
                }
            },
            Page::Detail { product, page, .. } => match target {
                "< prev" => {
                    self.page = Page::Item { product, page };
                    Ok((0.0, true))
                }
                _ => Err(self.unknown_click(target)),
            },
        }
    }

    fn chosen_options(&self, product: usize) -> Vec<String> {
        // In the product's option order, as WebShop's `options.values()`.
        self.world.products[product]
            .options
            .iter()
            .filter_map(|(name, _)| self.selected.get(name).cloned())
            .collect()
    }

    fn buy(&mut self, product: usize) -> (f64, bool) {
        let p = &self.world.products[product];
        let r = reward::reward(p, &self.goal, p.price, &self.chosen_options(product));
        let total = r.total;
        self.last_reward = Some(r);
        (total, true)
    }

    fn state_text(&self) -> String {
        let page = match &self.page {
            Page::Search => "search".to_string(),
            Page::Results { page } => format!("results:{page}"),
            Page::Item { product, .. } => format!("item:{}", self.world.products[*product].asin),
            Page::Detail { product, which, .. } => {
                format!("detail:{}:{which:?}", self.world.products[*product].asin)
            }
        };
        let sel: Vec<String> = self
            .selected
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let done = self.episode.is_done();
        format!("{page}|{}|{}|{done}", self.query, sel.join(","))
    }
}

/// A goal from a WebShop file template: fixed (human) or drawn (synthetic)
/// options, WebShop's price ceiling and instruction format.
fn loaded_goal(t: &GoalTemplate, target: &Product, rng: &mut agentrl_env_core::TaskRng) -> Goal {
    let price_upper = catalog::price_ceiling(target.price, rng);
    let price_text = if price_upper < 1_000_000.0 {
        format!(", and price lower than {price_upper:.2} dollars")
    } else {
        String::new()
    };
    let (options, instruction) = match &t.options {
        Some(fixed) => (fixed.clone(), format!("{}{price_text}", t.instruction)),
        None => {
            let mut names: Vec<&(String, Vec<String>)> = target
                .options
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .collect();
            names.sort_by(|a, b| a.0.cmp(&b.0));
            let opts: Vec<(String, String)> = names
                .iter()
                .filter_map(|(n, v)| v.choose(rng).map(|v| (n.clone(), v.clone())))
                .collect();
            let option_text = if opts.is_empty() {
                String::new()
            } else {
                let parts: Vec<String> = opts.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                format!(" with {}", parts.join(", and "))
            };
            (opts, format!("{}{option_text}{price_text}", t.instruction))
        }
    };
    Goal {
        asin: target.asin.clone(),
        name: target.title.clone(),
        query: target.query.clone(),
        product_category: target.product_category.clone(),
        attributes: t.attributes.clone(),
        options,
        price_upper,
        instruction,
    }
}

impl Env for WebShopEnv {
    fn spec(&self) -> &TaskSpec {
        &self.spec
    }

    fn instructions(&self) -> String {
        format!(
            "You are shopping in an online store. Find and buy the product the instruction describes.\n\
             Actions (one per turn):\n\
             - search[query]: search the catalog (only on the search page); results come 10 per page.\n\
             - click[target]: click a button shown in [brackets]: a product id or title on a result page, \
             'next >', '< prev', 'back to search', an option value on a product page, 'description', \
             'features', or 'buy now'.\n\
             Choose the requested options before you click 'buy now'; buying ends the episode.\n\
             The reward counts the requested attributes, options and price ceiling that the bought product meets.\n\
             You have at most {} actions.",
            self.episode.max_steps()
        )
    }

    fn reset(&mut self) -> String {
        self.page = Page::Search;
        self.query.clear();
        self.results.clear();
        self.selected.clear();
        self.episode.reset();
        self.last_reward = None;
        self.render()
    }

    fn step(&mut self, action: &str) -> Result<Step, StepError> {
        let parsed = self.episode.begin(action, parser::parse)?;
        let (reward, effective) = self.apply(parsed).map_err(|e| self.episode.reject(e))?;
        // Buying ends the episode; only a perfect purchase is a success.
        let outcome = match &self.last_reward {
            Some(r) if (r.total - 1.0).abs() < 1e-9 => Outcome::Won,
            Some(_) => Outcome::Lost,
            None => Outcome::Running,
        };
        let out_of_steps = self.episode.settle(outcome);
        let mut observation = self.render();
        let mut extra = serde_json::Map::new();
        if let Some(r) = &self.last_reward {
            extra.insert("r_type".into(), r.r_type.into());
            extra.insert("title_score".into(), r.title_score.into());
            extra.insert("attr_matches".into(), (r.attr_matches as u64).into());
            extra.insert("option_matches".into(), (r.option_matches as u64).into());
            extra.insert("price_ok".into(), r.price_ok.into());
            observation = format!(
                "Thank you for shopping with us!\nYour score (min 0.0, max 1.0): {:.4}\n",
                r.total
            );
        } else if out_of_steps {
            observation.push_str("The action budget is exhausted; nothing was bought.\n");
        }
        Ok(self
            .episode
            .step_result(observation, reward, effective, extra))
    }

    fn observation(&self) -> String {
        match &self.last_reward {
            Some(r) => format!(
                "Thank you for shopping with us!\nYour score (min 0.0, max 1.0): {:.4}\n",
                r.total
            ),
            None => self.render(),
        }
    }

    fn available_actions(&self) -> Vec<String> {
        self.episode.offer(|| match self.page {
            Page::Search => vec![format!(
                "search[{}]",
                expert::representative_query(&self.goal)
            )],
            _ => self
                .clickables()
                .into_iter()
                .map(|c| format!("click[{c}]"))
                .collect(),
        })
    }

    fn state_key(&self) -> u64 {
        let seed = self.spec.seed.to_le_bytes();
        stable_hash(&[
            self.spec.env.as_bytes(),
            self.spec.split.as_str().as_bytes(),
            self.spec.difficulty.as_bytes(),
            &seed,
            self.state_text().as_bytes(),
        ])
    }

    fn expert_action(&mut self) -> Option<String> {
        if self.episode.is_done() {
            return None;
        }
        expert::next_action(self)
    }

    fn episode(&self) -> Option<&Episode> {
        Some(&self.episode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrl_env_core::Split;

    #[test]
    fn catalogs_of_many_sizes_do_not_stay_in_memory() {
        // A client asking for one catalog size after another, closing each
        // session at once: only the cache's few catalogs stay alive.
        let mut freed = Vec::new();
        for size in 100..112u64 {
            let mut p = EnvParams::new();
            p.insert("catalog_size".into(), size.into());
            p.insert("cache_dir".into(), "memory".into());
            let env = WebShopEnv::new(&TaskSpec::new(NAME, Split::Train, "easy", 0), &p).unwrap();
            freed.push((Arc::downgrade(&env.world), Arc::downgrade(&env.world.index)));
        }
        let alive_worlds = freed.iter().filter(|(w, _)| w.strong_count() > 0).count();
        let alive_indexes = freed.iter().filter(|(_, i)| i.strong_count() > 0).count();
        assert!(alive_worlds <= 4, "{alive_worlds} catalogs still in memory");
        assert!(
            alive_indexes <= 8,
            "{alive_indexes} indexes still in memory"
        );
        assert_eq!(freed[0].0.strong_count(), 0, "the oldest catalog was freed");
        assert_eq!(freed[0].1.strong_count(), 0, "and its index with it");
    }
}

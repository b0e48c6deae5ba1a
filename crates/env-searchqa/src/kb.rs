//! The built-in synthetic knowledge base: countries, cities, companies and
//! people with made-up names (so no model can answer from memory), linked by
//! relations, each entity rendered as one passage; and the questions over it,
//! 1-hop (`easy`) or 2–3-hop (`hard`).

use std::collections::BTreeSet;

use agentrl_search_index::DocRef;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One passage of the corpus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passage {
    pub id: String,
    pub title: String,
    pub text: String,
}

/// The documents the search engine indexes: each passage's title and text.
pub fn search_docs(passages: &[Passage]) -> Vec<DocRef<'_>> {
    passages
        .iter()
        .map(|p| DocRef {
            title: &p.title,
            body: &p.text,
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Country {
    name: String,
    capital: usize,
    language: String,
}

#[derive(Debug, Clone)]
struct City {
    name: String,
    country: usize,
    population: u32,
}

#[derive(Debug, Clone)]
struct Company {
    name: String,
    industry: &'static str,
    city: usize,
    year: u32,
    founder: usize,
}

#[derive(Debug, Clone)]
struct Person {
    name: String,
    occupation: &'static str,
    city: usize,
    year: u32,
    employer: usize,
}

/// An entity reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Entity {
    Country(usize),
    City(usize),
    Company(usize),
    Person(usize),
}

/// The generated knowledge base and its passages (one per entity).
#[derive(Debug, Clone)]
pub struct Kb {
    countries: Vec<Country>,
    cities: Vec<City>,
    companies: Vec<Company>,
    people: Vec<Person>,
    pub passages: Vec<Passage>,
}

/// A question with its gold answer and the chain of entities whose passages
/// hold the facts needed, in the order an agent must look them up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    pub question: String,
    pub answers: Vec<String>,
    /// Passage titles to retrieve, hop by hop.
    pub chain: Vec<String>,
}

const SYLLABLES: &[&str] = &[
    "ka", "lo", "mi", "ren", "tor", "val", "sha", "dun", "bel", "cor", "fen", "gal", "hal", "is",
    "jor", "kel", "lin", "mor", "nes", "or", "pal", "quin", "ras", "sel", "tam", "ul", "ven",
    "wyn", "yar", "zel", "ath", "bri", "cal", "dor", "el", "fa", "gri", "hol", "ist", "lum",
];
const CITY_SUFFIXES: &[&str] = &["ford", "holm", "ton", "by", "vik", "stad", "mouth", "ridge"];
const COUNTRY_SUFFIXES: &[&str] = &["ia", "land", "stan", "ora"];
const INDUSTRIES: &[(&str, &str)] = &[
    ("software", "Systems"),
    ("food", "Foods"),
    ("automotive", "Motors"),
    ("research", "Labs"),
    ("textile", "Textiles"),
    ("pharmaceutical", "Pharma"),
    ("energy", "Energy"),
    ("shipping", "Logistics"),
];
const OCCUPATIONS: &[&str] = &[
    "chemist",
    "painter",
    "engineer",
    "historian",
    "architect",
    "pilot",
    "composer",
    "surgeon",
    "economist",
    "poet",
];

fn cap(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// Syllables per name stem so that the stems (times `variants` suffixes) can
/// name `n` entities with room to spare: at least 2, more for large KBs
/// (otherwise drawing unique names would never finish).
fn stem_len(n: usize, variants: usize) -> usize {
    let mut k = 2;
    while SYLLABLES.len().pow(k as u32) * variants < 4 * n {
        k += 1;
    }
    k
}

fn word(rng: &mut ChaCha8Rng, syllables: usize) -> String {
    (0..syllables)
        .map(|_| *SYLLABLES.choose(rng).unwrap_or(&"ka"))
        .collect()
}

/// Draws at most for one fresh name: [`stem_len`] leaves at least 3 in 4
/// draws fresh, so this only stops a table edit from hanging the generator.
const MAX_NAME_DRAWS: usize = 1000;

/// A name not used before (names are unique across the whole KB); `None`
/// after [`MAX_NAME_DRAWS`] taken names in a row.
fn unique(
    rng: &mut ChaCha8Rng,
    used: &mut BTreeSet<String>,
    mut make: impl FnMut(&mut ChaCha8Rng) -> String,
) -> Option<String> {
    (0..MAX_NAME_DRAWS).find_map(|_| {
        let n = make(rng);
        used.insert(n.to_lowercase()).then_some(n)
    })
}

/// Fixed seed: the KB is a function of its size only.
const KB_SEED: u64 = 0x5345_4152_4348_5141;

impl Kb {
    /// Generate a KB with about `size` passages (at least 40); `None` if the
    /// name tables ran out of fresh names.
    pub fn generate(size: usize) -> Option<Kb> {
        let size = size.max(40);
        let mut rng = ChaCha8Rng::seed_from_u64(KB_SEED ^ size as u64);
        let mut used = BTreeSet::new();
        let n_countries = (size / 50).max(4);
        let n_cities = (size / 10).max(n_countries * 2);
        let n_companies = size / 5;
        let n_people = size
            .saturating_sub(n_countries + n_cities + n_companies)
            .max(4);

        let n_languages = (n_countries / 3).max(3);
        let (k_lang, k_country) = (
            stem_len(n_languages, 1),
            stem_len(n_countries, COUNTRY_SUFFIXES.len()),
        );
        let (k_city, k_company) = (
            stem_len(n_cities, CITY_SUFFIXES.len()),
            stem_len(n_companies, INDUSTRIES.len()),
        );
        let languages: Vec<String> = (0..n_languages)
            .map(|_| unique(&mut rng, &mut used, |r| cap(&word(r, k_lang)) + "ic"))
            .collect::<Option<_>>()?;
        let mut countries: Vec<Country> = (0..n_countries)
            .map(|_| {
                let name = unique(&mut rng, &mut used, |r| {
                    cap(&word(r, k_country)) + COUNTRY_SUFFIXES.choose(r).copied().unwrap_or("ia")
                })?;
                let language = languages.choose(&mut rng).cloned().unwrap_or_default();
                Some(Country {
                    name,
                    capital: 0,
                    language,
                })
            })
            .collect::<Option<_>>()?;
        let cities: Vec<City> = (0..n_cities)
            .map(|i| {
                let name = unique(&mut rng, &mut used, |r| {
                    cap(&word(r, k_city)) + CITY_SUFFIXES.choose(r).copied().unwrap_or("ton")
                })?;
                // Every country gets a city first; its first city is its capital.
                let country = if i < n_countries {
                    i
                } else {
                    rng.random_range(0..n_countries)
                };
                Some(City {
                    name,
                    country,
                    population: rng.random_range(5..2000) * 1000,
                })
            })
            .collect::<Option<_>>()?;
        for (i, c) in countries.iter_mut().enumerate() {
            c.capital = i;
        }
        let mut companies: Vec<Company> = (0..n_companies)
            .map(|_| {
                let (industry, suffix) = *INDUSTRIES.choose(&mut rng).unwrap_or(&INDUSTRIES[0]);
                let name = unique(&mut rng, &mut used, |r| {
                    format!("{} {suffix}", cap(&word(r, k_company)))
                })?;
                Some(Company {
                    name,
                    industry,
                    city: rng.random_range(0..n_cities),
                    year: rng.random_range(1850..2020),
                    founder: 0,
                })
            })
            .collect::<Option<_>>()?;
        let people: Vec<Person> = (0..n_people)
            .map(|_| {
                let name = unique(&mut rng, &mut used, |r| {
                    format!("{} {}", cap(&word(r, 2)), cap(&word(r, 3)))
                })?;
                Some(Person {
                    name,
                    occupation: OCCUPATIONS.choose(&mut rng).copied().unwrap_or("chemist"),
                    city: rng.random_range(0..n_cities),
                    year: rng.random_range(1900..2000),
                    employer: rng.random_range(0..n_companies.max(1)),
                })
            })
            .collect::<Option<_>>()?;
        for c in companies.iter_mut() {
            c.founder = rng.random_range(0..n_people);
        }

        let mut kb = Kb {
            countries,
            cities,
            companies,
            people,
            passages: Vec::new(),
        };
        kb.passages = kb.render();
        Some(kb)
    }

    fn render(&self) -> Vec<Passage> {
        let mut out = Vec::new();
        for c in &self.countries {
            out.push((
                c.name.clone(),
                format!(
                    "{} is a country. Its capital is {}. The official language of {} is {}.",
                    c.name, self.cities[c.capital].name, c.name, c.language
                ),
            ));
        }
        for c in &self.cities {
            out.push((
                c.name.clone(),
                format!(
                    "{} is a city in {}. It has a population of about {}.",
                    c.name, self.countries[c.country].name, c.population
                ),
            ));
        }
        for c in &self.companies {
            out.push((
                c.name.clone(),
                format!(
                    "{} is a {} company founded in {} by {}. Its headquarters are in {}.",
                    c.name,
                    c.industry,
                    c.year,
                    self.people[c.founder].name,
                    self.cities[c.city].name
                ),
            ));
        }
        for p in &self.people {
            out.push((
                p.name.clone(),
                format!(
                    "{} is a {} born in {} in {}. {} works for {}.",
                    p.name,
                    p.occupation,
                    self.cities[p.city].name,
                    p.year,
                    p.name,
                    self.companies
                        .get(p.employer)
                        .map(|c| c.name.as_str())
                        .unwrap_or("no company")
                ),
            ));
        }
        out.into_iter()
            .enumerate()
            .map(|(i, (title, text))| Passage {
                id: i.to_string(),
                title,
                text,
            })
            .collect()
    }

    fn name(&self, e: Entity) -> String {
        match e {
            Entity::Country(i) => self.countries[i].name.clone(),
            Entity::City(i) => self.cities[i].name.clone(),
            Entity::Company(i) => self.companies[i].name.clone(),
            Entity::Person(i) => self.people[i].name.clone(),
        }
    }

    /// A question of `hops` hops (1 to 3), drawn with `rng`.
    pub fn question(&self, hops: usize, rng: &mut ChaCha8Rng) -> Question {
        let p = rng.random_range(0..self.people.len());
        let person = &self.people[p];
        let pname = person.name.clone();
        let co = person.employer.min(self.companies.len().saturating_sub(1));
        let c = rng.random_range(0..self.companies.len());
        let company = &self.companies[c];
        let cname = company.name.clone();
        let city = rng.random_range(0..self.cities.len());
        let cityname = self.cities[city].name.clone();
        let country_of = |city: usize| self.cities[city].country;
        let chain = |es: &[Entity]| es.iter().map(|e| self.name(*e)).collect::<Vec<_>>();
        let q = |question: String, answer: String, es: &[Entity]| Question {
            question,
            answers: vec![answer],
            chain: chain(es),
        };
        match hops {
            1 => match rng.random_range(0..8) {
                0 => q(
                    format!("In which city was {pname} born?"),
                    self.cities[person.city].name.clone(),
                    &[Entity::Person(p)],
                ),
                1 => q(
                    format!("Which company does {pname} work for?"),
                    self.companies[co].name.clone(),
                    &[Entity::Person(p)],
                ),
                2 => q(
                    format!("In what year was {pname} born?"),
                    person.year.to_string(),
                    &[Entity::Person(p)],
                ),
                3 => q(
                    format!("In which city is {cname} headquartered?"),
                    self.cities[company.city].name.clone(),
                    &[Entity::Company(c)],
                ),
                4 => q(
                    format!("Who founded {cname}?"),
                    self.people[company.founder].name.clone(),
                    &[Entity::Company(c)],
                ),
                5 => q(
                    format!("In what year was {cname} founded?"),
                    company.year.to_string(),
                    &[Entity::Company(c)],
                ),
                6 => q(
                    format!("Which country is {cityname} in?"),
                    self.countries[country_of(city)].name.clone(),
                    &[Entity::City(city)],
                ),
                _ => {
                    let k = country_of(city);
                    let kname = self.countries[k].name.clone();
                    q(
                        format!("What is the official language of {kname}?"),
                        self.countries[k].language.clone(),
                        &[Entity::Country(k)],
                    )
                }
            },
            2 => match rng.random_range(0..6) {
                0 => q(
                    format!("In which country was {pname} born?"),
                    self.countries[country_of(person.city)].name.clone(),
                    &[Entity::Person(p), Entity::City(person.city)],
                ),
                1 => q(
                    format!("In which city is the company that {pname} works for headquartered?"),
                    self.cities[self.companies[co].city].name.clone(),
                    &[Entity::Person(p), Entity::Company(co)],
                ),
                2 => q(
                    format!("Who founded the company that {pname} works for?"),
                    self.people[self.companies[co].founder].name.clone(),
                    &[Entity::Person(p), Entity::Company(co)],
                ),
                3 => q(
                    format!("In which city was the founder of {cname} born?"),
                    self.cities[self.people[company.founder].city].name.clone(),
                    &[Entity::Company(c), Entity::Person(company.founder)],
                ),
                4 => q(
                    format!("In which country is {cname} headquartered?"),
                    self.countries[country_of(company.city)].name.clone(),
                    &[Entity::Company(c), Entity::City(company.city)],
                ),
                _ => {
                    let k = country_of(city);
                    q(
                        format!("What is the capital of the country where {cityname} is located?"),
                        self.cities[self.countries[k].capital].name.clone(),
                        &[Entity::City(city), Entity::Country(k)],
                    )
                }
            },
            _ => {
                match rng.random_range(0..4) {
                    0 => {
                        let hq = self.companies[co].city;
                        q(
                        format!("In which country is the headquarters of the company that {pname} works for?"),
                        self.countries[country_of(hq)].name.clone(),
                        &[Entity::Person(p), Entity::Company(co), Entity::City(hq)],
                    )
                    }
                    1 => {
                        let f = company.founder;
                        let fc = self.people[f].city;
                        q(
                            format!("In which country was the founder of {cname} born?"),
                            self.countries[country_of(fc)].name.clone(),
                            &[Entity::Company(c), Entity::Person(f), Entity::City(fc)],
                        )
                    }
                    2 => {
                        let k = country_of(person.city);
                        q(
                            format!("What is the capital of the country where {pname} was born?"),
                            self.cities[self.countries[k].capital].name.clone(),
                            &[
                                Entity::Person(p),
                                Entity::City(person.city),
                                Entity::Country(k),
                            ],
                        )
                    }
                    _ => {
                        let k = country_of(person.city);
                        q(
                        format!("What is the official language of the country where {pname} was born?"),
                        self.countries[k].language.clone(),
                        &[Entity::Person(p), Entity::City(person.city), Entity::Country(k)],
                    )
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_stems_grow_with_the_kb() {
        assert_eq!(stem_len(300, 8), 2);
        // 20,000 companies cannot be named from 2-syllable stems (12,800 names).
        assert_eq!(stem_len(20_000, 8), 3);
    }

    #[test]
    fn kb_is_deterministic_with_unique_titles() {
        let a = Kb::generate(500).unwrap();
        let b = Kb::generate(500).unwrap();
        assert_eq!(a.passages, b.passages);
        assert_eq!(a.passages.len(), 500);
        let titles: BTreeSet<String> = a.passages.iter().map(|p| p.title.to_lowercase()).collect();
        assert_eq!(titles.len(), a.passages.len());
    }

    #[test]
    fn every_hop_passage_states_the_next_entity_and_the_last_the_answer() {
        let kb = Kb::generate(500).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for hops in 1..=3 {
            for _ in 0..50 {
                let q = kb.question(hops, &mut rng);
                assert_eq!(q.chain.len(), hops);
                let text = |t: &str| {
                    kb.passages
                        .iter()
                        .find(|p| p.title == t)
                        .unwrap()
                        .text
                        .clone()
                };
                for w in q.chain.windows(2) {
                    assert!(text(&w[0]).contains(&w[1]), "{q:?}");
                }
                assert!(
                    text(q.chain.last().unwrap()).contains(&q.answers[0]),
                    "{q:?}"
                );
            }
        }
    }
}

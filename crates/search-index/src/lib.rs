//! A BM25 full-text index over a fixed list of documents, built with tantivy
//! and shared by the retrieval environments (webshop, searchqa).
//!
//! Documents are identified by their position (ordinal) in the list the index
//! was built from; the index stores only that ordinal, the caller keeps the
//! documents. An index is keyed by a stable hash of its documents:
//! - on disk, under `<cache dir>/<hash>/`, so a catalog is indexed once per
//!   machine ([`IndexLocation::Dir`]);
//! - in memory, in a process-wide map, so that creating many environments over
//!   the same catalog (one per task in `bench envs` or a rollout) is cheap
//!   ([`shared_index`]).
//!
//! Search results are deterministic: the writer is single-threaded and never
//! merges segments, and hits are ordered by score then ordinal.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agentrl_env_core::{stable_hash, ActionError, EnvError, SharedCache};
use serde::Deserialize;
use tantivy::collector::TopDocs;
use tantivy::columnar::Column;
use tantivy::merge_policy::NoMergePolicy;
use tantivy::query::{BooleanQuery, BoostQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    Field, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::TextAnalyzer;
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, Searcher, TantivyDocument, Term};
use thiserror::Error;

/// Bumped whenever the schema or tokenizer changes, so old on-disk indexes are
/// not reused with a different meaning.
const FORMAT_VERSION: &str = "agentrl-search-index/v1/en_stem/title2";
/// Title terms count this much more than body terms (a product or page whose
/// title names the query is the better hit).
const TITLE_BOOST: f32 = 2.0;
/// Marker written after a complete build; a directory without it is ignored.
const COMPLETE_MARKER: &str = "AGENTRL_INDEX_COMPLETE";
/// Collections at least this large show a progress bar while indexing.
const PROGRESS_MIN_DOCS: usize = 10_000;
const TOKENIZER: &str = "en_stem";
const WRITER_MEMORY: usize = 200_000_000;

/// Errors building, opening or querying an index.
#[derive(Debug, Error)]
pub enum IndexError {
    #[error("search index error: {0}")]
    Tantivy(#[from] tantivy::TantivyError),
    #[error("search index I/O error at {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("search index at {path} is inconsistent: {reason}")]
    Corrupt { path: String, reason: String },
}

impl IndexError {
    /// This error as the refusal of the search action `action`: the step is
    /// refused (and counted as invalid) rather than shown as "no results".
    pub fn into_refusal(self, action: &str) -> ActionError {
        ActionError::not_possible(action, format!("search failed: {self}"))
    }

    /// This error as the data error of environment `env`.
    pub fn into_env_error(self, env: &str) -> EnvError {
        EnvError::Data {
            env: env.to_string(),
            path: "search index".to_string(),
            reason: self.to_string(),
        }
    }
}

/// One document to index: a title (boosted) and a body.
#[derive(Debug, Clone, Copy)]
pub struct DocRef<'a> {
    pub title: &'a str,
    pub body: &'a str,
}

/// One search hit: the document's ordinal in the indexed list and its BM25 score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    pub doc: usize,
    pub score: f32,
}

/// Where an index lives. As an env parameter (`cache_dir`) it is a string,
/// read by [`IndexLocation::from_param`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "String")]
pub enum IndexLocation {
    /// Built in memory each time (tests, tiny collections).
    Memory,
    /// Cached on disk under this directory, one sub-directory per data hash.
    Dir(PathBuf),
}

impl IndexLocation {
    /// The default on-disk cache: `$AGENTRL_CACHE/index`, else
    /// `$HOME/.cache/agentrl/index`; in memory when neither is set.
    pub fn default_cache() -> IndexLocation {
        if let Some(dir) = std::env::var_os("AGENTRL_CACHE").filter(|d| !d.is_empty()) {
            return IndexLocation::Dir(PathBuf::from(dir).join("index"));
        }
        match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
            Some(home) => IndexLocation::Dir(PathBuf::from(home).join(".cache/agentrl/index")),
            None => IndexLocation::Memory,
        }
    }

    /// Parse a user's `cache_dir` parameter: `"memory"` (or `"none"`) keeps the
    /// index in memory, anything else is a directory.
    pub fn from_param(value: &str) -> IndexLocation {
        match value.trim() {
            "memory" | "none" | "" => IndexLocation::Memory,
            dir => IndexLocation::Dir(PathBuf::from(dir)),
        }
    }
}

impl From<String> for IndexLocation {
    fn from(value: String) -> Self {
        IndexLocation::from_param(&value)
    }
}

/// The stable hash that keys an index: the format version and every title and
/// body, in order.
pub fn data_hash(docs: &[DocRef<'_>]) -> u64 {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(docs.len() * 2 + 1);
    parts.push(FORMAT_VERSION.as_bytes());
    for d in docs {
        parts.push(d.title.as_bytes());
        parts.push(d.body.as_bytes());
    }
    stable_hash(&parts)
}

/// A built, searchable BM25 index.
pub struct SearchIndex {
    hash: u64,
    num_docs: usize,
    title: Field,
    body: Field,
    // Kept alive so the searcher's segments stay valid.
    _reader: IndexReader,
    searcher: Searcher,
    /// Ordinal column of each segment, indexed by segment ordinal.
    ordinals: Vec<Column<u64>>,
    analyzer: Mutex<TextAnalyzer>,
}

agentrl_env_core::debug_fields!(SearchIndex { hash, num_docs });

struct Fields {
    title: Field,
    body: Field,
    ord: Field,
}

fn schema() -> (Schema, Fields) {
    let mut sb = Schema::builder();
    let text = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(TOKENIZER)
            .set_index_option(IndexRecordOption::WithFreqs),
    );
    let title = sb.add_text_field("title", text.clone());
    let body = sb.add_text_field("body", text);
    let ord = sb.add_u64_field("ord", NumericOptions::default().set_fast());
    (sb.build(), Fields { title, body, ord })
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> IndexError + '_ {
    move |source| IndexError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl SearchIndex {
    /// Build the index for `docs`, or open the one cached on disk for the same
    /// data. `hash` must be [`data_hash`] of `docs` (passed in so callers that
    /// already know it skip re-hashing large collections).
    pub fn open_or_build(
        docs: &[DocRef<'_>],
        hash: u64,
        location: &IndexLocation,
    ) -> Result<Self, IndexError> {
        match location {
            IndexLocation::Memory => {
                let (schema, fields) = schema();
                let index = Index::create_in_ram(schema);
                write_docs(&index, &fields, docs)?;
                Self::from_index(index, hash, docs.len(), "memory")
            }
            IndexLocation::Dir(root) => {
                let dir = root.join(format!("{hash:016x}"));
                if dir.join(COMPLETE_MARKER).is_file() {
                    match Index::open_in_dir(&dir)
                        .map_err(IndexError::from)
                        .and_then(|i| {
                            Self::from_index(i, hash, docs.len(), &dir.display().to_string())
                        }) {
                        Ok(index) => return Ok(index),
                        // A damaged cache entry is rebuilt rather than fatal.
                        Err(_) => std::fs::remove_dir_all(&dir).map_err(io_err(&dir))?,
                    }
                }
                std::fs::create_dir_all(root).map_err(io_err(root))?;
                // Build in a private directory, then rename: a concurrent
                // process building the same index never sees a partial one.
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                let tmp = root.join(format!(".{hash:016x}.tmp-{}-{nanos}", std::process::id()));
                std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
                let (schema, fields) = schema();
                let built = Index::create_in_dir(&tmp, schema)
                    .map_err(IndexError::from)
                    .and_then(|index| write_docs(&index, &fields, docs));
                if let Err(e) = built {
                    let _ = std::fs::remove_dir_all(&tmp);
                    return Err(e);
                }
                std::fs::write(tmp.join(COMPLETE_MARKER), FORMAT_VERSION).map_err(io_err(&tmp))?;
                if std::fs::rename(&tmp, &dir).is_err() {
                    // Another process won the race (or a stale entry without
                    // marker is in the way): use theirs if complete, else replace.
                    if !dir.join(COMPLETE_MARKER).is_file() {
                        let _ = std::fs::remove_dir_all(&dir);
                        std::fs::rename(&tmp, &dir).map_err(io_err(&dir))?;
                    } else {
                        let _ = std::fs::remove_dir_all(&tmp);
                    }
                }
                let index = Index::open_in_dir(&dir)?;
                Self::from_index(index, hash, docs.len(), &dir.display().to_string())
            }
        }
    }

    fn from_index(
        index: Index,
        hash: u64,
        expected_docs: usize,
        path: &str,
    ) -> Result<Self, IndexError> {
        let (_, fields) = schema();
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let searcher = reader.searcher();
        let num_docs = searcher.num_docs() as usize;
        if num_docs != expected_docs {
            return Err(IndexError::Corrupt {
                path: path.to_string(),
                reason: format!("holds {num_docs} documents, expected {expected_docs}"),
            });
        }
        let ordinals = searcher
            .segment_readers()
            .iter()
            .map(|s| s.fast_fields().u64("ord"))
            .collect::<Result<Vec<_>, _>>()?;
        // Every document must carry its ordinal, so that a search can always
        // name the documents it finds.
        if ordinals
            .iter()
            .any(|c| c.get_cardinality() != tantivy::columnar::Cardinality::Full)
        {
            return Err(IndexError::Corrupt {
                path: path.to_string(),
                reason: "a document has no ordinal".into(),
            });
        }
        let analyzer = index.tokenizer_for_field(fields.body)?;
        Ok(SearchIndex {
            hash,
            num_docs,
            title: fields.title,
            body: fields.body,
            _reader: reader,
            searcher,
            ordinals,
            analyzer: Mutex::new(analyzer),
        })
    }

    /// The data hash this index was built for.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// Number of indexed documents.
    pub fn num_docs(&self) -> usize {
        self.num_docs
    }

    /// The analysed terms of `text` (lower-cased, English-stemmed), sorted and
    /// de-duplicated.
    pub fn terms(&self, text: &str) -> Vec<String> {
        let mut out = BTreeSet::new();
        // A poisoned lock only means another thread panicked mid-tokenise; the
        // analyzer holds no state between calls, so keep using it.
        let mut analyzer = self.analyzer.lock().unwrap_or_else(|p| p.into_inner());
        let mut stream = analyzer.token_stream(text);
        while let Some(tok) = stream.next() {
            out.insert(tok.text.clone());
        }
        out.into_iter().collect()
    }

    /// BM25 search: hits `offset..offset + limit` of the ranking for a free-text
    /// query (any term may match; title terms boosted). Never fails on odd
    /// input: the query is tokenised, not parsed, so quotes or colons are text.
    pub fn search(&self, query: &str, offset: usize, limit: usize) -> Result<Vec<Hit>, IndexError> {
        let terms = self.terms(query);
        if terms.is_empty() || limit == 0 || self.num_docs == 0 {
            return Ok(Vec::new());
        }
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::with_capacity(terms.len() * 2);
        for t in &terms {
            let title = TermQuery::new(
                Term::from_field_text(self.title, t),
                IndexRecordOption::WithFreqs,
            );
            let body = TermQuery::new(
                Term::from_field_text(self.body, t),
                IndexRecordOption::WithFreqs,
            );
            clauses.push((
                Occur::Should,
                Box::new(BoostQuery::new(Box::new(title), TITLE_BOOST)),
            ));
            clauses.push((Occur::Should, Box::new(body)));
        }
        let query = BooleanQuery::new(clauses);
        let top = self.searcher.search(
            &query,
            &TopDocs::with_limit(limit)
                .and_offset(offset)
                .order_by_score(),
        )?;
        let mut hits = Vec::with_capacity(top.len());
        for (score, addr) in top {
            let doc = self
                .ordinals
                .get(addr.segment_ord as usize)
                .and_then(|c| c.first(addr.doc_id))
                .ok_or_else(|| IndexError::Corrupt {
                    path: format!("{:016x}", self.hash),
                    reason: "a document has no ordinal".into(),
                })?;
            hits.push(Hit {
                doc: doc as usize,
                score,
            });
        }
        // Equal scores are ordered by ordinal so results never depend on the
        // segment layout.
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.doc.cmp(&b.doc)));
        Ok(hits)
    }

    /// The ordinals of the best `limit` documents for `query`, best first.
    pub fn top_docs(&self, query: &str, limit: usize) -> Result<Vec<usize>, IndexError> {
        Ok(self
            .search(query, 0, limit)?
            .into_iter()
            .map(|h| h.doc)
            .collect())
    }

    /// Number of documents matching at least one query term.
    pub fn count(&self, query: &str) -> Result<usize, IndexError> {
        let terms = self.terms(query);
        if terms.is_empty() {
            return Ok(0);
        }
        let clauses: Vec<(Occur, Box<dyn Query>)> = terms
            .iter()
            .flat_map(|t| {
                [self.title, self.body].map(|f| {
                    (
                        Occur::Should,
                        Box::new(TermQuery::new(
                            Term::from_field_text(f, t),
                            IndexRecordOption::Basic,
                        )) as Box<dyn Query>,
                    )
                })
            })
            .collect();
        Ok(self
            .searcher
            .search(&BooleanQuery::new(clauses), &tantivy::collector::Count)?)
    }
}

fn write_docs(index: &Index, fields: &Fields, docs: &[DocRef<'_>]) -> Result<(), IndexError> {
    // One thread and no merges: the segment layout (and so tie order) is the
    // same on every run and machine.
    let mut writer: IndexWriter<TantivyDocument> =
        index.writer_with_num_threads(1, WRITER_MEMORY)?;
    writer.set_merge_policy(Box::new(NoMergePolicy));
    let bar = if docs.len() >= PROGRESS_MIN_DOCS {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(docs.len() as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "indexing {pos}/{len} documents [{bar:30}] {elapsed_precise}",
        ) {
            bar.set_style(style);
        }
        Some(bar)
    } else {
        None
    };
    for (i, d) in docs.iter().enumerate() {
        let mut doc = TantivyDocument::default();
        doc.add_text(fields.title, d.title);
        doc.add_text(fields.body, d.body);
        doc.add_u64(fields.ord, i as u64);
        writer.add_document(doc)?;
        if let Some(bar) = &bar {
            if i % 1000 == 0 {
                bar.set_position(i as u64);
            }
        }
    }
    writer.commit()?;
    writer.wait_merging_threads()?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(())
}

/// The process-wide index for `docs` (hash [`data_hash`]), built or opened
/// once at `location` and then shared: every env over the same catalog must
/// share one index (and its memory maps) instead of re-opening it per task.
pub fn shared_index(
    docs: &[DocRef<'_>],
    hash: u64,
    location: &IndexLocation,
) -> Result<Arc<SearchIndex>, IndexError> {
    // As many as the webshop and searchqa caches hold together, so that an
    // index evicted with its catalog is freed with it.
    static INDEXES: SharedCache<u64, SearchIndex> = SharedCache::new(8);
    INDEXES.get_or_try_build(hash, || SearchIndex::open_or_build(docs, hash, location))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Vec<(String, String)> {
        vec![
            (
                "Dark roast coffee".into(),
                "Gluten free whole bean coffee, dark and bold.".into(),
            ),
            (
                "Green tea".into(),
                "Loose leaf green tea from the mountains.".into(),
            ),
            (
                "Running shoes".into(),
                "Lightweight shoes for running on roads.".into(),
            ),
            (
                "Coffee mug".into(),
                "A ceramic mug for tea or coffee.".into(),
            ),
        ]
    }

    /// [`corpus`] as documents, kept for the whole test run.
    fn docs() -> Vec<DocRef<'static>> {
        static CORPUS: std::sync::LazyLock<Vec<(String, String)>> =
            std::sync::LazyLock::new(corpus);
        refs(&CORPUS)
    }

    /// A fresh cache directory and its location (kept while the first lives).
    fn disk_cache() -> (tempfile::TempDir, IndexLocation) {
        let tmp = tempfile::tempdir().unwrap();
        let loc = IndexLocation::Dir(tmp.path().to_path_buf());
        (tmp, loc)
    }

    /// The test corpus indexed in memory.
    fn memory_index() -> SearchIndex {
        let docs = docs();
        SearchIndex::open_or_build(&docs, data_hash(&docs), &IndexLocation::Memory).unwrap()
    }

    fn refs(c: &[(String, String)]) -> Vec<DocRef<'_>> {
        c.iter()
            .map(|(t, b)| DocRef { title: t, body: b })
            .collect()
    }

    #[test]
    fn bm25_ranks_title_match_first() {
        let idx = memory_index();
        let hits = idx.search("dark roast coffee", 0, 3).unwrap();
        assert_eq!(hits[0].doc, 0);
        assert!(hits.iter().any(|h| h.doc == 3));
        assert!(hits.iter().all(|h| h.doc != 2));
        // Stemming: "shoe" finds "shoes".
        assert_eq!(idx.search("shoe", 0, 3).unwrap()[0].doc, 2);
    }

    #[test]
    fn odd_queries_do_not_fail() {
        let idx = memory_index();
        for q in [
            "",
            "   ",
            "\"tea",
            "title:tea AND (",
            "%%%",
            "ünïcödé ☕ tea",
        ] {
            let _ = idx.search(q, 0, 10).unwrap();
        }
        assert!(idx.search("", 0, 10).unwrap().is_empty());
        assert_eq!(idx.search("title:tea AND (", 0, 10).unwrap()[0].doc, 1);
    }

    #[test]
    fn pagination_offsets_the_ranking() {
        let idx = memory_index();
        let all = idx.search("coffee tea", 0, 10).unwrap();
        let page2 = idx.search("coffee tea", 1, 10).unwrap();
        assert_eq!(&all[1..], &page2[..]);
        assert_eq!(idx.count("coffee tea").unwrap(), 3);
    }

    #[test]
    fn disk_cache_is_reused_and_keyed_by_data() {
        let (tmp, loc) = disk_cache();
        let (docs, h) = (docs(), data_hash(&docs()));
        let a = SearchIndex::open_or_build(&docs, h, &loc).unwrap();
        let entry = tmp.path().join(format!("{h:016x}"));
        assert!(entry.join(COMPLETE_MARKER).is_file());
        let modified = std::fs::metadata(entry.join(COMPLETE_MARKER))
            .unwrap()
            .modified()
            .unwrap();
        let b = SearchIndex::open_or_build(&docs, h, &loc).unwrap();
        assert_eq!(
            std::fs::metadata(entry.join(COMPLETE_MARKER))
                .unwrap()
                .modified()
                .unwrap(),
            modified
        );
        assert_eq!(
            a.search("tea", 0, 4).unwrap(),
            b.search("tea", 0, 4).unwrap()
        );
        // Different data → different key → its own entry.
        let mut c2 = corpus();
        c2[0].1.push_str(" Extra.");
        let docs2 = refs(&c2);
        let h2 = data_hash(&docs2);
        assert_ne!(h, h2);
        SearchIndex::open_or_build(&docs2, h2, &loc).unwrap();
        assert!(tmp
            .path()
            .join(format!("{h2:016x}"))
            .join(COMPLETE_MARKER)
            .is_file());
    }

    #[test]
    fn damaged_cache_entry_is_rebuilt() {
        let (tmp, loc) = disk_cache();
        let (docs, h) = (docs(), data_hash(&docs()));
        let entry = tmp.path().join(format!("{h:016x}"));
        std::fs::create_dir_all(&entry).unwrap();
        std::fs::write(entry.join(COMPLETE_MARKER), "x").unwrap();
        let idx = SearchIndex::open_or_build(&docs, h, &loc).unwrap();
        assert_eq!(idx.num_docs(), 4);
    }

    #[test]
    fn shared_index_returns_the_same_instance() {
        let docs = docs();
        let h = data_hash(&docs) ^ 0x5eed; // private key for this test
        let a = shared_index(&docs, h, &IndexLocation::Memory).unwrap();
        let b = shared_index(&docs, h, &IndexLocation::Memory).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
    }
}

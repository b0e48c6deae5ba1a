//! Generation through candle's tensor ops, for a model whose weights live
//! off the CPU (a CUDA device).
//!
//! The host decoder ([`crate::decode`]) reads f32 weights in place on the
//! CPU; on a GPU that would copy every weight to the host per call and run
//! the arithmetic there. This path keeps the arithmetic on the model's
//! device: the contexts are left-padded into one batch, prefilled into
//! preallocated per-layer KV caches ([`LayerKvCache`]), then decoded one
//! token per step. Only each step's last-position logits `[B, V]` come to
//! the host, where [`crate::sampling::sample_rows`] picks the tokens, so the draws, the
//! untempered log-probs and the stop rule are those of the host decoder. On
//! a CUDA device plain sampling (no steering, top-k or top-p) picks them
//! there instead (`device_sampling`), with the same uniform draws, and
//! brings back a token and a log-prob per row.
//!
//! Finished sequences stay in the batch (their rows are computed and
//! ignored): a fixed-shape batch keeps the caches contiguous, and a GPU's
//! cost per step barely depends on B.
//!
//! A call's batch caches outlive it: each caller's [`SequenceCache`] points
//! at its row ([`crate::batch_cache`]), and the next call copies the
//! positions a context shares with it into its own batch caches and
//! encodes only the rest (a dialogue's next turn), as the host decoder
//! does with its per-sequence caches. A context repeated within a call (a
//! GRPO group's members) is prefilled once and copied to its rows.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use crate::batch_cache::{BatchRow, RowCopy};
use crate::decode::SequenceCache;
use crate::qwen2::{LayerKvCache, Model};
use crate::sampling::{empty_generations, push_token, Generation, SamplingParams, SamplingRng};
use crate::steer::Steer;
use crate::{ModelConfig, ModelError};

/// Samples a continuation of each `contexts[i]` on the model's device; see
/// [`crate::PolicyModel::generate_cached`] for the contract. The caller has
/// validated ids, lengths, parameters and the caches' shape.
pub(crate) fn generate(
    model: &Model,
    cfg: &ModelConfig,
    caches: &mut [SequenceCache],
    contexts: &[Vec<u32>],
    params: &SamplingParams,
    mut rng: SamplingRng<'_>,
    steer: &mut Steer<'_>,
) -> Result<Vec<Generation>, ModelError> {
    let mut gens = empty_generations(contexts.len());
    if params.max_new_tokens == 0 || contexts.is_empty() {
        caches.iter_mut().for_each(SequenceCache::clear);
        return Ok(gens);
    }
    let b = contexts.len();
    let longest = contexts.iter().map(Vec::len).max().unwrap_or(0);
    let pads: Vec<usize> = contexts.iter().map(|c| longest - c.len()).collect();
    // The last sampled token is never fed back.
    let capacity = longest + params.max_new_tokens - 1;
    let kept = kept_rows(model, cfg, caches, contexts);
    let (mut kv, mut logits) = prefill(model, cfg, contexts, kept, &pads, capacity)?;
    let mut steps = DecodeSteps::new(model, b, &pads)?;
    let mut active: Vec<usize> = (0..b).collect();
    // Sequence i's logits are row i.
    let row_of = active.clone();
    loop {
        let picks = match device_picks(&logits, &active, params, steer, &mut rng)? {
            Some(picks) => picks,
            None => {
                let logits = logits
                    .to_dtype(DType::F32)?
                    .to_device(&Device::Cpu)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let vocab = logits.len() / b;
                // A real vocabulary (Qwen2.5's 151,936) makes the token choice a
                // host pass per row worth spreading over the cores.
                steer.choose_rows(&logits, vocab, &active, &row_of, &gens, params, &mut rng)?
            }
        };
        let mut still = Vec::with_capacity(active.len());
        for (&i, (tok, lp, go_on)) in active.iter().zip(picks) {
            if push_token(&mut gens[i], tok, lp, params) && go_on {
                still.push(i);
            }
        }
        active = still;
        if active.is_empty() {
            break;
        }
        // Every row steps on its newest token (finished ones too, ignored):
        // the prefill gave every sequence one. Step n writes cache slot
        // longest + n - 1, the same for every row (all are left-padded to
        // the longest context).
        let (last, pos): (Vec<u32>, Vec<u32>) = contexts
            .iter()
            .zip(&gens)
            .map(|(c, g)| {
                let n = g.tokens.len();
                (g.tokens[n - 1], (c.len() + n - 1) as u32)
            })
            .unzip();
        let slot = (longest + gens[active[0]].tokens.len() - 1) as u32;
        logits = steps.next(model, &mut kv, &last, &pos, slot)?;
    }
    // Row i holds its context and every generated token but the last
    // (a row that finished early was fed its last token at the step after,
    // into the slot that follows it) from slot pads[i] on.
    let layers = Arc::new(kv);
    for (i, (cache, (ctx, g))) in caches
        .iter_mut()
        .zip(contexts.iter().zip(&gens))
        .enumerate()
    {
        let tokens = [&ctx[..], &g.tokens[..]].concat();
        let row = BatchRow {
            layers: layers.clone(),
            row: i,
            start: pads[i],
        };
        cache.hold_on_device(&tokens, tokens.len() - 1, row);
    }
    Ok(gens)
}

/// The batch caches `[B, kv, capacity, hd]` per layer, holding every
/// context, and each row's last-position logits `[B, V]`.
///
/// A context that repeats one before it (a GRPO group's members on their
/// first turn) is encoded once: the distinct contexts are prefilled as a
/// batch of their own, each from the kept cache of whichever of its rows
/// serves the most, and every row then takes its context's keys, values
/// and logits (one copy launch per layer's keys and values).
fn prefill(
    model: &Model,
    cfg: &ModelConfig,
    contexts: &[Vec<u32>],
    mut kept: Vec<Option<(BatchRow, usize)>>,
    pads: &[usize],
    capacity: usize,
) -> Result<(Vec<LayerKvCache>, Tensor), ModelError> {
    let served = |k: &Option<(BatchRow, usize)>| k.as_ref().map_or(0, |(_, n)| *n);
    // leader[i]: the row whose prefill serves row i (the first of its
    // context's rows that serves the most).
    let mut first: std::collections::HashMap<&[u32], usize> = std::collections::HashMap::new();
    for (i, ctx) in contexts.iter().enumerate() {
        let l = first.entry(&ctx[..]).or_insert(i);
        if served(&kept[i]) > served(&kept[*l]) {
            *l = i;
        }
    }
    let leader: Vec<usize> = contexts.iter().map(|c| first[&c[..]]).collect();
    let distinct: Vec<usize> = (0..contexts.len()).filter(|&i| leader[i] == i).collect();
    if distinct.len() == contexts.len() {
        return encode(model, cfg, contexts, kept, pads, capacity);
    }
    let own: Vec<Vec<u32>> = distinct.iter().map(|&i| contexts[i].clone()).collect();
    let own_kept = distinct.iter().map(|&i| kept[i].take()).collect();
    let own_pads: Vec<usize> = distinct.iter().map(|&i| pads[i]).collect();
    drop(kept);
    let (once, logits) = encode(model, cfg, &own, own_kept, &own_pads, capacity)?;
    // Row i's keys and values: its leader's, in the distinct batch's row
    // of that leader. The longest context is among the distinct ones, so
    // both batches have the same slots.
    let mut row_in_once = vec![0; contexts.len()];
    for (u, &i) in distinct.iter().enumerate() {
        row_in_once[i] = u;
    }
    let once_row: Vec<usize> = leader.iter().map(|&l| row_in_once[l]).collect();
    let longest = contexts.iter().map(Vec::len).max().unwrap_or(0);
    let copies: Vec<RowCopy> = (0..contexts.len())
        .map(|i| RowCopy {
            dst_row: i,
            dst_slot: pads[i],
            src_row: once_row[i],
            src_slot: pads[i],
            len: longest - pads[i],
        })
        .collect();
    let dev = model.device();
    let mut kv = Vec::with_capacity(once.len());
    for layer in &once {
        let mut all = LayerKvCache::new(cfg, contexts.len(), capacity, model.dtype(), dev)?;
        all.copy_rows_from(layer, &copies)?;
        all.start_at(longest)?;
        kv.push(all);
    }
    let rows: Vec<u32> = once_row.iter().map(|&r| r as u32).collect();
    let rows = Tensor::from_vec(rows, contexts.len(), dev)?;
    Ok((kv, logits.index_select(&rows, 0)?))
}

/// [`prefill`] without the search for repeats: every context encoded in
/// its own row, each from what its kept cache serves.
fn encode(
    model: &Model,
    cfg: &ModelConfig,
    contexts: &[Vec<u32>],
    kept: Vec<Option<(BatchRow, usize)>>,
    pads: &[usize],
    capacity: usize,
) -> Result<(Vec<LayerKvCache>, Tensor), ModelError> {
    let dev = model.device();
    let b = contexts.len();
    let longest = contexts.iter().map(Vec::len).max().unwrap_or(0);
    // The prefill encodes the last `fresh` tokens of every context (the
    // most any row's cache leaves to encode, left-padded): a row whose
    // cache held more re-encodes some of it, at no cost to the batch's
    // shape. The positions before come from the caches.
    let fresh = contexts
        .iter()
        .zip(&kept)
        .map(|(ctx, k)| ctx.len() - k.as_ref().map_or(0, |(_, n)| *n))
        .max()
        .unwrap_or(longest);
    let mut kv = (0..model.num_layers())
        .map(|_| LayerKvCache::new(cfg, b, capacity, model.dtype(), dev))
        .collect::<candle_core::Result<Vec<_>>>()?;
    resume_rows(&mut kv, kept, contexts, pads, (fresh, longest - fresh))?;
    // Each context's last `fresh` ids, left-padded; a pad's position is 0
    // (no query sees it).
    let mut ids = Vec::with_capacity(b * fresh);
    let mut positions = Vec::with_capacity(b * fresh);
    for ctx in contexts {
        let skip = ctx.len().saturating_sub(fresh);
        let lead = fresh - (ctx.len() - skip);
        ids.extend(std::iter::repeat_n(0u32, lead).chain(ctx[skip..].iter().copied()));
        positions.extend((0..fresh).map(|j| (skip + j).saturating_sub(lead) as u32));
    }
    let ids = Tensor::from_vec(ids, (b, fresh), dev)?;
    let positions = Tensor::from_vec(positions, (b, fresh), dev)?;
    let logits = appending_step(model, &mut kv, &ids, &positions, pads)?;
    Ok((kv, logits))
}

/// Each cache's row in an earlier call's batch caches with how many of its
/// context's leading positions it serves, where it can serve this model
/// (`None`: nothing to reuse). Every cache is left empty: the call refills
/// it.
fn kept_rows(
    model: &Model,
    cfg: &ModelConfig,
    caches: &mut [SequenceCache],
    contexts: &[Vec<u32>],
) -> Vec<Option<(BatchRow, usize)>> {
    let geometry = (cfg.num_kv_heads(), cfg.head_dim());
    caches
        .iter_mut()
        .zip(contexts)
        .map(|(cache, ctx)| {
            let row = cache
                .on_device()
                .filter(|r| r.serves(model.num_layers(), geometry, model.dtype(), model.device()))
                .cloned();
            let reuse = cache.reusable_for(ctx);
            cache.clear();
            row.filter(|_| reuse > 0).map(|r| (r, reuse))
        })
        .collect()
}

/// Fills the new batch caches `kv` with what the kept rows serve: row i's
/// first `len(contexts[i]) - fresh` positions (those the prefill does not
/// encode) at slots `pads[i]..`, one copy launch per earlier call and
/// tensor; then counts the slots before the prefill's (`start`) as cached.
fn resume_rows(
    kv: &mut [LayerKvCache],
    kept: Vec<Option<(BatchRow, usize)>>,
    contexts: &[Vec<u32>],
    pads: &[usize],
    (fresh, start): (usize, usize),
) -> Result<(), ModelError> {
    let mut sources: Vec<(Arc<Vec<LayerKvCache>>, Vec<RowCopy>)> = Vec::new();
    for (i, (k, ctx)) in kept.into_iter().zip(contexts).enumerate() {
        let (Some((row, _)), len @ 1..) = (k, ctx.len().saturating_sub(fresh)) else {
            continue;
        };
        let copy = RowCopy {
            dst_row: i,
            dst_slot: pads[i],
            src_row: row.row,
            src_slot: row.start,
            len,
        };
        match sources
            .iter_mut()
            .find(|(l, _)| Arc::ptr_eq(l, &row.layers))
        {
            Some((_, copies)) => copies.push(copy),
            None => sources.push((row.layers, vec![copy])),
        }
    }
    for (src, copies) in &sources {
        for (dst, src) in kv.iter().zip(src.iter()) {
            dst.copy_rows_from(src, copies)?;
        }
    }
    for layer in kv {
        layer.start_at(start)?;
    }
    Ok(())
}

/// The decode steps after the prefill: fixed-shape ones ([`crate::fixed_step`])
/// where the model's device and dtype have their ops (CUDA; f32/f64 on
/// the CPU), replayed from a CUDA graph captured on the first step when the
/// device is a GPU; else steps that append to the caches.
struct DecodeSteps<'a> {
    pads: &'a [usize],
    /// The step's inputs, rewritten in place each step: ids and positions
    /// `[B, 1]`, the cache slot `[1]` (u32).
    fixed: Option<[Tensor; 3]>,
    #[cfg(feature = "cuda")]
    graph: cuda_graph::StepGraph,
}

impl<'a> DecodeSteps<'a> {
    fn new(model: &Model, b: usize, pads: &'a [usize]) -> Result<Self, ModelError> {
        let dev = model.device();
        let fits = match dev {
            Device::Cpu => matches!(model.dtype(), DType::F32 | DType::F64),
            _ => dev.is_cuda() && matches!(model.dtype(), DType::F32 | DType::BF16 | DType::F16),
        };
        let fixed = match fits {
            true => Some([
                Tensor::zeros((b, 1), DType::U32, dev)?,
                Tensor::zeros((b, 1), DType::U32, dev)?,
                Tensor::zeros(1, DType::U32, dev)?,
            ]),
            false => None,
        };
        Ok(Self {
            pads,
            fixed,
            #[cfg(feature = "cuda")]
            graph: cuda_graph::StepGraph::default(),
        })
    }

    /// The logits `[B, V]` after feeding `ids` (one per row) at `positions`,
    /// their keys and values cached at `slot`.
    fn next(
        &mut self,
        model: &Model,
        kv: &mut [LayerKvCache],
        ids: &[u32],
        positions: &[u32],
        slot: u32,
    ) -> Result<Tensor, ModelError> {
        let b = ids.len();
        let Some(inputs) = &self.fixed else {
            let dev = model.device();
            let ids = Tensor::from_vec(ids.to_vec(), (b, 1), dev)?;
            let positions = Tensor::from_vec(positions.to_vec(), (b, 1), dev)?;
            return Ok(appending_step(model, kv, &ids, &positions, self.pads)?);
        };
        if slot as usize >= kv.first().map_or(0, LayerKvCache::capacity) {
            return Err(ModelError::InvalidInput(format!(
                "decode step: cache slot {slot} past the caches' capacity"
            )));
        }
        crate::fixed_step::upload(&inputs[0], ids)?;
        crate::fixed_step::upload(&inputs[1], positions)?;
        crate::fixed_step::upload(&inputs[2], &[slot])?;
        #[cfg(feature = "cuda")]
        if model.device().is_cuda() {
            if let Some(logits) = self.graph.step(model, kv, inputs, self.pads)? {
                return Ok(logits);
            }
        }
        Ok(fixed_step(model, kv, inputs, self.pads)?)
    }
}

/// The logits `[B, V]` at the last position of `ids: [B, T]` (at
/// `positions`), their keys and values appended to the caches: the prefill,
/// and the steps where the fixed-shape ops do not apply.
fn appending_step(
    model: &Model,
    kv: &mut [LayerKvCache],
    ids: &Tensor,
    positions: &Tensor,
    pads: &[usize],
) -> candle_core::Result<Tensor> {
    let rope = model.rotary().tables_for(positions)?;
    let h = model.forward_hidden(ids, &rope, pads, Some(kv))?;
    let t = h.dim(1)?;
    model.logits(&h.narrow(1, t - 1, 1)?)?.squeeze(1)
}

/// One fixed-shape step: the logits `[B, V]` of `inputs` = (ids, positions,
/// slot), every varying value read from those tensors on the device.
fn fixed_step(
    model: &Model,
    kv: &mut [LayerKvCache],
    [ids, positions, slot]: &[Tensor; 3],
    pads: &[usize],
) -> candle_core::Result<Tensor> {
    let rope = model.rotary().step_tables(positions)?;
    let h = model.forward_hidden_at_slot(ids, &rope, pads, kv, slot)?;
    model.logits(&h)?.squeeze(1)
}

/// The fixed-shape step as a CUDA graph: warmed up uncaptured on the first
/// step (candle's parameter uploads cached on the way), captured right
/// after it with the same inputs (capture records, it runs nothing), then
/// replayed for every later step, its logits copied into one buffer that
/// outlives the graph's own allocations. If capturing fails, the steps run
/// uncaptured: same results, more launches from the host.
#[cfg(feature = "cuda")]
mod cuda_graph {
    use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
    use candle_core::Tensor;

    use super::fixed_step;
    use crate::qwen2::{LayerKvCache, Model};

    #[derive(Default)]
    pub(super) enum StepGraph {
        /// No step has run yet.
        #[default]
        Cold,
        /// Captured: the graph and the buffer its logits land in.
        Ready(CudaGraph, Tensor),
        /// Capturing failed; every step runs uncaptured.
        Off,
    }

    impl StepGraph {
        /// The step's logits from the graph, or `None` where the caller
        /// runs the step itself (on the first step, which warms up, and
        /// once capturing has failed).
        pub(super) fn step(
            &mut self,
            model: &Model,
            kv: &mut [LayerKvCache],
            inputs: &[Tensor; 3],
            pads: &[usize],
        ) -> candle_core::Result<Option<Tensor>> {
            match self {
                StepGraph::Ready(graph, logits) => {
                    use candle_core::cuda_backend::WrapErr;
                    graph.launch().w()?;
                    Ok(Some(logits.clone()))
                }
                StepGraph::Off => Ok(None),
                StepGraph::Cold => {
                    let dev = model.device().as_cuda_device()?.clone();
                    let cached = dev.enable_cuda_graph_htod_cache();
                    let warm = fixed_step(model, kv, inputs, pads)?;
                    *self = match capture(&dev, model, kv, inputs, pads, &warm) {
                        Some((graph, out)) => StepGraph::Ready(graph, out),
                        None => StepGraph::Off,
                    };
                    drop(cached);
                    Ok(Some(warm))
                }
            }
        }
    }

    /// The step captured as a graph writing its logits into a buffer shaped
    /// like `like`; `None` where capturing fails.
    fn capture(
        dev: &candle_core::CudaDevice,
        model: &Model,
        kv: &mut [LayerKvCache],
        inputs: &[Tensor; 3],
        pads: &[usize],
        like: &Tensor,
    ) -> Option<(CudaGraph, Tensor)> {
        let out = like.zeros_like().ok()?;
        let stream = dev.cuda_stream();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .ok()?;
        // Recorded, not run: every allocation and free of the step becomes
        // a node of the graph; only `out` (allocated before) outlives it.
        let recorded = fixed_step(model, kv, inputs, pads).and_then(|l| out.slice_set(&l, 0, 0));
        let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        let graph = stream.end_capture(flags);
        let why = match (recorded, graph) {
            (Ok(()), Ok(Some(graph))) => return Some((graph, out)),
            (Err(e), _) => e.to_string(),
            (_, Err(e)) => e.to_string(),
            (_, Ok(None)) => "an empty graph".to_string(),
        };
        // Once per process: every later call would fail the same way.
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "decoding without a CUDA graph: capturing the decode step failed ({why})"
            );
        });
        None
    }
}

/// A sequence's next token, its log-prob, and whether it may go on.
type Choice = (u32, f32, bool);

/// The choices of the sequences `active` (sequence i on row i of `logits`,
/// `[B, V]`) made on a CUDA device (`kernels/sample.cu`), with the uniform
/// draws the host sampler would take in the same order; `None` where the
/// host must choose: off CUDA, with steering, top-k or top-p.
fn device_picks(
    logits: &Tensor,
    active: &[usize],
    params: &SamplingParams,
    steer: &Steer<'_>,
    rng: &mut SamplingRng<'_>,
) -> Result<Option<Vec<Choice>>, ModelError> {
    #[cfg(feature = "cuda")]
    {
        use rand::Rng;

        use crate::device_sampling::{sample_rows, DeviceChoice};
        let vocab = logits.dim(1)?;
        let plain =
            steer.is_plain() && (params.top_k == 0 || params.top_k >= vocab) && params.top_p >= 1.0;
        if !(logits.device().is_cuda() && plain) {
            return Ok(None);
        }
        // Finished rows are computed too (the batch keeps its shape), greedily.
        let mut draws = vec![-1.0; logits.dim(0)?];
        if params.temperature != 0.0 {
            for &i in active {
                draws[i] = rng.for_sequence(i).random::<f64>();
            }
        }
        let choices = sample_rows(logits, &draws, (1.0 / params.temperature) as f32)?;
        active
            .iter()
            .map(|&i| match choices[i] {
                DeviceChoice::Token(tok, lp) => Ok((tok, lp, true)),
                DeviceChoice::NonFinite { token, value } => {
                    Err(ModelError::NonFiniteLogits { token, value })
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (logits, active, params, steer, rng);
        Ok(None)
    }
}

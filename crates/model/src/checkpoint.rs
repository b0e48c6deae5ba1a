//! Reading and writing Hugging Face checkpoint directories
//! (`config.json` + `model.safetensors`, or sharded files with
//! `model.safetensors.index.json`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::ModelError;

/// File name of an unsharded checkpoint.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// File name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// File name of the configuration.
pub const CONFIG_FILE: &str = "config.json";

/// A tensor read from a checkpoint, with the file it came from (for error messages).
pub(crate) struct LoadedTensor {
    pub tensor: Tensor,
    pub file: PathBuf,
}

/// Reads every tensor of the checkpoint in `dir` onto the CPU, keeping its
/// stored dtype. Sharded checkpoints are read through their index.
pub(crate) fn read_tensors(dir: &Path) -> Result<BTreeMap<String, LoadedTensor>, ModelError> {
    let index = dir.join(INDEX_FILE);
    let files: Vec<PathBuf> = if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::CorruptFile {
                path: index.clone(),
                msg: e.to_string(),
            })?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::CorruptFile {
                path: index.clone(),
                msg: "no `weight_map` object".to_string(),
            })?;
        let mut names: Vec<String> = map
            .values()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ModelError::CorruptFile {
                        path: index.clone(),
                        msg: "a `weight_map` value is not a file name".to_string(),
                    })
            })
            .collect::<Result<_, _>>()?;
        names.sort();
        names.dedup();
        names.into_iter().map(|n| dir.join(n)).collect()
    } else {
        vec![dir.join(WEIGHTS_FILE)]
    };
    let mut out = BTreeMap::new();
    for file in files {
        let bytes = std::fs::read(&file).map_err(|e| ModelError::io(&file, e))?;
        let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| {
            ModelError::CorruptFile {
                path: file.clone(),
                msg: e.to_string(),
            }
        })?;
        for (name, tensor) in tensors {
            out.insert(
                name,
                LoadedTensor {
                    tensor,
                    file: file.clone(),
                },
            );
        }
    }
    Ok(out)
}

/// Writes `tensors` (converted to contiguous little-endian f32) to `path` as
/// safetensors with the `{"format": "pt"}` metadata transformers expects.
pub(crate) fn write_tensors(
    path: &Path,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<(), ModelError> {
    let mut buffers: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let values: Vec<f32> = t
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1()?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        buffers.push((name.clone(), t.dims().to_vec(), bytes));
    }
    let views = buffers
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| ModelError::CorruptFile {
                    path: path.to_path_buf(),
                    msg: format!("{name}: {e}"),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata: HashMap<String, String> =
        HashMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(path, views, Some(metadata))
}

/// Writes a safetensors file atomically (a temporary file beside `path`,
/// synced, renamed over it): a kill mid-save leaves the previous file whole.
fn write_safetensors(
    path: &Path,
    views: Vec<(String, safetensors::tensor::TensorView<'_>)>,
    metadata: Option<HashMap<String, String>>,
) -> Result<(), ModelError> {
    agentrl_durable::write_via_path(path, |tmp| {
        safetensors::serialize_to_file(views, metadata, tmp).map_err(|e| match e {
            safetensors::SafeTensorError::IoError(io) => io,
            other => std::io::Error::other(other.to_string()),
        })
    })
    .map_err(|e| ModelError::io(path, e))
}

/// The little-endian bytes of a flat tensor of element type `T`.
fn le_bytes<T: candle_core::WithDType, const N: usize>(
    flat: &Tensor,
    to_le_bytes: fn(T) -> [u8; N],
) -> Result<Vec<u8>, ModelError> {
    Ok(flat
        .to_vec1::<T>()?
        .into_iter()
        .flat_map(to_le_bytes)
        .collect())
}

/// Writes `tensors` to `path` as safetensors in their own dtype (for exact
/// optimizer state). Supports f32, f64 and u32.
pub(crate) fn write_tensors_exact(
    path: &Path,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<(), ModelError> {
    let mut buffers: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, t) in tensors {
        let flat = t.to_device(&Device::Cpu)?.flatten_all()?;
        let (dtype, bytes): (safetensors::Dtype, Vec<u8>) = match t.dtype() {
            DType::F32 => (safetensors::Dtype::F32, le_bytes(&flat, f32::to_le_bytes)?),
            DType::F64 => (safetensors::Dtype::F64, le_bytes(&flat, f64::to_le_bytes)?),
            DType::U32 => (safetensors::Dtype::U32, le_bytes(&flat, u32::to_le_bytes)?),
            other => {
                return Err(ModelError::InvalidInput(format!(
                    "cannot save `{name}` of dtype {other:?}"
                )))
            }
        };
        buffers.push((name.clone(), dtype, t.dims().to_vec(), bytes));
    }
    let views = buffers
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| ModelError::CorruptFile {
                    path: path.to_path_buf(),
                    msg: format!("{name}: {e}"),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    write_safetensors(path, views, None)
}

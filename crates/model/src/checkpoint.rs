//! Reading and writing Hugging Face checkpoint directories
//! (`config.json` + `model.safetensors`, or sharded files with
//! `model.safetensors.index.json`).

use std::borrow::Cow;
use std::cell::RefCell;
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
    let metadata: HashMap<String, String> =
        HashMap::from([("format".to_string(), "pt".to_string())]);
    let dtypes = tensors.keys().map(|_| Ok(safetensors::Dtype::F32));
    write_lazily(path, tensors, dtypes, Some(metadata))
}

/// Writes `tensors` to `path` as safetensors in their own dtype (for exact
/// optimizer state). Supports f32, f64 and u32.
pub(crate) fn write_tensors_exact(
    path: &Path,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<(), ModelError> {
    let dtypes = tensors.iter().map(|(name, t)| match t.dtype() {
        DType::F32 => Ok(safetensors::Dtype::F32),
        DType::F64 => Ok(safetensors::Dtype::F64),
        DType::U32 => Ok(safetensors::Dtype::U32),
        other => Err(ModelError::InvalidInput(format!(
            "cannot save `{name}` of dtype {other:?}"
        ))),
    });
    write_lazily(path, tensors, dtypes, None)
}

/// Writes `tensors`, each stored as the matching entry of `dtypes`, through
/// [`LazyBytes`]: the file is written a tensor at a time, so saving holds
/// one tensor's bytes beside the model instead of a copy of everything
/// (for a 135M model's AdamW moments, 1.1 GB more at each checkpoint).
fn write_lazily(
    path: &Path,
    tensors: &BTreeMap<String, Tensor>,
    dtypes: impl Iterator<Item = Result<safetensors::Dtype, ModelError>>,
    metadata: Option<HashMap<String, String>>,
) -> Result<(), ModelError> {
    let failed = RefCell::new(None);
    let views = tensors
        .iter()
        .zip(dtypes)
        .map(|((name, tensor), dtype)| {
            Ok((
                name.clone(),
                LazyBytes {
                    tensor,
                    dtype: dtype?,
                    shape: tensor.dims().to_vec(),
                    failed: &failed,
                },
            ))
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let written = agentrl_durable::write_via_path(path, |tmp| {
        safetensors::serialize_to_file(views, metadata, tmp).map_err(|e| match e {
            safetensors::SafeTensorError::IoError(io) => io,
            other => std::io::Error::other(other.to_string()),
        })?;
        // A tensor that could not be converted was written as nothing: the
        // file is short, and must not replace the previous one.
        match failed.borrow().is_some() {
            true => Err(std::io::Error::other("a tensor could not be converted")),
            false => Ok(()),
        }
    });
    if let Some(e) = failed.take() {
        return Err(e);
    }
    written.map_err(|e| ModelError::io(path, e))
}

/// A tensor that becomes its little-endian bytes only when the safetensors
/// writer reaches it (the header needs only its dtype and shape). A
/// conversion that fails leaves its error in `failed` and yields no bytes.
struct LazyBytes<'a> {
    tensor: &'a Tensor,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    failed: &'a RefCell<Option<ModelError>>,
}

impl safetensors::View for LazyBytes<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        match le_bytes_as(self.tensor, self.dtype) {
            Ok(bytes) => Cow::Owned(bytes),
            Err(e) => {
                self.failed.borrow_mut().get_or_insert(e);
                Cow::Borrowed(&[])
            }
        }
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// The contiguous little-endian bytes of `t` as `dtype` (f32, f64 or u32).
fn le_bytes_as(t: &Tensor, dtype: safetensors::Dtype) -> Result<Vec<u8>, ModelError> {
    let flat = |d: DType| -> candle_core::Result<Tensor> {
        t.to_dtype(d)?.to_device(&Device::Cpu)?.flatten_all()
    };
    match dtype {
        safetensors::Dtype::F32 => le_bytes(&flat(DType::F32)?, f32::to_le_bytes),
        safetensors::Dtype::F64 => le_bytes(&flat(DType::F64)?, f64::to_le_bytes),
        safetensors::Dtype::U32 => le_bytes(&flat(DType::U32)?, u32::to_le_bytes),
        other => Err(ModelError::InvalidInput(format!(
            "cannot write a tensor as {other:?}"
        ))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tensors() -> BTreeMap<String, Tensor> {
        let a = Tensor::new(&[[1f32, -2.5], [3.0, 4.25]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[7u32, 8, 9], &Device::Cpu).unwrap();
        BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)])
    }

    #[test]
    fn tensors_written_one_at_a_time_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        write_tensors_exact(&path, &tensors()).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let a = st.tensor("a").unwrap();
        assert_eq!(a.dtype(), safetensors::Dtype::F32);
        assert_eq!(a.shape(), [2, 2]);
        let want: Vec<u8> = [1f32, -2.5, 3.0, 4.25]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(a.data(), want);
        let b = st.tensor("b").unwrap();
        assert_eq!(b.dtype(), safetensors::Dtype::U32);
        assert_eq!(b.data(), [7u32, 8, 9].map(u32::to_le_bytes).concat());
        // The f32 form converts: u32 7 is written as 7.0.
        write_tensors(&path, &tensors()).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("b").unwrap().dtype(), safetensors::Dtype::F32);
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(header.metadata().as_ref().unwrap()["format"], "pt");
    }

    #[test]
    fn a_tensor_that_cannot_be_converted_leaves_the_previous_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        write_tensors_exact(&path, &tensors()).unwrap();
        let before = std::fs::read(&path).unwrap();
        // The second tensor asks for a form the writer cannot make.
        let dtypes = [safetensors::Dtype::F32, safetensors::Dtype::BF16].map(Ok);
        let e = write_lazily(&path, &tensors(), dtypes.into_iter(), None).unwrap_err();
        assert!(e.to_string().contains("BF16"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(leftovers, 1, "a temporary file was left behind");
    }
}

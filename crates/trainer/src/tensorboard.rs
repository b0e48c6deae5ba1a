//! The run's metrics as TensorBoard event files, for those who watch runs
//! there: `RUN_DIR/tensorboard/events.out.tfevents.<time>.agentrl`, one
//! scalar per numeric field of each `metrics.jsonl` record, written as the
//! record is.
//!
//! The format is TensorFlow's record file: each record is its length (u64
//! LE), the length's masked CRC-32C, a serialised `tensorflow.Event` and
//! its masked CRC-32C. The three protobuf messages needed (`Event`,
//! `Summary`, `Summary.Value`) are encoded here by hand: the crates that
//! write TensorBoard files bring a protobuf runtime and image codecs for
//! what is ~40 lines.
//!
//! A resumed run opens a new file and writes its steps again from the
//! checkpoint; TensorBoard drops the older file's later steps when it sees a
//! step go back ("purging expired events"), so the curves show the run as
//! it continued.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The folder of a run's event files.
pub const TENSORBOARD_DIR: &str = "tensorboard";

/// Appends scalar events to one event file.
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `run_dir/tensorboard/` (created if missing),
    /// opened with TensorBoard's file-version event.
    pub fn create(run_dir: &Path) -> io::Result<Self> {
        let dir = run_dir.join(TENSORBOARD_DIR);
        fs::create_dir_all(&dir)?;
        let now = wall_time();
        // Several files a second (a quick resume) must not collide.
        let mut n = 0u32;
        let path = loop {
            let p = dir.join(format!("events.out.tfevents.{}.agentrl.{n}", now as u64));
            if !p.exists() {
                break p;
            }
            n += 1;
        };
        let mut w = Self {
            out: BufWriter::new(File::create(&path)?),
            path,
        };
        w.write_record(&event(now, 0, Payload::FileVersion("brain.Event:2")))?;
        w.out.flush()?;
        Ok(w)
    }

    /// Where the events go.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One event at `step` holding every scalar of `record` (see
    /// [`record_scalars`]); nothing when it has none.
    pub fn write_metrics(&mut self, record: &serde_json::Value) -> io::Result<()> {
        let Some((step, scalars)) = record_scalars(record) else {
            return Ok(());
        };
        if scalars.is_empty() {
            return Ok(());
        }
        self.write_record(&event(wall_time(), step, Payload::Scalars(&scalars)))?;
        self.out.flush()
    }

    fn write_record(&mut self, data: &[u8]) -> io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        self.out.write_all(&len)?;
        self.out.write_all(&masked_crc32c(&len).to_le_bytes())?;
        self.out.write_all(data)?;
        self.out.write_all(&masked_crc32c(data).to_le_bytes())
    }
}

/// The step of a metrics record and its scalars as TensorBoard tags: a
/// `"kind": "train"` record's numeric fields as `train/<field>`, an eval
/// record's as `eval/<phase>/<field>` (`eval/val/success_rate`), nested
/// objects joined with `/`. Strings, arrays and booleans are not scalars.
/// `None` for a record with no integer `step`.
pub fn record_scalars(record: &serde_json::Value) -> Option<(i64, Vec<(String, f32)>)> {
    let obj = record.as_object()?;
    let step = obj.get("step")?.as_i64()?;
    let kind = obj
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or("metrics");
    let prefix = match obj.get("phase").and_then(|p| p.as_str()) {
        Some(phase) => format!("{kind}/{phase}"),
        None => kind.to_string(),
    };
    let mut out = Vec::new();
    for (key, value) in obj {
        if key != "step" {
            flatten(&format!("{prefix}/{key}"), value, &mut out);
        }
    }
    Some((step, out))
}

fn flatten(tag: &str, value: &serde_json::Value, out: &mut Vec<(String, f32)>) {
    match value {
        serde_json::Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                out.push((tag.to_string(), x as f32));
            }
        }
        serde_json::Value::Object(o) => {
            for (k, v) in o {
                flatten(&format!("{tag}/{k}"), v, out);
            }
        }
        _ => {}
    }
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What an event carries.
enum Payload<'a> {
    FileVersion(&'a str),
    Scalars(&'a [(String, f32)]),
}

/// A serialised `tensorflow.Event`: wall_time = 1 (double), step = 2
/// (int64), file_version = 3 (string), summary = 5 (`Summary`, whose
/// repeated `Value` = 1 holds tag = 1 (string) and simple_value = 2 (float)).
fn event(wall_time: f64, step: i64, payload: Payload<'_>) -> Vec<u8> {
    let mut e = Vec::new();
    e.push(0x09);
    e.extend_from_slice(&wall_time.to_le_bytes());
    e.push(0x10);
    varint(step as u64, &mut e);
    match payload {
        Payload::FileVersion(v) => bytes_field(0x1a, v.as_bytes(), &mut e),
        Payload::Scalars(scalars) => {
            let mut summary = Vec::new();
            for (tag, x) in scalars {
                let mut value = Vec::new();
                bytes_field(0x0a, tag.as_bytes(), &mut value);
                value.push(0x15);
                value.extend_from_slice(&x.to_le_bytes());
                bytes_field(0x0a, &value, &mut summary);
            }
            bytes_field(0x2a, &summary, &mut e);
        }
    }
    e
}

fn bytes_field(key: u8, bytes: &[u8], out: &mut Vec<u8>) {
    out.push(key);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn varint(mut x: u64, out: &mut Vec<u8>) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

/// TensorFlow's masked CRC-32C of a record's length and data.
fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masked_crc_follows_tensorflow() {
        // CRC-32C's check value 0xe3069283, then TensorFlow's mask
        // ((c >> 15) | (c << 17)) + 0xa282ead8, worked by hand.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn varints_are_little_endian_base_128() {
        let mut v = Vec::new();
        varint(300, &mut v);
        assert_eq!(v, vec![0xac, 0x02]);
        v.clear();
        varint(0, &mut v);
        assert_eq!(v, vec![0]);
    }

    #[test]
    fn a_scalar_event_encodes_field_by_field() {
        let e = event(1.5, 3, Payload::Scalars(&[("a".to_string(), 2.0)]));
        let mut want = vec![0x09];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 3, 0x2a, 10, 0x0a, 8, 0x0a, 1, b'a', 0x15]);
        want.extend_from_slice(&2.0f32.to_le_bytes());
        assert_eq!(e, want);
    }

    #[test]
    fn records_become_tags_by_kind_and_phase() {
        let (step, s) = record_scalars(&json!({
            "kind": "train", "step": 4, "success": 0.5, "collapse": [],
            "failures": {"labels": {"loop": 2}}, "env": "frozenlake"
        }))
        .unwrap();
        assert_eq!(step, 4);
        assert_eq!(
            s,
            vec![
                ("train/failures/labels/loop".to_string(), 2.0),
                ("train/success".to_string(), 0.5)
            ]
        );
        let (_, s) = record_scalars(
            &json!({"kind": "eval", "phase": "val", "step": 10, "success_rate": 0.25}),
        )
        .unwrap();
        assert_eq!(s, vec![("eval/val/success_rate".to_string(), 0.25)]);
        assert!(record_scalars(&json!({"kind": "train"})).is_none());
    }

    /// Read a file's records back, checking both CRCs of each.
    fn read_records(path: &Path) -> Vec<Vec<u8>> {
        let bytes = fs::read(path).unwrap();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            let len_bytes = &bytes[i..i + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[i + 8..i + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(len_bytes));
            let data = &bytes[i + 12..i + 12 + len];
            let crc = u32::from_le_bytes(bytes[i + 12 + len..i + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(data));
            out.push(data.to_vec());
            i += 16 + len;
        }
        out
    }

    #[test]
    fn a_file_holds_its_version_then_one_event_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.write_metrics(&json!({"kind": "train", "step": 1, "success": 0.5}))
            .unwrap();
        w.write_metrics(&json!({"kind": "sft", "step": 0, "epoch_losses": [1.0]}))
            .unwrap();
        let records = read_records(w.path());
        assert_eq!(records.len(), 2, "the scalar-free record writes nothing");
        assert!(records[0].ends_with(b"brain.Event:2"));
        assert!(records[1].windows(13).any(|w| w == b"train/success"));
        let second = EventWriter::create(dir.path()).unwrap();
        assert_ne!(second.path(), w.path(), "a resumed run opens its own file");
    }
}

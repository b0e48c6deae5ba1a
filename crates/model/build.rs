//! With the `cuda` feature, compiles `kernels/*.cu` to PTX (included and
//! loaded at run time through `src/cuda.rs`), using the CUDA toolkit candle's kernels need too:
//! `nvcc` from `$CUDA_HOME/bin` or the PATH, for `$CUDA_COMPUTE_CAP`
//! (candle's variable), else the compute capability `nvidia-smi` reports
//! for GPU 0, as candle's own kernel build decides it.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let nvcc = match std::env::var_os("CUDA_HOME") {
        Some(home) => PathBuf::from(home).join("bin").join("nvcc"),
        None => PathBuf::from("nvcc"),
    };
    let cap = std::env::var("CUDA_COMPUTE_CAP")
        .ok()
        .or_else(gpu_compute_cap)
        .expect("the cuda feature needs CUDA_COMPUTE_CAP (e.g. 90 for an H100) or nvidia-smi");
    let cap: String = cap.chars().filter(char::is_ascii_digit).collect();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // Every `.cu` file of kernels/ (src/cuda.rs includes each one's PTX).
    let mut names: Vec<String> = std::fs::read_dir("kernels")
        .expect("kernels/ is readable")
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .filter_map(|p| Some(p.file_stem()?.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    for name in &names {
        let src = format!("kernels/{name}.cu");
        let ptx = out_dir.join(format!("{name}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", &format!("-arch=compute_{cap}"), "-o"])
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("the cuda feature needs nvcc ({}): {e}", nvcc.display()));
        assert!(status.success(), "nvcc failed on {src}");
    }
}

/// GPU 0's compute capability from `nvidia-smi` ("9.0" → "90"), if it runs.
fn gpu_compute_cap() -> Option<String> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let cap: String = text
        .lines()
        .next()?
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    (out.status.success() && !cap.is_empty()).then_some(cap)
}

//! With the `cuda` feature, compiles `kernels/*.cu` to PTX (loaded at run
//! time by `token_loss`), using the CUDA toolkit candle's kernels need too:
//! `nvcc` from `$CUDA_HOME/bin` or the PATH, for `$CUDA_COMPUTE_CAP`
//! (candle's variable; default 70, whose PTX every later GPU can run).

use std::path::PathBuf;
use std::process::Command;

const KERNELS: &[&str] = &[
    "multi_tensor",
    "rms_norm",
    "softmax",
    "swiglu",
    "token_loss",
];

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
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "70".into());
    let cap: String = cap.chars().filter(char::is_ascii_digit).collect();
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for name in KERNELS {
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

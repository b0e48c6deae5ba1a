//! Compiles `crates/model/kernels/*.cu` as C++20 for the host, each inside
//! a namespace of its own (a device function's name may recur across
//! files, as separate PTX modules allow), with `cuda/cuda_emulation.h`
//! standing in for the CUDA headers and `cuda/emulator.cpp` for the launch.

use std::path::PathBuf;

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernels = here.join("../model/kernels");
    let cuda = here.join("cuda");
    println!("cargo:rerun-if-changed={}", kernels.display());
    println!("cargo:rerun-if-changed={}", cuda.display());
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .opt_level(2)
        .flag("-pthread")
        .flag("-include")
        .flag(cuda.join("cuda_emulation.h").to_string_lossy().as_ref())
        .define("AGENTRL_KERNEL_EMULATION", None)
        .include(&cuda)
        .file(cuda.join("emulator.cpp"));
    // Every `.cu` file there, in a fixed order: a new kernel source is
    // compiled here without a second list to keep.
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .expect("crates/model/kernels is readable")
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    for source in sources {
        let name = source
            .file_stem()
            .expect("a .cu file has a stem")
            .to_string_lossy();
        let wrapper = out.join(format!("{name}_emulated.cpp"));
        let text = format!(
            "namespace agentrl_kernel_{name} {{\n#include \"{}\"\n}}\n",
            source.display()
        );
        std::fs::write(&wrapper, text).expect("OUT_DIR is writable");
        build.file(wrapper);
    }
    build.compile("agentrl_kernel_emulation");
}

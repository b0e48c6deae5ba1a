// mma.h under emulation: nvcuda::wmma is in cuda_emulation.h.
#pragma once

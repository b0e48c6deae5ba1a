// cuda_bf16.h under emulation: the type is in cuda_emulation.h.
#pragma once

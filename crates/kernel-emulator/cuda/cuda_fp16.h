// cuda_fp16.h under emulation: the type is in cuda_emulation.h.
#pragma once

/* onednn: the process's one oneDNN engine, shared by the bf16 products
 * (bf16.c) and the packed decode linears (rowmm.c).
 *
 * Made at first use, never destroyed. PW_CPU below avx512 caps oneDNN's
 * instruction set first — possible only before oneDNN's first primitive,
 * so it lives here, ahead of every user. NULL when oneDNN cannot make one. */
#ifndef PW_ONEDNN_H
#define PW_ONEDNN_H

#include <dnnl.h>

dnnl_engine_t pw_onednn_engine(void);
/* The widest instruction set oneDNN dispatches to here (its own
 * detection, capped by PW_CPU): "avx512_core_amx" on a CPU with AMX
 * tiles, for the log and the worker's report. */
const char *pw_onednn_isa(void);

#endif

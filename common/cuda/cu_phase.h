/* cu_phase: block programs that gcc can run too — the way the CUDA
 * kernels that share memory between a block's threads (cu_fa_body.h's
 * attention, cu_rows_body.h's norm rows) are written, so that the CPU
 * tests emulate them block by block (test_cu_fa_emul, test_cu_emul).
 *
 * A block of PW_PH_NT threads runs a block program: a sequence of phases,
 * each PW_PH_THREADS (each thread once) or PW_PH_WARPS (each warp once,
 * its 32 lanes together: the tensor cores' products), each ending with the
 * block's barrier. Every value a thread keeps from one phase to the next
 * lives in the block's shared memory, none in registers, so the emulator
 * can run a phase as a loop over the block's threads — in either order
 * (PW_PH_EMU_ORDER, which a test may define: a phase that reads what
 * another thread of the same phase writes, a race on the GPU, then gives
 * other bits). Control flow between phases depends on the block's indices
 * and the call's shapes only. */
#ifndef PW_CU_PHASE_H
#define PW_CU_PHASE_H

#define PW_PH_NT 256             /* threads of a block */
#define PW_PH_NW (PW_PH_NT / 32) /* its warps */

#ifdef __CUDACC__
#define PW_PH_FN static inline __device__
#define PW_PH_THREADS(t, ...)          \
  do {                                 \
    {                                  \
      int t = (int)threadIdx.x;        \
      __VA_ARGS__;                     \
    }                                  \
    __syncthreads();                   \
  } while (0)
#define PW_PH_WARPS(w, ...)            \
  do {                                 \
    {                                  \
      int w = (int)(threadIdx.x >> 5); \
      __VA_ARGS__;                     \
    }                                  \
    __syncthreads();                   \
  } while (0)
#else
#define PW_PH_FN static inline
/* the emulator's thread order: i of n (a test may reverse it) */
#ifndef PW_PH_EMU_ORDER
#define PW_PH_EMU_ORDER(i, n) (i)
#endif
#define PW_PH_THREADS(t, ...)                        \
  do {                                               \
    for (int t##_i = 0; t##_i < PW_PH_NT; t##_i++) { \
      int t = PW_PH_EMU_ORDER(t##_i, PW_PH_NT);      \
      __VA_ARGS__;                                   \
    }                                                \
  } while (0)
#define PW_PH_WARPS(w, ...)                          \
  do {                                               \
    for (int w##_i = 0; w##_i < PW_PH_NW; w##_i++) { \
      int w = PW_PH_EMU_ORDER(w##_i, PW_PH_NW);      \
      __VA_ARGS__;                                   \
    }                                                \
  } while (0)
#endif

#endif

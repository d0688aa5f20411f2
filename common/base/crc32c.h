/* crc32c: CRC-32C (Castagnoli), the checksum of every data-plane frame.
 *
 * One entry point, pw_crc32c(), runs the fastest code the CPU has and
 * pw_cpu_level() allows: AVX-512 VPCLMULQDQ folding from 256 bytes on, the
 * SSE4.2 crc32 instruction (three interleaved streams) for shorter buffers
 * or without AVX-512 (or with PW_CPU=avx2 or sse, see cpu.h), else a
 * slicing-by-8 table. All give identical results; the standard check value is pw_crc32c(0, "123456789", 9) == 0xE3069283.
 *
 * Incremental: the value for A||B is pw_crc32c(pw_crc32c(0, A, a), B, b).
 * Start with 0. Thread-safe; never allocates. */
#ifndef PW_CRC32C_H
#define PW_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t pw_crc32c(uint32_t crc, const void *buf, size_t n);

/* The implementations, exposed for tests and benchmarks.
 * pw_crc32c_hw() may only be called when pw_crc32c_hw_available(),
 * pw_crc32c_vec() (AVX-512 VPCLMULQDQ folding; SSE4.2 below 256 bytes)
 * only when pw_crc32c_vec_available() (the CPU has it and pw_cpu_level()
 * allows AVX-512). */
int pw_crc32c_hw_available(void);
int pw_crc32c_vec_available(void);
uint32_t pw_crc32c_sw(uint32_t crc, const void *buf, size_t n);
uint32_t pw_crc32c_hw(uint32_t crc, const void *buf, size_t n);
uint32_t pw_crc32c_vec(uint32_t crc, const void *buf, size_t n);

#endif

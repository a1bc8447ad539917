// AMX tile state for the kernels that use tile products (the flash-attention
// tiles and the bf16 panel linear). One layout serves all of them: 8 tiles of
// 16 rows x 64 bytes (16 fp32 or 32 bf16 per row).
#pragma once

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#define PAGODA_AMX 1
#endif

namespace {

#ifdef PAGODA_AMX
struct TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

inline bool amx_permitted() {
  // Linux hands out the AMX tile state only to processes that ask (XFEATURE 18).
  static const bool ok = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
  return ok;
}
#endif  // PAGODA_AMX

// Whether tile products run here: built for AMX, and the kernel lets us.
inline bool use_amx() {
#ifdef PAGODA_AMX
  return amx_permitted();
#else
  return false;
#endif
}

// Runs `body` on this thread with the tile state set up around it (when kAmx).
template <bool kAmx, typename Body>
void with_tiles(Body&& body) {
#ifdef PAGODA_AMX
  if constexpr (kAmx) configure_tiles();
#endif
  body();
#ifdef PAGODA_AMX
  if constexpr (kAmx) _tile_release();
#endif
}

}  // namespace

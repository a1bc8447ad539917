// Two flash tiles (17-32 query rows of one head) at once with AMX, a block of
// key chunks per softmax step (included by flash_tile_pair.h).
//
// attend_tile runs one tile's chain per chunk (two score products, their store,
// the softmax, the P V^T products). Here each product step is 2 x 2
// independent accumulators (tiles 0-3: two key halves or two dim tiles, times
// two query tiles; operands in 4-7), so each K and V^T tile loaded from L2
// feeds both query tiles; a block of kBlockChunks chunks goes through the
// softmax in one pass (TileSoftmax::block), and O^T lives in L1, loaded into the
// accumulators once per block rather than per chunk. 4 x 1024-token prefill, one
// layer, AMX Xeon family 6 model 167: 0.94x attend_tile's time (0.88x with the
// cheaper exp2 both now share). Measured there, not kept: issuing the next
// block's score products between this block's max and its exponentials (so the
// tile unit would work under the vector units): no change.
#pragma once

#include "flash_tile.h"

namespace {

#if defined(PAGODA_PREFILL) && defined(PAGODA_AMX)

constexpr int kBlockChunks = 2;  // 64 keys per softmax step (4: 1.02x the time, 8: 1.08x)

// Both tiles' S^T for one chunk: st0, st1 [32 keys][16 queries].
inline void scores_pair_amx(const uint32_t* qt0, const uint32_t* qt1, const uint16_t* kc, int64_t d, float* st0,
                            float* st1) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t dc = 0; dc < d / 32; ++dc) {
    _tile_loadd(4, kc + dc * 32, d * 2);  // keys 0-15, dims dc * 32 + [0, 32)
    _tile_loadd(6, qt0 + dc * 256, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, kc + 16 * d + dc * 32, d * 2);  // keys 16-31
    _tile_dpbf16ps(1, 5, 6);
    _tile_loadd(7, qt1 + dc * 256, 64);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, st0, 64);
  _tile_stored(1, st0 + 16 * kTileRows, 64);
  _tile_stored(2, st1, 64);
  _tile_stored(3, st1 + 16 * kTileRows, 64);
}

// ot0, ot1 [d][16 queries] += V^T P^T over `chunks` chunks from vc (pt0, pt1:
// [chunk][16 key pairs][16 queries]), two dim tiles of both at a time.
inline void values_pair_amx(const uint16_t* vc, int64_t chunk_elems, int chunks, const uint32_t* pt0,
                            const uint32_t* pt1, int64_t d, float* ot0, float* ot1) {
  for (int64_t g = 0; g < d / 16; g += 2) {
    _tile_loadd(0, ot0 + g * 256, 64);
    _tile_loadd(1, ot0 + (g + 1) * 256, 64);
    _tile_loadd(2, ot1 + g * 256, 64);
    _tile_loadd(3, ot1 + (g + 1) * 256, 64);
    for (int j = 0; j < chunks; ++j) {
      const uint16_t* v = vc + j * chunk_elems + g * 512;  // V^T dims g * 16 + [0, 32), 32 keys
      _tile_loadd(4, v, 64);
      _tile_loadd(6, pt0 + j * 256, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(5, v + 512, 64);
      _tile_dpbf16ps(1, 5, 6);
      _tile_loadd(7, pt1 + j * 256, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, ot0 + g * 256, 64);
    _tile_stored(1, ot0 + (g + 1) * 256, 64);
    _tile_stored(2, ot1 + g * 256, 64);
    _tile_stored(3, ot1 + (g + 1) * 256, 64);
  }
}

// Rows 17-32 of one head as two tiles, row i at position first_pos + i *
// row_step; the same contract as attend_tile (which takes 1-16 rows). Chunks
// past the first tile's last row give it all-masked scores, which the softmax
// turns into zero probabilities; a block wholly past it skips its softmax.
template <typename OutT>
void attend_pair_amx(const uint16_t* q, int64_t q_stride, int rows, int64_t first_pos, int row_step,
                     const uint16_t* k_packed, const uint16_t* v_packed, const Layout& lay, float scale,
                     int64_t window, OutT* out, int64_t out_stride, float* lse = nullptr) {
  const int64_t d = lay.head_dim;
  alignas(64) uint32_t qt[2][256 / 32 * 256];                   // Q^T as B tiles, per tile
  alignas(64) float st[2][kBlockChunks * kChunk * kTileRows];    // S^T [block keys][16 queries]
  alignas(64) uint32_t pt[2][kBlockChunks * kChunk / 2 * kTileRows];  // P^T [chunk][16 key pairs][16 queries]
  alignas(64) float ot[2][256 * kTileRows];                      // O^T [d][16 queries]
  const int n1 = rows - kTileRows;
  const int64_t first[2] = {first_pos, first_pos + static_cast<int64_t>(kTileRows) * row_step};
  const int64_t last[2] = {first_pos + static_cast<int64_t>(kTileRows - 1) * row_step,
                           first[1] + static_cast<int64_t>(n1 - 1) * row_step};
  load_qt(q, q_stride, kTileRows, d, qt[0]);
  load_qt(q + kTileRows * q_stride, q_stride, n1, d, qt[1]);
  std::fill(ot[0], ot[0] + d * kTileRows, 0.f);
  std::fill(ot[1], ot[1] + d * kTileRows, 0.f);
  TileSoftmax sm[2] = {TileSoftmax(first[0], row_step, scale), TileSoftmax(first[1], row_step, scale)};
  const int64_t lo = window > 0 ? std::max<int64_t>(0, first[0] - window + 1) : 0;
  const int64_t end_chunk = last[1] / kChunk + 1;
  for (int64_t ch0 = lo / kChunk; ch0 < end_chunk; ch0 += kBlockChunks) {
    const int chunks = static_cast<int>(std::min<int64_t>(kBlockChunks, end_chunk - ch0));
    for (int j = 0; j < chunks; ++j)
      scores_pair_amx(qt[0], qt[1], k_packed + (ch0 + j) * lay.chunk_elems, d, st[0] + j * kChunk * kTileRows,
                      st[1] + j * kChunk * kTileRows);
    const int64_t k0 = ch0 * kChunk, k1 = k0 + chunks * kChunk - 1;  // the block's first and last key
    for (int t = 0; t < 2; ++t) {
      if (k0 > last[t]) {  // every key past every row of this tile
        std::fill(pt[t], pt[t] + chunks * kChunk / 2 * kTileRows, 0u);
        continue;
      }
      const bool masked = k1 > first[t] || (window > 0 && last[t] - k0 >= window);
      bool shifted;
      const __m512 alpha = sm[t].block(st[t], chunks, k0, masked, window, true, pt[t], shifted);
      if (shifted)
        for (int64_t e = 0; e < d; ++e)
          _mm512_store_ps(ot[t] + e * kTileRows, _mm512_mul_ps(_mm512_load_ps(ot[t] + e * kTileRows), alpha));
    }
    values_pair_amx(v_packed + ch0 * lay.chunk_elems, lay.chunk_elems, chunks, pt[0], pt[1], d, ot[0], ot[1]);
  }
  sm[0].finish(ot[0], kTileRows, d, out, out_stride, lse);
  sm[1].finish(ot[1], n1, d, out + kTileRows * out_stride, out_stride, lse != nullptr ? lse + kTileRows : nullptr);
}

#endif  // PAGODA_PREFILL && PAGODA_AMX

}  // namespace

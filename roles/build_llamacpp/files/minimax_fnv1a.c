/* FNV-1a 64, exactly as llama.cpp's ggml-rpc.cpp computes it (fnv_hash): offset basis
 * 0xcbf29ce484222325, prime 0x100000001b3, one byte at a time. The rpc_cache_seed module calls it
 * through ctypes to name the RPC tensor cache's entries; pass the previous result as `hash` to hash
 * a tensor in chunks. Built by the build_llamacpp role as <bin>/libminimax_fnv1a.so. */
#include <stddef.h>
#include <stdint.h>

uint64_t minimax_fnv1a64(const uint8_t *data, size_t len, uint64_t hash)
{
    const uint64_t prime = 0x100000001b3ULL;
    for (size_t i = 0; i < len; ++i) {
        hash ^= data[i];
        hash *= prime;
    }
    return hash;
}

// SPDX-License-Identifier: Apache-2.0
// strmap.c: the string map of strmap.h, with SipHash-1-3 (Aumasson and Bernstein, "SipHash: a fast
// short-input PRF", 2012): a 128-bit key, one compression round per 8-byte word, three
// finalisation rounds.
#include "io/strmap.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

struct bie_strmap_slot {
    const char * key; // NULL: empty
    uint64_t hash;
    size_t value;
};

static uint64_t k0, k1;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static uint64_t mix64(uint64_t z) { // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void make_key(void) {
    uint64_t k[2];
    if (getrandom(k, sizeof k, GRND_NONBLOCK) != (ssize_t)sizeof k) {
        // No entropy yet (early boot): the clock and addresses, mixed, are still unknown to a file.
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        k[0] = mix64((uint64_t)t.tv_nsec ^ ((uint64_t)t.tv_sec << 32) ^ (uint64_t)(uintptr_t)&t);
        k[1] = mix64(k[0] ^ (uint64_t)(uintptr_t)&key_once);
    }
    k0 = k[0];
    k1 = k[1];
}

static inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

#define SIPROUND                                                                                                       \
    do {                                                                                                               \
        v0 += v1;                                                                                                      \
        v1 = rotl(v1, 13);                                                                                             \
        v1 ^= v0;                                                                                                      \
        v0 = rotl(v0, 32);                                                                                             \
        v2 += v3;                                                                                                      \
        v3 = rotl(v3, 16);                                                                                             \
        v3 ^= v2;                                                                                                      \
        v0 += v3;                                                                                                      \
        v3 = rotl(v3, 21);                                                                                             \
        v3 ^= v0;                                                                                                      \
        v2 += v1;                                                                                                      \
        v1 = rotl(v1, 17);                                                                                             \
        v1 ^= v2;                                                                                                      \
        v2 = rotl(v2, 32);                                                                                             \
    } while (0)

static uint64_t siphash13(const uint8_t * p, size_t n) {
    pthread_once(&key_once, make_key);
    uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
    const size_t words = n / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t m = 0;
        for (int b = 7; b >= 0; b--) m = (m << 8) | p[8 * i + (size_t)b]; // little-endian word
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t last = (uint64_t)(n & 0xff) << 56;
    for (size_t b = 0; b < n % 8; b++) last |= (uint64_t)p[8 * words + b] << (8 * b);
    v3 ^= last;
    SIPROUND;
    v0 ^= last;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

static bool grow(struct bie_strmap * m) {
    const size_t cap = m->cap ? 2 * m->cap : 16;
    struct bie_strmap_slot * s = calloc(cap, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key) continue;
        size_t j = (size_t)m->slots[i].hash & (cap - 1);
        while (s[j].key) j = (j + 1) & (cap - 1);
        s[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return true;
}

bool bie_strmap_put(struct bie_strmap * m, const char * key, size_t value, bool * found) {
    if (found) *found = false;
    if (2 * (m->count + 1) > m->cap && !grow(m)) return false;
    const uint64_t h = siphash13((const uint8_t *)key, strlen(key));
    size_t j = (size_t)h & (m->cap - 1);
    for (; m->slots[j].key; j = (j + 1) & (m->cap - 1))
        if (m->slots[j].hash == h && strcmp(m->slots[j].key, key) == 0) {
            if (found) *found = true;
            return true;
        }
    m->slots[j] = (struct bie_strmap_slot){key, h, value};
    m->count++;
    return true;
}

bool bie_strmap_get(const struct bie_strmap * m, const char * key, size_t * value) {
    if (!m->cap) return false;
    const uint64_t h = siphash13((const uint8_t *)key, strlen(key));
    for (size_t j = (size_t)h & (m->cap - 1); m->slots[j].key; j = (j + 1) & (m->cap - 1))
        if (m->slots[j].hash == h && strcmp(m->slots[j].key, key) == 0) {
            *value = m->slots[j].value;
            return true;
        }
    return false;
}

void bie_strmap_free(struct bie_strmap * m) {
    free(m->slots);
    m->slots = NULL;
    m->cap = m->count = 0;
}

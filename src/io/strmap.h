// SPDX-License-Identifier: Apache-2.0
// strmap.h: a hash map from strings to indexes, for the readers of untrusted files (duplicate
// keys in a JSON object, tensor and metadata lookups by name).
//
// Linear in time whatever the keys: the hash is SipHash-1-3 with a key drawn from getrandom(2)
// once per process, so a file cannot be crafted to make every key collide (hash flooding), and
// the table (open addressing, linear probing) stays at most half full. The map keeps pointers to
// the callers' strings, which must outlive it.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bie_strmap_slot;

struct bie_strmap {
    struct bie_strmap_slot * slots;
    size_t cap, count; // cap: a power of two, or 0
};

// Inserts key -> value unless the key is there. Returns false only when out of memory; *found
// (may be NULL) is set to whether the key was already there (then the map is unchanged).
bool bie_strmap_put(struct bie_strmap * m, const char * key, size_t value, bool * found);
// The value of key, or false when it is not in the map.
bool bie_strmap_get(const struct bie_strmap * m, const char * key, size_t * value);
void bie_strmap_free(struct bie_strmap * m);

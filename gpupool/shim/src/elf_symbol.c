/*
 * A symbol's default definition in one loaded object, read from the object's own dynamic symbol
 * table. Why not dlsym: the library replaces both dlsym and dlvsym (symbols.c), so neither can be
 * used to find the other's real definition; and dlmopen.c asks whether an object in another link
 * map namespace is a driver, where this library's dlsym is not loaded.
 * Runs before sanitizer runtimes finish starting, so it is not instrumented.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>

#include "shim.h"

#define EARLY __attribute__((no_sanitize("address", "undefined")))

/* The dynamic section's addresses are relocated in place by glibc on most architectures, not on
 * all: an address below the object's base is still an offset. */
EARLY static const void *dyn_address(const struct link_map *map, ElfW(Addr) value) {
    return (const void *)(value < map->l_addr ? value + map->l_addr : value);
}

EARLY static uint32_t gnu_hash(const char *name) {
    uint32_t h = 5381;
    for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++) h = h * 33 + *c;
    return h;
}

/* Not strcmp: a sanitizer runtime's strcmp may not be ready yet when this runs. */
EARLY int shim_same_name(const char *a, const char *b) {
    while (*a != '\0' && *a == *b) a++, b++;
    return *a == *b;
}

EARLY static int matches(const ElfW(Sym) *symbol, const char *strings, const ElfW(Half) *versions, uint32_t index,
                         const char *name) {
    if (symbol->st_shndx == SHN_UNDEF || symbol->st_value == 0) return 0;
    if (versions != NULL && (versions[index] & 0x8000) != 0) return 0; /* a hidden (non-default) version */
    return shim_same_name(strings + symbol->st_name, name);
}

EARLY void *shim_elf_symbol(const struct link_map *map, const char *name) {
    const ElfW(Sym) *symbols = NULL;
    const char *strings = NULL;
    const uint32_t *gnu = NULL, *sysv = NULL;
    const ElfW(Half) *versions = NULL;
    if (map == NULL || map->l_ld == NULL) return NULL;
    for (const ElfW(Dyn) *d = map->l_ld; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB) symbols = dyn_address(map, d->d_un.d_ptr);
        else if (d->d_tag == DT_STRTAB) strings = dyn_address(map, d->d_un.d_ptr);
        else if (d->d_tag == DT_GNU_HASH) gnu = dyn_address(map, d->d_un.d_ptr);
        else if (d->d_tag == DT_HASH) sysv = dyn_address(map, d->d_un.d_ptr);
        else if (d->d_tag == DT_VERSYM) versions = dyn_address(map, d->d_un.d_ptr);
    }
    if (symbols == NULL || strings == NULL) return NULL;
    if (gnu != NULL) {
        uint32_t buckets = gnu[0], offset = gnu[1], bloom_words = gnu[2];
        if (buckets == 0) return NULL;
        const uint32_t *bucket = (const uint32_t *)((const ElfW(Addr) *)(gnu + 4) + bloom_words);
        const uint32_t *chain = bucket + buckets;
        uint32_t hash = gnu_hash(name);
        for (uint32_t i = bucket[hash % buckets]; i >= offset; i++) {
            uint32_t link = chain[i - offset];
            if ((link | 1) == (hash | 1) && matches(&symbols[i], strings, versions, i, name))
                return (void *)(map->l_addr + symbols[i].st_value);
            if (link & 1) break;
        }
        return NULL;
    }
    if (sysv != NULL)
        for (uint32_t i = 0; i < sysv[1]; i++) /* nchain: one entry per symbol */
            if (matches(&symbols[i], strings, versions, i, name)) return (void *)(map->l_addr + symbols[i].st_value);
    return NULL;
}

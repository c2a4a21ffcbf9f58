// Symbol visibility: the library is built with hidden visibility; what is
// marked here is its ABI.
#pragma once
#define GPUMEM_EXPORT __attribute__((visibility("default")))

//go:build cgo && linux

/* hostmem.c: page-aligned C memory (never the Go heap). */
#include "b2bv_int.h"

#include <stdlib.h>
#include <string.h>

enum { B2BV_PAGE = 4096 };

int b2bv_alloc(size_t n, void **out)
{
	void *p = NULL;
	*out = NULL;
	int rc = posix_memalign(&p, B2BV_PAGE, n ? n : 1);
	if (rc != 0)
		return -rc;
	memset(p, 0, n);
	*out = p;
	return 0;
}

void b2bv_free(void *p) { free(p); }

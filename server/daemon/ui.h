/*
 * server/daemon/ui.h: the playground's files, built into the binary
 * (scripts/embed.py writes the table from server/ui/ at build time).
 */
#ifndef GPT2D_SERVER_UI_H
#define GPT2D_SERVER_UI_H

#include <stddef.h>

typedef struct {
    const char *path; /* "/" or "/name.ext"; NULL ends the table */
    const char *type; /* Content-Type */
    const char *csp;  /* Content-Security-Policy: its inline code by hash */
    const unsigned char *bytes;
    size_t len;
} srv_ui_asset;

extern const srv_ui_asset srv_ui_assets[];

#endif

/*
 * config/models.c: `model` as a list of checkpoints (cfg_models_split).
 * One folder is one checkpoint, as it always was; "DIR,NAME=DIR,DIR" serves
 * the first as the primary (model_name's names) and each other under its
 * name, the folder's last component when it has no NAME=.
 */
#include "config.h"
#include "errbuf.h"

#include <stdlib.h>
#include <string.h>

/* The folder's last component (trailing slashes ignored) into out. */
static void base_name(const char *dir, char *out, size_t len)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(out, len, "%.*s", (int)(n - b), dir + b);
}

/* 1 when name is taken: one of model_name's, another entry's, or an
 * adapter's in lora_modules. */
static int name_taken(const cfg_config *c, const char *name, size_t upto)
{
    if (cfg_model_name_ok(c, name)) return 1;
    for (size_t i = 0; i < upto; i++)
        if (strcmp(c->more_models[i].name, name) == 0) return 1;
    size_t nl = c->max_loras > 0 ? c->max_loras : 1, got = 0;
    cfg_lora_module *mods = calloc(nl, sizeof *mods);
    int taken = 0;
    if (mods != NULL && cfg_lora_modules_parse(c->lora_modules, mods, nl, &got, NULL, 0) == CFG_OK)
        for (size_t i = 0; i < got && !taken; i++) taken = strcmp(mods[i].name, name) == 0;
    free(mods);
    return taken;
}

cfg_status cfg_models_split(cfg_config *c, char *err, size_t errlen)
{
    c->n_more_models = 0;
    char *comma = strchr(c->model_dir, ',');
    if (comma == NULL) return CFG_OK;
    char *rest = strdup(comma + 1);
    if (rest == NULL) return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "out of memory");
    *comma = '\0';
    size_t lead = strspn(c->model_dir, " ");
    memmove(c->model_dir, c->model_dir + lead, strlen(c->model_dir + lead) + 1);
    size_t n = strlen(c->model_dir);
    while (n > 0 && c->model_dir[n - 1] == ' ') c->model_dir[--n] = '\0';
    cfg_status st = CFG_OK;
    if (n == 0)
        st = ERRBUF_FAIL(err, errlen, CFG_EVALUE, "model: the first entry is empty (DIR,DIR...)");
    else if (strchr(c->model_dir, '=') != NULL
             && memchr(c->model_dir, '/', (size_t)(strchr(c->model_dir, '=') - c->model_dir))
                    == NULL)
        st = ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                         "model: '%.200s': the first checkpoint is named by model_name, not NAME=",
                         c->model_dir);
    for (char *e = rest, *next; st == CFG_OK && e != NULL; e = next) {
        next = strchr(e, ',');
        if (next != NULL) *next++ = '\0';
        while (*e == ' ') e++;
        size_t len = strlen(e);
        while (len > 0 && e[len - 1] == ' ') e[--len] = '\0';
        if (len == 0) {
            st = ERRBUF_FAIL(err, errlen, CFG_EVALUE, "model: an empty entry (DIR,NAME=DIR...)");
            break;
        }
        if (c->n_more_models + 1 >= CFG_MAX_MODELS) {
            st = ERRBUF_FAIL(err, errlen, CFG_EVALUE, "model: more than %d checkpoints",
                             CFG_MAX_MODELS);
            break;
        }
        /* NAME=DIR where what precedes the first '=' has no '/' (a folder
         * with '=' in its name is still a folder). */
        char *eq = strchr(e, '=');
        const char *dir = e;
        char name[CFG_MODEL_NAME_MAX + 1];
        if (eq != NULL && memchr(e, '/', (size_t)(eq - e)) == NULL) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - e < CFG_MODEL_NAME_MAX ? eq - e : 64),
                     e);
            dir = eq + 1;
        } else {
            base_name(e, name, sizeof name);
        }
        if (*dir == '\0') {
            st = ERRBUF_FAIL(err, errlen, CFG_EVALUE, "model: '%.200s' names no folder", e);
            break;
        }
        if (!cfg_lora_name_ok(name) || strlen(name) >= CFG_MODEL_NAME_MAX) {
            st = ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                             "model: '%.200s' is not a checkpoint's name (letters, digits, '.', "
                             "'_' and '-'; NAME=DIR names it)",
                             name);
            break;
        }
        if (name_taken(c, name, c->n_more_models)) {
            st = ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                             "model: the name '%s' is taken (model_name, another checkpoint or "
                             "an adapter); NAME=DIR gives it another",
                             name);
            break;
        }
        if (strlen(dir) >= CFG_STR_MAX) {
            st = ERRBUF_FAIL(err, errlen, CFG_EVALUE, "model: %s: the folder is too long", name);
            break;
        }
        memcpy(c->more_models[c->n_more_models].name, name, strlen(name) + 1);
        memcpy(c->more_models[c->n_more_models].dir, dir, strlen(dir) + 1);
        c->n_more_models++;
    }
    free(rest);
    return st;
}

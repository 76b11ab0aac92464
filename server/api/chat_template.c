/*
 * server/api/chat_template.c: the chat template (oai.h): the built-in transcript
 * and the template file an operator writes for a fine-tuned checkpoint.
 *
 * The file format is deliberately not a template language: one `key =
 * "string"` per line, `#` comments, C-style escapes (\n \t \r \\ \") in the
 * strings. Keys: begin, system, user, assistant (each with `{content}`
 * exactly once), generation, stop (repeatable, up to four), trim_reply
 * (true/false, unquoted); and how tools are written (docs/api.md, "Tool
 * calls"): tools ({tools} once: the system message that lists them),
 * tool_call ({call} once: a call as the model writes it; the text before
 * {call} is the marker a reply begins a call with), tool_call_lead (white
 * space a reply writes before the marker) and tool_result ({content} once:
 * a tool's result, inside a user message). Each tool key is optional: the
 * built-in format is the default. docs/api.md shows an example.
 */
#include "errbuf.h"
#include "oai.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEMPLATE_MAX_STRING 4096
#define TEMPLATE_MAX_STOP_BYTES 256
#define CONTENT "{content}"
#define TOOLS "{tools}"
#define CALL "{call}"

/* The built-in tool format (docs/api.md, "Tool calls"). */
#define DEFAULT_TOOLS                                                                              \
    "You can call these tools. To call one, answer with <tool_call>{\"name\": ..., "               \
    "\"arguments\": {...}}</tool_call>.\n" TOOLS
#define DEFAULT_TOOL_CALL "<tool_call>" CALL "</tool_call>"
#define DEFAULT_TOOL_CALL_LEAD " "
#define DEFAULT_TOOL_RESULT "Tool result: " CONTENT

void oai_template_free(oai_template *t)
{
    if (t == NULL) return;
    free(t->begin);
    free(t->generation);
    for (size_t i = 0; i < OAI_NROLES; i++) {
        free(t->prefix[i]);
        free(t->suffix[i]);
    }
    for (size_t i = 0; i < t->nstop; i++) free(t->stop[i]);
    free(t->tools_prefix);
    free(t->tools_suffix);
    free(t->call_prefix);
    free(t->call_suffix);
    free(t->call_lead);
    free(t->result_prefix);
    free(t->result_suffix);
    memset(t, 0, sizeof *t);
}

/* Splits text at its one place (a placeholder, "{content}" ...) into
 * *prefix and *suffix (replaced). 0; 1 when place is not there exactly
 * once; -1 when out of memory. */
static int set_split(char **prefix, char **suffix, const char *text, const char *place)
{
    const char *at = strstr(text, place);
    if (at == NULL || strstr(at + 1, place) != NULL) return 1;
    size_t n = (size_t)(at - text);
    char *pre = strndup(text, n), *suf = strdup(at + strlen(place));
    if (pre == NULL || suf == NULL) {
        free(pre);
        free(suf);
        return -1;
    }
    free(*prefix);
    free(*suffix);
    *prefix = pre;
    *suffix = suf;
    return 0;
}

/* Splits a role's text at its one {content} into prefix and suffix. */
static int set_role(oai_template *t, oai_role role, const char *text)
{
    return set_split(&t->prefix[role], &t->suffix[role], text, CONTENT);
}

static int set_string(char **slot, const char *text)
{
    char *s = strdup(text);
    if (s == NULL) return -1;
    free(*slot);
    *slot = s;
    return 0;
}

/* The built-in tool format into t (a loaded file's keys replace it). 0, or
 * -1 when out of memory. */
static int set_tools_default(oai_template *t)
{
    return set_split(&t->tools_prefix, &t->tools_suffix, DEFAULT_TOOLS, TOOLS) != 0
                   || set_split(&t->call_prefix, &t->call_suffix, DEFAULT_TOOL_CALL, CALL) != 0
                   || set_string(&t->call_lead, DEFAULT_TOOL_CALL_LEAD) != 0
                   || set_split(&t->result_prefix, &t->result_suffix, DEFAULT_TOOL_RESULT, CONTENT)
                          != 0
               ? -1
               : 0;
}

/*
 * The default: a plain transcript that a base model continues sensibly.
 * Turns are separated by a blank line. The reply ends where the model
 * begins the next turn, the user's or another of its own ("\n\nUser:",
 * "\n\nAssistant:", or either after a single newline), not at a blank
 * line: a model that answers "Assistant:" with an empty line first would
 * otherwise end every reply before its first word. trim_reply drops the
 * white space before the first word and a white-space tail the stop
 * matcher still holds when the model ends with <|endoftext|>.
 */
int oai_template_default(oai_template *t)
{
    memset(t, 0, sizeof *t);
    t->trim_reply = 1;
    if (set_string(&t->begin, "") != 0 || set_role(t, OAI_ROLE_SYSTEM, "{content}\n\n") != 0
        || set_role(t, OAI_ROLE_USER, "User: {content}\n\n") != 0
        || set_role(t, OAI_ROLE_ASSISTANT, "Assistant: {content}\n\n") != 0
        || set_string(&t->generation, "Assistant:") != 0 || set_tools_default(t) != 0)
        goto oom;
    static const char *const stops[] = {"\n\nUser:", "\nUser:", "\n\nAssistant:", "\nAssistant:"};
    for (size_t i = 0; i < sizeof stops / sizeof stops[0]; i++) {
        t->stop[i] = strdup(stops[i]);
        if (t->stop[i] == NULL) goto oom;
        t->nstop = i + 1;
    }
    return 0;
oom:
    oai_template_free(t);
    return -1;
}

/* A quoted string with escapes into out (NUL-terminated); returns its
 * length, or -1 with what is wrong in *why. */
static long unquote(const char *s, char *out, size_t cap, const char **why)
{
    size_t n = strlen(s), o = 0;
    if (n < 2 || s[0] != '"' || s[n - 1] != '"') {
        *why = "the value must be a double-quoted string";
        return -1;
    }
    for (size_t i = 1; i + 1 < n; i++) {
        char c = s[i];
        if (c == '"') {
            *why = "a '\"' inside the string must be written \\\"";
            return -1;
        }
        if (c == '\\') {
            if (i + 2 >= n) {
                *why = "the string ends in a lone backslash";
                return -1;
            }
            switch (s[++i]) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case '\\': c = '\\'; break;
            case '"': c = '"'; break;
            default: *why = "unknown escape (\\n \\t \\r \\\\ \\\" are known)"; return -1;
            }
        }
        if (o + 1 >= cap) {
            *why = "the string is too long";
            return -1;
        }
        out[o++] = c;
    }
    out[o] = '\0';
    return (long)o;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n')) e--;
    *e = '\0';
    return s;
}

/* One `key = value` line into t; -1 with the message in err. */
static int load_line(oai_template *t, char *s, const char *where, unsigned *seen, char *err,
                     size_t errlen)
{
    static const char *const roles[OAI_NROLES] = {"system", "user", "assistant"};
    char *eq = strchr(s, '=');
    if (eq == NULL) return ERRBUF_FAIL(err, errlen, -1, "%s: expected key = \"value\"", where);
    *eq = '\0';
    char *key = trim(s), *value = trim(eq + 1);
    if (strcmp(key, "trim_reply") == 0) {
        if (strcmp(value, "true") != 0 && strcmp(value, "false") != 0)
            return ERRBUF_FAIL(err, errlen, -1, "%s: trim_reply must be true or false", where);
        t->trim_reply = strcmp(value, "true") == 0;
        return 0;
    }
    char text[TEMPLATE_MAX_STRING];
    const char *why = NULL;
    long n = unquote(value, text, sizeof text, &why);
    if (n < 0) return ERRBUF_FAIL(err, errlen, -1, "%s: %s: %s", where, key, why);
    if (memchr(text, '\0', (size_t)n) != NULL)
        return ERRBUF_FAIL(err, errlen, -1, "%s: %s: the string holds a NUL", where, key);
    for (unsigned r = 0; r < OAI_NROLES; r++) {
        if (strcmp(key, roles[r]) != 0) continue;
        int rc = set_role(t, (oai_role)r, text);
        if (rc > 0)
            return ERRBUF_FAIL(err, errlen, -1, "%s: %s must hold %s exactly once", where, key,
                               CONTENT);
        if (rc < 0) return ERRBUF_FAIL(err, errlen, -1, "%s: out of memory", where);
        *seen |= 1u << r;
        return 0;
    }
    if (strcmp(key, "begin") == 0 || strcmp(key, "generation") == 0) {
        if (set_string(key[0] == 'b' ? &t->begin : &t->generation, text) != 0)
            return ERRBUF_FAIL(err, errlen, -1, "%s: out of memory", where);
        if (key[0] == 'g') *seen |= 1u << OAI_NROLES;
        return 0;
    }
    if (strcmp(key, "tools") == 0 || strcmp(key, "tool_call") == 0
        || strcmp(key, "tool_result") == 0) { /* key[5]: '\0', 'c' or 'r' */
        const char *place = key[5] == 'c' ? CALL : key[5] == 'r' ? CONTENT : TOOLS;
        char **pre = key[5] == 'c'   ? &t->call_prefix
                     : key[5] == 'r' ? &t->result_prefix
                                     : &t->tools_prefix;
        char **suf = key[5] == 'c'   ? &t->call_suffix
                     : key[5] == 'r' ? &t->result_suffix
                                     : &t->tools_suffix;
        int rc = set_split(pre, suf, text, place);
        if (rc > 0)
            return ERRBUF_FAIL(err, errlen, -1, "%s: %s must hold %s exactly once", where, key,
                               place);
        if (rc < 0) return ERRBUF_FAIL(err, errlen, -1, "%s: out of memory", where);
        /* The marker: a reply that begins with it is a call. */
        if (key[5] == 'c' && (t->call_prefix[0] == '\0' || strspn(t->call_prefix, " \t\r\n") > 0))
            return ERRBUF_FAIL(err, errlen, -1,
                               "%s: tool_call must begin with its marker (text before %s, not "
                               "starting with white space)",
                               where, CALL);
        return 0;
    }
    if (strcmp(key, "tool_call_lead") == 0) {
        if (strspn(text, " \t\r\n") != (size_t)n)
            return ERRBUF_FAIL(err, errlen, -1,
                               "%s: tool_call_lead must be white space (spaces, tabs, newlines) "
                               "or empty",
                               where);
        if (set_string(&t->call_lead, text) != 0)
            return ERRBUF_FAIL(err, errlen, -1, "%s: out of memory", where);
        return 0;
    }
    if (strcmp(key, "stop") == 0) {
        if (n == 0 || n > TEMPLATE_MAX_STOP_BYTES)
            return ERRBUF_FAIL(err, errlen, -1, "%s: a stop string must be 1 to %d bytes", where,
                               TEMPLATE_MAX_STOP_BYTES);
        if (t->nstop == OAI_TEMPLATE_MAX_STOP)
            return ERRBUF_FAIL(err, errlen, -1, "%s: more than %d stop strings", where,
                               OAI_TEMPLATE_MAX_STOP);
        if ((t->stop[t->nstop] = strdup(text)) == NULL)
            return ERRBUF_FAIL(err, errlen, -1, "%s: out of memory", where);
        t->nstop++;
        return 0;
    }
    return ERRBUF_FAIL(err, errlen, -1,
                       "%s: unknown key '%.40s' (begin, system, user, assistant, generation, stop, "
                       "trim_reply, tools, tool_call, tool_call_lead, tool_result)",
                       where, key);
}

int oai_template_load(const char *path, oai_template *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    FILE *fp = fopen(path, "r");
    if (fp == NULL)
        return ERRBUF_FAIL(err, errlen, -1, "%s: cannot open: %s", path, strerror(errno));
    int rc = -1;
    unsigned seen = 0;
    char *line = NULL, where[512];
    size_t cap = 0, lineno = 0;
    ssize_t got;
    if (set_string(&t->begin, "") != 0 || set_tools_default(t) != 0) {
        errbuf_set(err, errlen, "%s: out of memory", path);
        goto done;
    }
    while ((got = getline(&line, &cap, fp)) >= 0) {
        lineno++;
        snprintf(where, sizeof where, "%s:%zu", path, lineno);
        if ((size_t)got > TEMPLATE_MAX_STRING + 64) {
            errbuf_set(err, errlen, "%s: line longer than %d bytes", where,
                       TEMPLATE_MAX_STRING + 64);
            goto done;
        }
        if (memchr(line, '\0', (size_t)got) != NULL) {
            errbuf_set(err, errlen, "%s: the line holds a NUL byte", where);
            goto done;
        }
        char *s = trim(line);
        if (*s == '\0' || *s == '#') continue;
        if (load_line(t, s, where, &seen, err, errlen) != 0) goto done;
    }
    if (ferror(fp)) {
        errbuf_set(err, errlen, "%s: read error", path);
        goto done;
    }
    if (seen != (1u << (OAI_NROLES + 1)) - 1) {
        errbuf_set(err, errlen, "%s: a template needs system, user, assistant and generation",
                   path);
        goto done;
    }
    rc = 0;
done:
    free(line);
    fclose(fp);
    if (rc != 0) oai_template_free(t);
    return rc;
}

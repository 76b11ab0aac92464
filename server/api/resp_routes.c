/*
 * server/api/resp_routes.c: GET and DELETE /v1/responses/{id} and GET
 * .../input_items: the stored responses (resp_store.c) as OpenAI's
 * Responses API shows them, to their API key only.
 */
#include "api/api.h"

#include <stdlib.h>
#include <string.h>

/* A developer message is kept as the system role it renders as. */
static const char *role_name(oai_role role)
{
    return role == OAI_ROLE_ASSISTANT ? "assistant" : role == OAI_ROLE_USER ? "user" : "system";
}

/* One input item as OpenAI lists it: a message {id, type, role, status,
 * content: [{type: input_text (an assistant's: output_text), text}]}, a
 * function_call {id, type, status, call_id, name, arguments} or a
 * function_call_output {id, type, status, call_id, output}. */
static json_t *item_json(const rs_msg *m, const char *id)
{
    if (m->kind == OAI_MSG_CALL)
        return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s%}", "id", id, "type", "function_call",
                         "status", "completed", "call_id", m->call_id ? m->call_id : "", "name",
                         m->name ? m->name : "", "arguments", m->text, m->len);
    if (m->kind == OAI_MSG_CALL_OUTPUT)
        return json_pack("{s:s, s:s, s:s, s:s, s:s%}", "id", id, "type", "function_call_output",
                         "status", "completed", "call_id", m->call_id ? m->call_id : "", "output",
                         m->text, m->len);
    return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s%}]}", "id", id, "type", "message", "role",
                     role_name(m->role), "status", "completed", "content", "type",
                     m->role == OAI_ROLE_ASSISTANT ? "output_text" : "input_text", "text", m->text,
                     m->len);
}

/* The input items of a stored response (GET .../input_items): its input's
 * items, "msg_X_inK" for response resp_X's input K ("fc_X_inK" for a
 * function call, "fco_X_inK" for a call's output). */
static json_t *input_items(const rs_entry *e)
{
    json_t *items = json_array();
    const rs_turns *t = e->turns;
    for (size_t k = 0; items != NULL && k < e->nin; k++) {
        char id[80];
        const rs_msg *m = &t->msg[t->n - 1 - e->nin + k];
        snprintf(id, sizeof id, "%s_%s_in%zu",
                 m->kind == OAI_MSG_CALL          ? "fc"
                 : m->kind == OAI_MSG_CALL_OUTPUT ? "fco"
                                                  : "msg",
                 e->id + strlen("resp_"), k);
        if (json_array_append_new(items, item_json(m, id)) != 0) {
            json_decref(items);
            items = NULL;
        }
    }
    return items;
}

/* ---- GET and DELETE /v1/responses/{id} ------------------------------------- */

/* The id in r's path ("/v1/responses/ID" or ".../ID/input_items") into id;
 * *items says which. 0, or -1 when the path is neither. */
static int path_id(const srv_req *r, char *id, size_t idlen, int *items)
{
    static const char base[] = "/v1/responses/", tail[] = "/input_items";
    const char *p = r->url + sizeof base - 1;
    size_t n = strlen(p);
    if (strlen(r->url) + 1 >= sizeof r->url) return -1; /* cut: no id is that long */
    *items = n > sizeof tail - 1 && strcmp(p + n - (sizeof tail - 1), tail) == 0;
    if (*items) n -= sizeof tail - 1;
    if (n == 0 || n >= idlen || memchr(p, '/', n) != NULL) return -1;
    memcpy(id, p, n);
    id[n] = '\0';
    return 0;
}

static enum MHD_Result not_found(srv_req *r, const char *id)
{
    return http_send_error(r, 404, "invalid_request_error", "response_not_found", NULL, NULL,
                           "No response with id '%.64s' (never made, made with another key, "
                           "deleted, or no longer kept: stored responses live in memory, "
                           "bounded, until a restart)",
                           id);
}

/* GET .../input_items: {object: list, data, first_id, last_id, has_more},
 * newest first unless order=asc; limit 1-100 (20), after an item id. */
static enum MHD_Result send_items(srv_req *r, const rs_entry *e)
{
    const char *order = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "order");
    const char *limit_s = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "limit");
    const char *after = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "after");
    if (order != NULL && strcmp(order, "asc") != 0 && strcmp(order, "desc") != 0)
        return http_send_error(r, 400, "invalid_request_error", NULL, "order", NULL,
                               "'order' must be asc or desc");
    long limit = 20;
    if (limit_s != NULL) {
        char *end;
        limit = strtol(limit_s, &end, 10);
        if (*limit_s == '\0' || *end != '\0' || limit < 1 || limit > 100)
            return http_send_error(r, 400, "invalid_request_error", NULL, "limit", NULL,
                                   "'limit' must be an integer from 1 to 100");
    }
    int asc = order != NULL && strcmp(order, "asc") == 0;
    json_t *items = input_items(e);
    if (items == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    size_t n = json_array_size(items), start = 0;
    if (after != NULL) {
        start = n;
        for (size_t k = 0; k < n; k++) {
            const json_t *it = json_array_get(items, asc ? k : n - 1 - k);
            if (strcmp(json_string_value(json_object_get(it, "id")), after) == 0) start = k + 1;
        }
    }
    json_t *data = json_array();
    for (size_t k = start; k < n && json_array_size(data) < (size_t)limit; k++)
        json_array_append(data, json_array_get(items, asc ? k : n - 1 - k));
    json_decref(items);
    size_t got = json_array_size(data);
    json_t *first = got ? json_object_get(json_array_get(data, 0), "id") : NULL;
    json_t *last = got ? json_object_get(json_array_get(data, got - 1), "id") : NULL;
    return http_send_obj(r, json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data", data,
                                      "first_id", first, "last_id", last, "has_more",
                                      start + got < n));
}

enum MHD_Result resp_route_get(srv_req *r)
{
    char id[48];
    int items;
    if (path_id(r, id, sizeof id, &items) != 0)
        return http_send_error(r, 404, "invalid_request_error", NULL, NULL, NULL,
                               "Unknown route %s %s", r->method, r->url);
    const rs_entry *e = rs_get(r->s->api->resp_store, id, r->key_id);
    if (e == NULL) return not_found(r, id);
    if (items) return send_items(r, e);
    json_t *o = json_loads(e->response, 0, NULL);
    if (o == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    return http_send_obj(r, o);
}

enum MHD_Result resp_route_delete(srv_req *r)
{
    char id[48];
    int items;
    if (path_id(r, id, sizeof id, &items) != 0 || items)
        return http_send_error(r, 404, "invalid_request_error", NULL, NULL, NULL,
                               "Unknown route %s %s", r->method, r->url);
    if (rs_delete(r->s->api->resp_store, id, r->key_id) != 0) return not_found(r, id);
    return http_send_obj(
        r, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response.deleted", "deleted", 1));
}

/*
 * server/daemon/ui.c: GET / (and the playground's other files): the page from
 * server/ui/, served from the binary with nothing loaded from elsewhere
 * (its Content-Security-Policy forbids it). `ui = false` leaves the route
 * out of the table (daemon.c).
 */
#include "daemon/daemon.h"
#include "daemon/ui.h"

#include <string.h>

enum MHD_Result ui_page(srv_req *r)
{
    const srv_ui_asset *a = srv_ui_assets;
    while (a->path != NULL && strcmp(a->path, r->url) != 0) a++;
    if (a->path == NULL)
        return http_send_error(r, 404, "invalid_request_error", NULL, NULL, NULL,
                               "Unknown route %s %s", r->method, r->url);
    http_req_set_state(r, HTTP_REQ_FINISHED);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(a->len, (void *)a->bytes, MHD_RESPMEM_PERSISTENT);
    if (resp == NULL) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", a->type);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Content-Security-Policy", a->csp);
    http_resp_headers(r, resp, 200); /* X-Request-Id, as every response */
    enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}
